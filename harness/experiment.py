"""`train_eval`: the run's settings (one gin name, `train_eval.*`, for every job) and dispatch.

`train_eval` holds every run setting with its default, builds the `RunConfig`
and hands it to the job that `--job` names: the single-process job, or one job
of a distributed run. `settings_from_gin` gives the same `RunConfig` without
running anything, so `harness-train` can check the bound values first.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Optional

import gin

from harness import distributed
from harness import parts
from harness import run_lock
from harness.errors import UsageError
from harness.settings import RunConfig
from harness.single_process import run_single_process

# The jobs that write the run's checkpoints and logs, and so hold ROOT/.lock.
WRITER_JOBS = ('all', 'learn')


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
               track: bool = False) -> None:
  """Trains and evaluates a DdqnAgent until `num_env_steps`.

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
      and `eval` are the jobs of a distributed run (see distributed.py).
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
    track: also stream the run to Weights & Biases (`harness-train --track`;
      files under ROOT/wandb/); not a gin setting.
  """
  cfg = RunConfig(
      root_dir=root_dir, num_env_steps=num_env_steps, replay_capacity=replay_capacity,
      batch_size=batch_size, initial_collect_steps=initial_collect_steps, num_envs=num_envs,
      collect_steps_per_iteration=collect_steps_per_iteration,
      train_steps_per_iteration=train_steps_per_iteration, eval_interval=eval_interval,
      eval_episodes=eval_episodes, eval_epsilon=eval_epsilon,
      final_eval_episodes=final_eval_episodes, checkpoint_interval=checkpoint_interval,
      log_interval=log_interval, seed=seed, prioritized_replay=prioritized_replay, job=job,
      replay_address=replay_address, collector_id=collector_id,
      shutdown_grace_seconds=shutdown_grace_seconds, video_interval=video_interval,
      video_format=video_format, track=track).validate()
  parts.seed_everything(seed)
  if job == 'all' and replay_address:
    raise UsageError('--job=all runs its own replay server: drop --replay_address, or run '
                     'the replay, collect and learn jobs separately')
  # One writer per run directory: the jobs that train hold ROOT/.lock.
  with (run_lock.hold(root_dir, job) if job in WRITER_JOBS else contextlib.nullcontext()):
    if job == 'all':
      run_single_process(cfg)
    else:
      distributed.run_job(cfg)


def settings_from_gin(**launch) -> RunConfig:
  """The `RunConfig` that `train_eval` would run with: gin's bindings over the
  defaults, plus `launch` (root_dir, job, replay_address, collector_id)."""
  values = {name: p.default for name, p in inspect.signature(train_eval).parameters.items()
            if p.default is not p.empty}
  values.update(gin.get_bindings(train_eval))
  values.update(launch)
  return RunConfig(**values)
