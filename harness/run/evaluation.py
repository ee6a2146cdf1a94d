"""Evaluation episodes played side by side: one episode per env of a batch.

A run evaluates its greedy policy every `eval_interval` env steps and twice
more at the end (results.json). Played one after the other on one env, every
step costs a policy call: on CartPole (500-step episodes) the evaluations took
44 % of a 50,000-step run's wall time. Here `episodes` envs step as one batch,
so one policy call serves them all (the run: 259 s -> 170 s).

Each env plays exactly one episode per round and its first episode only
counts. tf-agents' PyDriver with `max_episodes` on a batched env would count
the first episodes to *finish*, across envs, and so favour short episodes:
the reason this loop is ours.
"""

from __future__ import annotations

import dataclasses
from typing import List

import numpy as np
from tf_agents.environments import py_environment
from tf_agents.trajectories import time_step as ts

from harness.rl import envs

# Envs stepped side by side; more episodes play in rounds. Bounds the memory of
# many Atari emulators (each env is built once and reused by every evaluation).
MAX_PARALLEL_EPISODES = 10


@dataclasses.dataclass
class EvalResult:
  """Returns and lengths (env steps) of the episodes of one evaluation."""
  returns: List[float]
  lengths: List[int]

  @property
  def episodes(self) -> int:
    return len(self.returns)


def make_eval_env(episodes: int, seed: int) -> py_environment.PyEnvironment:
  """A batch of `make_env()` envs (seeds seed, seed+1, ...) wide enough for
  `episodes` episodes, at most `MAX_PARALLEL_EPISODES`."""
  return envs.make_batched_env(max(1, min(episodes, MAX_PARALLEL_EPISODES)), seed,
                               stagger_first_episodes=False)  # whole episodes


class Evaluation:
  """Plays `episodes` episodes of `policy` on the batched `env`.

  `policy` is a py policy for the batch (one call: a batch of observations in,
  a batch of actions out). With `epsilon` > 0 each env's action is replaced by
  a uniformly random one with that probability, drawn from a generator seeded
  with `seed`, so two evaluations with the same seed and env seeds see the
  same starts and the same random actions.
  """

  def __init__(self, env: py_environment.PyEnvironment, policy, episodes: int,
               epsilon: float = 0.0, seed: int = 0):
    if not env.batched:
      raise ValueError('Evaluation needs a batched env (make_eval_env)')
    self.env = env
    self.policy = policy
    self.episodes = episodes
    self._epsilon = epsilon
    self._rng = np.random.default_rng(seed)

  def run(self) -> EvalResult:
    returns: List[float] = []
    lengths: List[int] = []
    refresh = getattr(self.policy, 'refresh', None)  # a loaded SavedModel has none
    if refresh:
      refresh()  # the weights trained since the last evaluation
    while len(returns) < self.episodes:
      round_returns, round_lengths = self._play_round()
      wanted = self.episodes - len(returns)
      returns.extend(round_returns[:wanted])
      lengths.extend(round_lengths[:wanted])
    return EvalResult(returns, lengths)

  def close(self) -> None:
    self.env.close()

  def _play_round(self):
    """Resets every env and steps the batch until each has ended one episode."""
    width = self.env.batch_size
    spec = self.env.action_spec()
    total = np.zeros(width, np.float64)
    length = np.zeros(width, np.int64)
    ended = np.zeros(width, bool)
    time_step = self.env.reset()
    while not ended.all():
      action = np.asarray(self.policy.action(time_step).action)
      if self._epsilon > 0:
        explore = self._rng.random(width) < self._epsilon
        random = self._rng.integers(spec.minimum, spec.maximum + 1, size=width)
        action = np.where(explore, random, action).astype(spec.dtype)
      time_step = self.env.step(action)
      # An env that has ended keeps stepping (auto-reset) until the round is
      # over; what it does then is not counted.
      running = ~ended
      total += np.where(running, time_step.reward, 0.0)
      length += running
      ended |= np.asarray(time_step.step_type) == ts.StepType.LAST  # not is_last(): tf.is_tensor is slow
    return total.tolist(), length.tolist()

