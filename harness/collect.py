"""Collection with tf-agents' PyDriver: initial random steps, then epsilon-greedy."""

from __future__ import annotations

from typing import Callable, List

from tf_agents.drivers import py_driver
from tf_agents.environments import py_environment
import tensorflow as tf
from tf_agents.policies import py_policy
from tf_agents.policies import py_tf_eager_policy
from tf_agents.policies import random_py_policy
from tf_agents.policies import tf_policy

Observer = Callable[[object], None]


class _NumpyOutputs(py_policy.PyPolicy):
  """A PyTFEagerPolicy whose actions come back as numpy arrays.

  With `batch_time_steps=False` (a batched env) PyTFEagerPolicy returns eager
  tensors, and BatchedPyEnvironment then slices them per env with TF ops: 3x
  slower collection on CartPole than numpy.
  """

  def __init__(self, policy: py_tf_eager_policy.PyTFEagerPolicy):
    super().__init__(policy.time_step_spec, policy.action_spec, policy.policy_state_spec,
                     policy.info_spec)
    self.eager = policy

  def _get_initial_state(self, batch_size):
    return self.eager.get_initial_state(batch_size)

  def _action(self, time_step, policy_state):
    step = self.eager.action(time_step, policy_state)
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, 'numpy') else t, step)


def eager_policy(policy: tf_policy.TFPolicy,
                 env: py_environment.PyEnvironment) -> py_policy.PyPolicy:
  """Runs a TF policy from Python through one traced `tf.function`."""
  eager = py_tf_eager_policy.PyTFEagerPolicy(
      policy, use_tf_function=True, batch_time_steps=not env.batched)
  return _NumpyOutputs(eager) if env.batched else eager


def policy_trace_count(policy: py_policy.PyPolicy) -> int:
  """How many times the policy's action function has been traced."""
  eager = getattr(policy, 'eager', policy)
  # pylint: disable=protected-access
  return int(eager._policy_action_fn.experimental_get_tracing_count())


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
