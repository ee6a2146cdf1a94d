"""Collection: initial random steps, then epsilon-greedy, stepped by `drive`."""

from __future__ import annotations

from typing import Callable, List, Tuple, Union

import numpy as np
import tensorflow as tf
from tf_agents.environments import py_environment
from tf_agents.policies import py_policy
from tf_agents.policies import py_tf_eager_policy
from tf_agents.policies import random_py_policy
from tf_agents.policies import tf_policy
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from harness.base import host_calls
from harness.rl import host_policy

Observer = Callable[[object], None]
# Env steps of the initial random collect between two looks at a stop request.
RANDOM_CHUNK_STEPS = 1000


_LAST = int(ts.StepType.LAST)


def is_last(step_type) -> np.ndarray:
  """Which envs of a (batched) numpy step type are at an episode's LAST step.

  Rather than tf-agents' `TimeStep.is_last()` / `Trajectory.is_boundary()`:
  those first ask `tf.is_tensor`, which on a numpy array is an isinstance check
  against a typing Protocol, about 50 us here, several times per env step.
  """
  return np.asarray(step_type) == _LAST


def drive(env: py_environment.PyEnvironment, policy, observers: List[Observer],
          time_step: ts.TimeStep, max_steps: int) -> Tuple[ts.TimeStep, int]:
  """Steps `env` with `policy` for at least `max_steps` env steps, handing each
  trajectory to the observers; returns the last time step and the steps taken.

  What tf-agents' `PyDriver.run` does with `max_steps` (a batched step counts
  its envs; the LAST -> FIRST step of an auto-reset counts as none), written
  out here because PyDriver asks every trajectory `is_boundary()` twice (see
  `is_last`): a fifth of a MountainCar env step went there.
  """
  steps = 0
  while steps < max_steps:
    action_step = policy.action(time_step)
    next_time_step = env.step(action_step.action)
    traj = trajectory.Trajectory(
        step_type=time_step.step_type, observation=time_step.observation,
        action=action_step.action, policy_info=action_step.info,
        next_step_type=next_time_step.step_type, reward=next_time_step.reward,
        discount=next_time_step.discount)
    for observer in observers:
      observer(traj)
    steps += int(np.size(time_step.step_type) - np.count_nonzero(is_last(time_step.step_type)))
    time_step = next_time_step
  return time_step, steps


class CompiledPolicy(py_tf_eager_policy.PyTFEagerPolicy):
  """A PyTFEagerPolicy that passes only the observation to one traced function.

  Two deviations from PyTFEagerPolicy, both for long runs:
  - It calls one concrete function traced for the env's batch size instead of
    dispatching through `tf.function` on every call, which binds and matches
    the arguments in Python: 2x cheaper per call.
  - Only the observation crosses into TensorFlow; the step type, reward and
    discount are filled in inside the graph. In TF 2.15 on Python 3.11 every
    EagerTensor keeps ~48 bytes for good (one Python block per tensor,
    measured), so a full TimeStep cost four tensors per call and the collect
    loop grew ~1 MB per 10,000 Breakout steps. The observation goes in and the
    action comes out as numpy through `host_calls.HostCall`: no tensor at all.
    The harness's Q policies are feed-forward and read only the observation,
    which the constructor checks.
  Actions come back as numpy arrays, as BatchedPyEnvironment wants them.
  """

  def __init__(self, policy: tf_policy.TFPolicy, env: py_environment.PyEnvironment):
    if policy.policy_state_spec != ():  # pylint: disable=g-explicit-bool-comparison
      raise ValueError('CompiledPolicy needs a stateless (feed-forward) policy')
    super().__init__(policy, use_tf_function=False, batch_time_steps=False)
    self._batched_env = env.batched
    self._batch_size = env.batch_size if env.batched else 1
    observation_spec = tensor_spec.add_outer_dim(policy.time_step_spec.observation,
                                                 self._batch_size)
    self._act = host_calls.HostCall(
        lambda *flat: self._act_on_observation(tf.nest.pack_sequence_as(observation_spec,
                                                                        list(flat))),
        tf.nest.flatten(observation_spec), name='compiled_policy')

  def _act_on_observation(self, observation):
    spec = self._policy.time_step_spec
    shape = lambda s: [self._batch_size] + s.shape.as_list()
    time_step = ts.TimeStep(
        step_type=tf.fill(shape(spec.step_type), tf.constant(ts.StepType.MID,
                                                              spec.step_type.dtype)),
        reward=tf.nest.map_structure(lambda s: tf.zeros(shape(s), s.dtype), spec.reward),
        discount=tf.ones(shape(spec.discount), spec.discount.dtype),
        observation=observation)
    return self._policy.action(time_step)

  def _action(self, time_step, policy_state, seed=None):
    del policy_state, seed  # stateless policies; sampling is seeded globally
    observation = time_step.observation
    if not self._batched_env:
      observation = tf.nest.map_structure(lambda x: np.expand_dims(x, 0), observation)
    step = self._act(*tf.nest.flatten(observation))
    if not self._batched_env:
      step = tf.nest.map_structure(lambda x: x[0], step)
    return step

  def refresh(self) -> None:
    """Nothing to copy: the traced function reads the variables at each call."""

  def trace_count(self) -> int:
    """How many times the action function has been traced (1 for a healthy run)."""
    return self._act.trace_count()


def py_policy_for(policy: tf_policy.TFPolicy, env: py_environment.PyEnvironment,
                  seed: int = 0):
  """`policy` as a py policy for `env`: in numpy where `harness.rl.host_policy`
  computes its network exactly (no TensorFlow call per step), else compiled.

  Call its `refresh()` after the network's weights or the epsilon changed.
  `seed` seeds the numpy policy's exploration draws.
  """
  return host_policy.for_tf_policy(policy, env.batched, seed) or CompiledPolicy(policy, env)


class Collector:
  """Steps one (possibly batched) env with a policy and feeds the observers.

  Keeps the current time step between calls, so episodes continue across
  training iterations.
  """

  def __init__(self, env: py_environment.PyEnvironment,
               policy: Union[tf_policy.TFPolicy, py_policy.PyPolicy],
               observers: List[Observer], steps_per_run: int, seed: int = 0):
    """`policy`: a TF policy (run as `py_policy_for` makes it, exploring with
    `seed`), or a py policy with a `refresh()`, used as it is."""
    self.env = env
    self.policy = (policy if isinstance(policy, py_policy.PyPolicy)
                   else py_policy_for(policy, env, seed))
    outer_dims = (env.batch_size,) if env.batched else ()
    random_policy = random_py_policy.RandomPyPolicy(
        env.time_step_spec(), env.action_spec(), outer_dims=outer_dims)
    self._observers = observers
    self._steps_per_run = steps_per_run
    self._random_policy = random_policy
    self._time_step = None

  def _time_step_or_reset(self):
    if self._time_step is None:
      self._time_step = self.env.reset()
    return self._time_step

  def collect_random(self, num_steps: int,
                     should_stop: Callable[[], bool] = lambda: False) -> int:
    """Uniformly random actions for `num_steps` env steps (the initial collect).

    Runs in chunks of about `RANDOM_CHUNK_STEPS`, asking `should_stop` between
    them (Atari's 20,000 steps take half a minute). Returns the env steps taken.
    """
    if num_steps <= 0:
      return 0
    batch = self.env.batch_size if self.env.batched else 1
    chunk = -(-RANDOM_CHUNK_STEPS // batch) * batch  # a whole number of batched steps
    taken = 0
    while taken < num_steps and not should_stop():
      self._time_step, steps = drive(self.env, self._random_policy, self._observers,
                                     self._time_step_or_reset(), min(chunk, num_steps - taken))
      taken += steps
    return taken

  def run(self) -> None:
    """`steps_per_run` env steps with the collect policy."""
    self.policy.refresh()  # the weights and epsilon of the training since the last run
    self._time_step, _ = drive(self.env, self.policy, self._observers,
                               self._time_step_or_reset(), self._steps_per_run)

  def trace_count(self) -> int:
    return self.policy.trace_count()
