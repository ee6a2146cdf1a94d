"""Interval triggers and the bare iterate-until-target loop (no TensorFlow).

The model is TF-Agents' triggers: an action fires when the run's env-step count
crosses a multiple of its interval, and once more when the run reaches its
target, so the last metrics row, evaluation and checkpoint describe the end.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence


def crossed(before: int, after: int, interval: int) -> bool:
  """True when an interval boundary lies in (before, after]."""
  return after // interval > before // interval


@dataclasses.dataclass
class IntervalTrigger:
  """Calls `action(env_steps)` each time env steps cross a multiple of `interval`
  (and at the end of the run when `at_end`)."""
  interval: int
  action: Callable[[int], None]
  at_end: bool = True

  def __call__(self, before: int, after: int, done: bool) -> None:
    if crossed(before, after, self.interval) or (done and self.at_end):
      self.action(after)


def iterate(iteration: Callable[[], int], env_steps: int, target: int,
            triggers: Sequence[IntervalTrigger],
            should_stop: Callable[[], bool] = lambda: False) -> int:
  """Runs `iteration` (which returns the new env-step count) until `target`.

  Triggers fire after each iteration, in order. `should_stop` is asked after
  the triggers, so a stop request (a signal) ends the loop between iterations.
  Returns the env-step count reached.
  """
  while env_steps < target and not should_stop():
    before = env_steps
    env_steps = iteration()
    done = env_steps >= target
    for trigger in triggers:
      trigger(before, env_steps, done)
  return env_steps
