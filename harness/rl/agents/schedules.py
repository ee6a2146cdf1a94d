"""Settings held in variables, so that a resume can change them without a retrace."""

from __future__ import annotations

from typing import List, Tuple

import tensorflow as tf


class LinearSchedule(tf.Module):
  """A setting held in variables: linear decay from `start` to `end` over env steps.

  Used for the collect epsilon (the collect policy calls it inside its traced
  graph) and the learning rate (the compiled train step calls it). Assigning new
  values (a resume with new bindings) takes effect without a retrace; a Python
  float would be frozen into the graph. The decay runs over env steps, read from
  `env_steps` (the run's env-step counter variable); `decay_steps` 0 means a
  constant `end`.
  """

  def __init__(self, env_steps: tf.Variable, end: float, start: float,
               decay_steps: int, name: str):
    super().__init__(name=name)
    self.env_steps = env_steps
    self.start = tf.Variable(start, dtype=tf.float32, name='start')
    self.end = tf.Variable(end, dtype=tf.float32, name='end')
    self.decay_steps = tf.Variable(decay_steps, dtype=tf.int64, name='decay_steps')

  def assign(self, end: float, start: float, decay_steps: int) -> None:
    self.start.assign(start)
    self.end.assign(end)
    self.decay_steps.assign(decay_steps)

  def values(self) -> Tuple[float, float, int]:
    """(end, start, decay_steps) as Python numbers."""
    return (float(self.end.numpy()), float(self.start.numpy()),
            int(self.decay_steps.numpy()))

  def __call__(self) -> tf.Tensor:
    steps = tf.cast(tf.maximum(self.decay_steps, 1), tf.float32)
    progress = tf.minimum(tf.cast(self.env_steps, tf.float32) / steps, 1.0)
    decayed = self.start + (self.end - self.start) * progress
    return tf.where(self.decay_steps > 0, decayed, self.end)



# The make_agent bindings behind each schedule's (end, start, decay_steps).
SCHEDULE_BINDINGS = {
    'epsilon': ('epsilon_greedy', 'epsilon_start', 'epsilon_decay_steps'),
    'learning_rate': ('learning_rate_final', 'learning_rate', 'learning_rate_decay_steps'),
}


def schedule_changes(name: str, before: Tuple[float, float, int],
                     after: Tuple[float, float, int]) -> List[Tuple[str, object, object]]:
  """(binding, before, after) for each value of schedule `name` that differs.

  A constant learning rate is held as end == start; its `learning_rate_final`
  (unset) is not reported as a change of its own.
  """
  changes = []
  for binding, old, new in zip(SCHEDULE_BINDINGS[name], before, after):
    unset_final = (binding == 'learning_rate_final' and before[0] == before[1]
                   and after[0] == after[1])
    if old != new and not unset_final:
      changes.append((f'make_agent.{binding}', old, new))
  return changes


