"""Collection with tf-agents' PyDriver: initial random steps, then epsilon-greedy."""

from __future__ import annotations

from typing import Callable, List

import numpy as np
import tensorflow as tf
from tf_agents.drivers import py_driver
from tf_agents.environments import py_environment
from tf_agents.policies import py_tf_eager_policy
from tf_agents.policies import random_py_policy
from tf_agents.policies import tf_policy
from tf_agents.specs import tensor_spec

Observer = Callable[[object], None]


class CompiledPolicy(py_tf_eager_policy.PyTFEagerPolicy):
  """A PyTFEagerPolicy that calls one concrete function for a fixed batch size.

  PyTFEagerPolicy dispatches through `tf.function` on every call, binding and
  matching arguments in Python. Calling the concrete function traced once for
  the env's batch size halves the cost per call (630 vs 1,350 us for a batch of
  8 here) and halves the RSS that TF 2.15 leaks per eager call (1.1 vs 2.3 MiB
  per 10,000 calls), which matters over millions of Atari steps. Actions come
  back as numpy arrays, as BatchedPyEnvironment wants them.
  """

  def __init__(self, policy: tf_policy.TFPolicy, env: py_environment.PyEnvironment):
    super().__init__(policy, use_tf_function=True, batch_time_steps=False)
    self._batched_env = env.batched
    batch_size = env.batch_size if env.batched else 1
    time_step_spec = tensor_spec.add_outer_dim(policy.time_step_spec, batch_size)
    # pylint: disable=protected-access
    self._concrete = self._policy_action_fn.get_concrete_function(time_step_spec, (), None)

  def _action(self, time_step, policy_state, seed=None):
    del policy_state, seed  # DQN policies have no state; sampling is seeded globally
    if not self._batched_env:
      time_step = tf.nest.map_structure(lambda x: np.expand_dims(x, 0), time_step)
    step = self._concrete(tf.nest.map_structure(tf.convert_to_tensor, time_step), (), None)
    step = tf.nest.map_structure(lambda t: t.numpy(), step)
    if not self._batched_env:
      step = tf.nest.map_structure(lambda x: x[0], step)
    return step


def eager_policy(policy: tf_policy.TFPolicy,
                 env: py_environment.PyEnvironment) -> CompiledPolicy:
  """Runs a TF policy from Python through one traced function."""
  return CompiledPolicy(policy, env)


def policy_trace_count(policy: py_tf_eager_policy.PyTFEagerPolicy) -> int:
  """How many times the policy's action function has been traced."""
  # pylint: disable=protected-access
  return int(policy._policy_action_fn.experimental_get_tracing_count())


class Collector:
  """Steps one (possibly batched) env with a policy and feeds the observers.

  Keeps the current time step between calls, so episodes continue across
  training iterations.
  """

  def __init__(self, env: py_environment.PyEnvironment, policy: tf_policy.TFPolicy,
               observers: List[Observer], steps_per_run: int):
    self.env = env
    self.policy = eager_policy(policy, env)
    outer_dims = (env.batch_size,) if env.batched else ()
    random_policy = random_py_policy.RandomPyPolicy(
        env.time_step_spec(), env.action_spec(), outer_dims=outer_dims)
    self._observers = observers
    self._driver = py_driver.PyDriver(env, self.policy, observers, max_steps=steps_per_run)
    self._random_policy = random_policy
    self._time_step = None

  def _time_step_or_reset(self):
    if self._time_step is None:
      self._time_step = self.env.reset()
    return self._time_step

  def collect_random(self, num_steps: int) -> None:
    """Uniformly random actions for `num_steps` env steps (the initial collect)."""
    if num_steps <= 0:
      return
    driver = py_driver.PyDriver(self.env, self._random_policy, self._observers,
                                max_steps=num_steps)
    self._time_step, _ = driver.run(self._time_step_or_reset())

  def run(self) -> None:
    """`steps_per_run` env steps with the collect policy."""
    self._time_step, _ = self._driver.run(self._time_step_or_reset())

  def trace_count(self) -> int:
    return policy_trace_count(self.policy)
