"""The one run loop of every training job: triggers, the last checkpoint, the results.

`run_single_process` and the distributed learner differ only in what one
iteration does (collect and train, or train from a remote table) and in how a
metrics row and a checkpoint are made; they hand those in, and this loop does
the rest in the same order for both: log, evaluate, record a video and
checkpoint on their intervals, a complete checkpoint at the end, then the final evaluation into
`results.json`.

A stop request (a signal) ends the loop between iterations: a complete
checkpoint, then `shutdown.Stopped`; a launch that has trained nothing since its
restore stops without writing.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional, Sequence

from absl import logging

from harness.base import shutdown
from harness.run import triggers
from harness.run.reporting import Reporter
from harness.run.settings import RunConfig
from harness.rundir import checkpoints


@dataclasses.dataclass
class JobHooks:
  """What a training job does that the loop cannot know.

  Attributes:
    iteration: one step of work; returns the new env-step count.
    metrics_row: the metrics.csv row at an env-step count.
    save_checkpoint: a complete checkpoint (TF + Reverb pair, policies).
    episodes: training episodes so far (None where the job does not see them).
    train_return_last100: mean return of the last 100 training episodes (None
      where the job does not see them, or before the first).
    extra_triggers: job-specific interval actions (the learner's weight push).
    evaluate: whether this job evaluates (a distributed run may leave it to an eval job).
    settle: waits for work an iteration left in flight (gradient steps overlapped
      with collection); called before every row, evaluation, video, checkpoint
      and the results, so that each sees one consistent point.
  """
  iteration: Callable[[], int]
  metrics_row: Callable[[int], dict]
  save_checkpoint: Callable[[], None]
  episodes: Callable[[], object]
  train_return_last100: Callable[[], Optional[float]] = lambda: None
  extra_triggers: Sequence[triggers.IntervalTrigger] = ()
  evaluate: bool = True
  settle: Callable[[], None] = lambda: None


def train_to_target(cfg: RunConfig, reporter: Reporter, clock: checkpoints.WallClock,
                    hooks: JobHooks, env_steps: int) -> int:
  """Iterates from `env_steps` to `cfg.num_env_steps`; returns the count reached."""

  def settled(action: Callable[[int], object]) -> Callable[[int], object]:
    def run(steps: int):
      hooks.settle()
      return action(steps)
    return run

  save_checkpoint = settled(lambda _: hooks.save_checkpoint())
  interval_triggers = [
      triggers.IntervalTrigger(cfg.log_interval,
                               settled(lambda steps: reporter.log(hooks.metrics_row(steps)))),
      *hooks.extra_triggers,
  ]
  if hooks.evaluate:
    interval_triggers.append(triggers.IntervalTrigger(cfg.eval_interval,
                                                      settled(reporter.evaluate)))
    if cfg.video_interval:
      interval_triggers.append(triggers.IntervalTrigger(cfg.video_interval,
                                                        settled(reporter.record_video)))
  interval_triggers.append(triggers.IntervalTrigger(cfg.checkpoint_interval, save_checkpoint))
  started = env_steps
  stop = shutdown.current()
  reporter.start_clock(env_steps)
  env_steps = triggers.iterate(hooks.iteration, env_steps, cfg.num_env_steps,
                               interval_triggers, should_stop=lambda: stop.requested)
  if stop.requested:
    if env_steps == started:
      shutdown.exit_if_requested(f'at env_steps {env_steps}')  # nothing trained: no write
    if env_steps < cfg.num_env_steps:
      save_checkpoint(env_steps)  # at the target, the end-of-run trigger has written it
    # results.json waits for the next launch: its final evaluation can take minutes.
    message = (f'stopped by {stop.reason} at env_steps {env_steps}: checkpoint written; '
               'run the same command to resume')
    logging.info('%s', message)
    raise shutdown.Stopped(message, stop.exit_code)
  if env_steps == started or not os.path.exists(reporter.exporter.path('greedy_policy')):
    # Nothing new was trained (target already reached): still leave a complete run dir.
    save_checkpoint(env_steps)
  hooks.settle()
  reporter.write_results(env_steps, hooks.episodes(), clock.total(),
                         hooks.train_return_last100())
  logging.info('Done: env_steps %d, train_step %d', env_steps,
               int(reporter.train_step()))
  return env_steps
