"""Temporally-extended epsilon-greedy exploration (ez-greedy, Dabney et al., 2021).

Epsilon-greedy flips a coin at every step, so its random actions cancel out
within a few steps. ez-greedy flips the same coin only while it is not
exploring; on heads it picks one random action and holds it for a duration
drawn from a zeta (power-law) distribution: mostly short runs, sometimes long
ones. Each env of a batch holds its own action for its own duration.

Why the harness has it: with batched envs on MountainCar the greedy policy
plays every env's episode at once, so N envs make N near-identical tries where
one env makes N successive ones, and plain epsilon-greedy found the goal on 2 of
5 seeds by 60,000 env steps with 4 envs (docs/benchmarks.md). With ez-greedy
each env explores on its own, coherently, and 5 of 5 found it by 20,000.
tf-agents has no such policy; this one wraps any greedy py policy (the numpy
one or a compiled TF one), so it works for every network.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import gin
import numpy as np
import tensorflow as tf
from tf_agents.environments import py_environment
from tf_agents.policies import py_policy
from tf_agents.trajectories import policy_step
from tf_agents.trajectories import time_step as ts

from harness.base.errors import UsageError

_FIRST = int(ts.StepType.FIRST)
# A stream of its own, apart from the envs' (gymnasium seeds them with default_rng(seed)).
_STREAM = 0xE2


@gin.configurable
@dataclasses.dataclass
class Exploration:
  """How the collect policy explores (the probability is the epsilon schedule).

  Attributes:
    temporally_extended: ez-greedy instead of epsilon-greedy: while an env
      holds no random action, with probability epsilon it starts one, held
      for a duration drawn from zeta(duration_exponent); else greedy.
    duration_exponent: the zeta distribution's exponent (> 1): 2 gives runs
      of 1 step 61 % of the time, of 10 or more 6 % (Dabney et al.'s value).
    max_duration: longest hold, in env steps. A new episode ends a hold.
  """
  temporally_extended: bool = False
  duration_exponent: float = 2.0
  max_duration: int = 10_000

  def __post_init__(self):
    exponent = self.duration_exponent
    if not isinstance(exponent, (int, float)) or isinstance(exponent, bool) or exponent <= 1:
      raise UsageError(f'Exploration.duration_exponent={exponent!r} must be a number above 1 '
                       '(the zeta distribution has no mean at or below 1), e.g. 2.0')
    if (not isinstance(self.max_duration, int) or isinstance(self.max_duration, bool)
        or self.max_duration < 1):
      raise UsageError(f'Exploration.max_duration={self.max_duration!r} must be an integer of '
                       'at least 1 (env steps)')


class TemporallyExtendedPolicy(py_policy.PyPolicy):
  """ez-greedy around a greedy py policy, for one env or a batch.

  `refresh()` (the collector calls it before each run of steps) refreshes the
  greedy policy's weights and reads the epsilon, in one compiled call.
  """

  def __init__(self, greedy: py_policy.PyPolicy, epsilon: Callable[[], tf.Tensor],
               env: py_environment.PyEnvironment, settings: Exploration, seed: int):
    super().__init__(greedy.time_step_spec, greedy.action_spec)
    self._greedy = greedy
    self._read_epsilon = tf.function(lambda: tf.cast(epsilon(), tf.float32),
                                     autograph=False).get_concrete_function()
    self._settings = settings
    self._batched = env.batched
    width = env.batch_size if env.batched else 1
    spec = env.action_spec()
    self._low, self._high = int(spec.minimum), int(spec.maximum)
    self._dtype = spec.dtype
    self._rng = np.random.default_rng([seed, _STREAM])
    self._held = np.zeros(width, np.int64)   # the random action each env holds
    self._left = np.zeros(width, np.int64)   # steps it still holds it for
    self.epsilon = 0.0
    self.refresh()

  def refresh(self) -> None:
    refresh: Optional[Callable[[], None]] = getattr(self._greedy, 'refresh', None)
    if refresh:
      refresh()
    self.epsilon = float(self._read_epsilon())

  def holding(self) -> np.ndarray:
    """Which envs act on a held random action at their next step."""
    return self._left > 0

  def _action(self, time_step, policy_state, seed=None):
    del seed  # the generator is seeded once, at construction
    greedy = np.atleast_1d(self._greedy.action(time_step).action)
    self._left[np.atleast_1d(time_step.step_type) == _FIRST] = 0  # a new episode: no hold
    start = ~self.holding() & (self._rng.random(len(greedy)) < self.epsilon)
    if start.any():
      count = int(start.sum())
      self._held[start] = self._rng.integers(self._low, self._high + 1, size=count)
      self._left[start] = np.minimum(self._rng.zipf(self._settings.duration_exponent, count),
                                     self._settings.max_duration)
    holding = self.holding()
    action = np.where(holding, self._held, greedy).astype(self._dtype)
    self._left[holding] -= 1
    return policy_step.PolicyStep(action if self._batched else action[0], policy_state, ())

  def trace_count(self) -> int:
    return self._greedy.trace_count()
