"""The settings of a run and their checks: `RunConfig` (`train_eval.*`) and `Distributed`.

This is the one home of the checks on `train_eval.*` values: `harness-train`
runs them on the bound values before anything is built, and every job runs
them again on the `RunConfig` it was given. `Distributed` holds the settings
of a distributed run (the jobs' and `harness-launch`'s). Imports no
TensorFlow, so that `harness-launch` can read them in a light process.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import gin

from harness.base.errors import UsageError

JOBS = ('all', 'replay', 'collect', 'learn', 'eval')

# Settings that must be positive integers.
_POSITIVE = ('num_env_steps', 'replay_capacity', 'batch_size', 'num_envs',
             'collect_steps_per_iteration', 'train_steps_per_iteration', 'eval_interval',
             'eval_episodes', 'checkpoint_interval', 'log_interval', 'final_eval_episodes')


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
  """The settings of a run (`experiment.train_eval` documents them and holds
  their defaults). Built by keyword; `validate()` raises a one-line `UsageError`.
  """
  root_dir: Optional[str]
  num_env_steps: int
  replay_capacity: int
  batch_size: int
  initial_collect_steps: int
  num_envs: int
  collect_steps_per_iteration: int
  train_steps_per_iteration: int
  eval_interval: int
  eval_episodes: int
  eval_epsilon: float
  final_eval_episodes: int
  checkpoint_interval: int
  log_interval: int
  seed: int
  prioritized_replay: bool
  job: str
  replay_address: Optional[str]
  collector_id: int
  shutdown_grace_seconds: float
  video_interval: int = 0
  video_format: str = 'gif'
  track: bool = False
  overlap_training: bool = False

  @property
  def replay_ratio(self) -> float:
    """Gradient steps per env step."""
    return self.train_steps_per_iteration / self.collect_steps_per_iteration

  def validate(self) -> 'RunConfig':
    """Raises `UsageError` for the first bad value; returns self."""
    for name in _POSITIVE:
      value = getattr(self, name)
      if not _is_int(value) or value <= 0:
        raise UsageError(f'train_eval.{name}={value!r} must be a positive integer, e.g. '
                         f'--gin_bindings="train_eval.{name}=1000"')
    if not _is_int(self.initial_collect_steps) or self.initial_collect_steps < 0:
      raise UsageError(f'train_eval.initial_collect_steps={self.initial_collect_steps!r} must '
                       'be an integer >= 0')
    if not _is_int(self.seed):
      raise UsageError(f'train_eval.seed={self.seed!r} must be an integer')
    if self.batch_size % self.num_envs:
      raise UsageError(f'train_eval.batch_size={self.batch_size} must be a multiple of '
                       f'train_eval.num_envs={self.num_envs}: a replay item holds one step of '
                       'each env')
    if self.job not in JOBS:
      raise UsageError(f'--job={self.job} is unknown: use one of {", ".join(JOBS)}')
    if (not isinstance(self.eval_epsilon, (int, float)) or isinstance(self.eval_epsilon, bool)
        or not 0.0 <= self.eval_epsilon <= 1.0):
      raise UsageError(f'train_eval.eval_epsilon={self.eval_epsilon!r} is outside [0, 1], '
                       'e.g. train_eval.eval_epsilon=0.05 (0 = greedy)')
    grace = self.shutdown_grace_seconds
    if not isinstance(grace, (int, float)) or isinstance(grace, bool) or not 0 < grace < 1e9:
      raise UsageError(f'train_eval.shutdown_grace_seconds={grace!r} must be a positive number '
                       'of seconds, e.g. train_eval.shutdown_grace_seconds=60')
    if not _is_int(self.video_interval) or self.video_interval < 0:
      raise UsageError(f'train_eval.video_interval={self.video_interval!r} must be an integer '
                       '>= 0 (env steps between recorded episodes; 0 = no videos), e.g. '
                       'train_eval.video_interval=10000')
    if self.video_interval:
      from harness.run import video  # pylint: disable=g-import-not-at-top
      video.check_format(self.video_format)
    for name in ('prioritized_replay', 'overlap_training'):
      if not isinstance(getattr(self, name), bool):
        raise UsageError(f'train_eval.{name}={getattr(self, name)!r} must be True or False')
    return self


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


@gin.configurable
@dataclasses.dataclass
class Distributed:
  """Settings of a distributed run (`harness-launch`, or `harness-train --job=...`).

  Attributes:
    tolerance_inserts: how many inserts collectors may run ahead of (or behind)
      the learner's samples-per-insert ratio before the rate limiter blocks.
    pull_interval_steps: env steps between a collector's weight pulls.
    push_interval_steps: train steps between the learner's weight pushes.
    max_unreachable_seconds: a job that cannot reach the replay server for this
      long gives up with exit status 2.
    eval_in_learner: the learner evaluates (set False when an eval job runs;
      `harness-launch --eval_job` does).
    eval_job_interval_seconds: how often an eval job evaluates the newest weights.
    replay_cpus, collector_cpus, learner_cpus, eval_cpus, learner_gpus: what
      `harness-launch` asks Ray for per job (`num_cpus`, `num_gpus`; fractions
      are fine). The defaults fit a replay server, a learner, two collectors and
      an eval job on two cores.
    max_restarts: how often Ray restarts each job of `harness-launch` that dies
      (-1: without limit).
    replay_port: the replay server's port under `harness-launch` (0: a free
      one). A restarted server comes back on the same port where it can.
  """
  tolerance_inserts: int = 500
  pull_interval_steps: int = 200
  push_interval_steps: int = 100
  max_unreachable_seconds: float = 60.0
  eval_in_learner: bool = True
  eval_job_interval_seconds: float = 30.0
  replay_cpus: float = 0.25
  collector_cpus: float = 0.5
  learner_cpus: float = 0.5
  eval_cpus: float = 0.25
  learner_gpus: float = 0.0
  max_restarts: int = 3
  replay_port: int = 0

  def validate(self) -> 'Distributed':
    """Raises `UsageError` for the first bad value of the launch settings; returns self."""
    for name in ('replay_cpus', 'collector_cpus', 'learner_cpus', 'eval_cpus', 'learner_gpus'):
      value = getattr(self, name)
      if not _is_number(value) or value < 0:
        raise UsageError(f'Distributed.{name}={value!r} must be a number >= 0 (Ray\'s '
                         f'num_cpus/num_gpus for that job), e.g. Distributed.{name}=0.5')
    if not _is_int(self.max_restarts) or self.max_restarts < -1:
      raise UsageError(f'Distributed.max_restarts={self.max_restarts!r} must be an integer '
                       '>= 0, or -1 for restarts without limit')
    if not _is_int(self.replay_port) or not 0 <= self.replay_port <= 65535:
      raise UsageError(f'Distributed.replay_port={self.replay_port!r} must be a port number '
                       '(0 = a free port)')
    return self
