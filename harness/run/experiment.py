"""The run's configuration from gin: `parse_gin`, and `train_eval` (one gin name, `train_eval.*`, for every job).

`train_eval` holds every run setting with its default and returns the checked
`RunConfig`; `harness-train` hands that to the job `--job` names, and each Ray
actor of `harness-launch` builds its own the same way. Calling `train_eval`
(not only reading its bindings) is what puts `train_eval.*` into gin's
operative config. `settings_from_gin` gives the same `RunConfig` unchecked and
without that record, so that `harness-train` can check the bound values first.
"""

from __future__ import annotations

import inspect
import os
import sys
import tokenize
from typing import Optional, Sequence

import gin

from harness.base import errors
from harness.base.errors import UsageError
from harness.run.settings import RunConfig


def parse_gin(gin_files: Sequence[str], gin_bindings: Sequence[str]) -> None:
  """Parses gin files then bindings; errors become one-line `UsageError`s."""
  for path in gin_files:
    if not os.path.isfile(path):
      raise UsageError(f'gin file {path!r} does not exist: check the --gin_file path '
                       '(relative paths start at the current directory)')
    # A gin file may `import my_envs` from its own folder.
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
      sys.path.insert(0, folder)
  try:
    gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings),
                                        finalize_config=True)
  except (ValueError, SyntaxError, ImportError, KeyError, OSError, tokenize.TokenError) as e:
    raise errors.gin_usage_error(e, gin_bindings, gin_files) from e


@gin.configurable(denylist=['track'])
def train_eval(root_dir: str,
               num_env_steps: int = 50_000,
               replay_capacity: int = 100_000,
               batch_size: int = 64,
               initial_collect_steps: int = 1_000,
               num_envs: int = 1,
               collect_steps_per_iteration: int = 1,
               train_steps_per_iteration: int = 1,
               eval_interval: int = 5_000,
               eval_episodes: int = 10,
               eval_epsilon: float = 0.0,
               final_eval_episodes: int = 20,
               checkpoint_interval: int = 10_000,
               log_interval: int = 1_000,
               seed: int = 0,
               prioritized_replay: bool = False,
               job: str = 'all',
               replay_address: Optional[str] = None,
               collector_id: int = 0,
               shutdown_grace_seconds: float = 60.0,
               video_interval: int = 0,
               video_format: str = 'gif',
               overlap_training: bool = False,
               track: bool = False) -> RunConfig:
  """The settings of a run that trains and evaluates an agent until `num_env_steps`.

  Args:
    root_dir: the run directory; an existing run there is resumed.
    num_env_steps: absolute target of env steps for the run.
    replay_capacity: maximum number of transitions in the replay table.
    batch_size: sampled sequences per gradient step.
    initial_collect_steps: env steps of uniformly random actions at the start.
    num_envs: environments stepped as one batch by a collector.
    collect_steps_per_iteration: env steps (over all envs) between training calls.
    train_steps_per_iteration: gradient steps per compiled training call; the
      replay ratio train_steps_per_iteration / collect_steps_per_iteration is
      held over the env steps actually collected.
    eval_interval, eval_episodes: greedy evaluation every that many env steps.
    eval_epsilon: evaluation acts epsilon-greedy with this (Atari: 0.05); 0 = greedy.
    final_eval_episodes: episodes of the final policy (and of best_policy) at the
      target, written to ROOT/results.json.
    checkpoint_interval: env steps between checkpoints (TF, Reverb, policies).
    log_interval: env steps between rows of metrics.csv and progress lines.
    seed: seeds environments, networks and sampling.
    prioritized_replay: prioritized sampling with importance weights (settings
      in `PrioritizedReplay`); otherwise uniform.
    job: `all` runs everything in this process; `replay`, `collect`, `learn`
      and `eval` are the jobs of a distributed run (see jobs.py).
    replay_address: host:port of the Reverb server of a distributed run.
    collector_id: which collector this is (`--job=collect`): its seed and file.
    shutdown_grace_seconds: after SIGTERM or SIGINT a run finishes its iteration,
      writes a checkpoint and exits 143 (130); if that takes longer than this,
      the process ends anyway with the same status (the previous checkpoint
      stays). A second signal ends it at once.
    video_interval: env steps between recorded greedy episodes, written to
      ROOT/videos/<env_steps>.<video_format> (0 = no videos). Frames are the
      env's render (Atari: the native 210x160 screen).
    video_format: 'gif' (Pillow) or 'mp4' (needs pip install -e '.[mp4]').
    overlap_training: the single-process job runs an iteration's gradient steps
      on the trainer's thread while the collector steps the envs for the next
      one (the policy acts with weights one iteration older); metrics rows,
      evaluations, videos and checkpoints wait for the steps in flight, so they
      see train_step at the replay ratio. False: collect, then train.
    track: also stream the run to Weights & Biases (`harness-train --track`;
      files under ROOT/wandb/); not a gin setting.
  """
  return RunConfig(
      root_dir=root_dir, num_env_steps=num_env_steps, replay_capacity=replay_capacity,
      batch_size=batch_size, initial_collect_steps=initial_collect_steps, num_envs=num_envs,
      collect_steps_per_iteration=collect_steps_per_iteration,
      train_steps_per_iteration=train_steps_per_iteration, eval_interval=eval_interval,
      eval_episodes=eval_episodes, eval_epsilon=eval_epsilon,
      final_eval_episodes=final_eval_episodes, checkpoint_interval=checkpoint_interval,
      log_interval=log_interval, seed=seed, prioritized_replay=prioritized_replay, job=job,
      replay_address=replay_address, collector_id=collector_id,
      shutdown_grace_seconds=shutdown_grace_seconds, video_interval=video_interval,
      video_format=video_format, overlap_training=overlap_training, track=track).validate()


def settings_from_gin(**launch) -> RunConfig:
  """The `RunConfig` that `train_eval` would run with: gin's bindings over the
  defaults, plus `launch` (root_dir, job, replay_address, collector_id)."""
  values = {name: p.default for name, p in inspect.signature(train_eval).parameters.items()
            if p.default is not p.empty}
  values.update(gin.get_bindings(train_eval))
  values.update(launch)
  return RunConfig(**values)
