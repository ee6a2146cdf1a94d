"""The step replay's storage: steps come back from Reverb exactly as the env gave them."""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.train.utils import train_utils

from harness.base.errors import UsageError
from harness.rl import agents
from harness.rl import collect
from harness.rl import envs
from harness.rl import replay
from harness.rundir import checkpoints


class _Float64Corridor(gym.Env):
  """Float64 observations that float32 cannot hold (so they get a column of their own):
  1 + 1e-12 * (a count of all steps so far), unique to each step of every episode."""

  observation_space = gym.spaces.Box(-np.inf, np.inf, (2, 3), np.float64)
  action_space = gym.spaces.Discrete(3)
  _count = 0

  def reset(self, seed=None, options=None):
    super().reset(seed=seed)
    self._t = 0
    return self._observation(), {}

  def _observation(self):
    _Float64Corridor._count += 1
    return 1.0 + 1e-12 * self._count + np.arange(6.0).reshape(2, 3)

  def step(self, action):
    self._t += 1
    return self._observation(), float(action) - 0.25, self._t >= 5, False, {}


gym.register('Float64Corridor-v0', entry_point=_Float64Corridor, max_episode_steps=4)


class _Log:
  """Every trajectory the collector hands the observers, as numpy."""

  def __init__(self):
    self.steps = []

  def __call__(self, traj):
    self.steps.append(traj)


def _agent(env):
  return agents.make_agent(tensor_spec.from_spec(env.time_step_spec()),
                           tensor_spec.from_spec(env.action_spec()),
                           train_utils.create_train_step(), checkpoints.RunState().env_steps,
                           fc_layer_params=(8,)).agent


@pytest.mark.parametrize('env_id, packed', [('CartPole-v1', True), ('Float64Corridor-v0', False)])
@pytest.mark.parametrize('num_envs', [1, 3])
def test_sampled_items_are_the_collected_steps_exactly(env_id, packed, num_envs):
  env = (envs.make_env(env_id, seed=0) if num_envs == 1 else
         envs.batched_py_environment.BatchedPyEnvironment(
             [envs.make_env(env_id, seed=i) for i in range(num_envs)], multithreading=False))
  agent = _agent(env)
  layout = replay.StepReplay(agent.collect_data_spec, 3, num_envs)
  assert set(layout.signature()) == ({'step'} if packed else {'observation', 'meta'})
  server = replay.start_server([layout.make_table(3000)], checkpoint_dir=None)
  try:
    observer = layout.make_observer(server.localhost_client(), num_envs)
    log = _Log()
    collect.Collector(env, agent.collect_policy, [observer, log], 4).collect_random(150)
    observer.flush()
    # Every stored window of 3 steps, per env, keyed by its first observation's bytes.
    windows = {}
    for e in range(num_envs):
      steps = [tf.nest.map_structure(lambda x, e=e: np.asarray(x)[e], s) if num_envs > 1
               else s for s in log.steps]
      for k in range(len(steps) - 2):
        windows[np.asarray(steps[k].observation).tobytes()] = steps[k:k + 3]
    experience, _ = next(iter(layout.make_dataset(f'localhost:{server.port}', batch_size=12)))
    assert experience.observation.dtype == agent.collect_data_spec.observation.dtype
    assert experience.observation.shape == (12, 3) + env.observation_spec().shape
    for row in range(12):
      stored = windows[experience.observation[row, 0].numpy().tobytes()]
      for t in range(3):
        for field in ('step_type', 'observation', 'action', 'next_step_type', 'reward',
                      'discount'):
          got = getattr(experience, field)[row, t].numpy()
          want = np.asarray(getattr(stored[t], field))
          np.testing.assert_array_equal(got, want, err_msg=f'{field} at step {t}')
          assert got.dtype == want.dtype, field
  finally:
    server.stop()


def test_a_restored_table_of_another_layout_is_refused():
  """A replay checkpoint from an older harness (a column per Trajectory field)."""
  env = envs.make_env('CartPole-v1', seed=0)
  agent = _agent(env)
  old_signature = tensor_spec.add_outer_dim(tensor_spec.from_spec(agent.collect_data_spec), 2)
  server = replay.start_server([replay.make_table(old_signature, 10)], checkpoint_dir=None)
  try:
    with pytest.raises(UsageError, match='another layout'):
      replay.StepReplay(agent.collect_data_spec, 2).make_observer(server.localhost_client(), 1)
  finally:
    server.stop()


def test_a_batch_of_envs_rows_are_sampled_one_by_one():
  """Rows of a training batch are separate draws, not the same step of every env:
  envs in lockstep (CartPole's once each episode runs to the time limit) would
  otherwise fill a batch with near-copies."""
  num_envs = 4
  env = envs.batched_py_environment.BatchedPyEnvironment(
      [envs.make_env('CartPole-v1', seed=i) for i in range(num_envs)], multithreading=False)
  agent = _agent(env)
  layout = replay.StepReplay(agent.collect_data_spec, 2, num_envs)
  server = replay.start_server([layout.make_table(3000)], checkpoint_dir=None)
  try:
    observer = layout.make_observer(server.localhost_client(), num_envs)
    log = _Log()
    collect.Collector(env, agent.collect_policy, [observer, log], 4).collect_random(400)
    observer.flush()
    when = {}  # first observation's bytes -> the batched step it was collected at
    for k, step in enumerate(log.steps):
      for e in range(num_envs):
        when[np.asarray(step.observation)[e].tobytes()] = k
    experience, _ = next(iter(layout.make_dataset(f'localhost:{server.port}', batch_size=32)))
    steps = [when[experience.observation[row, 0].numpy().tobytes()] for row in range(32)]
    # 32 uniform draws from ~400 items: rows 4i..4i+3 all of one step by chance
    # for every i has a probability far below 1e-20; grouped items always did.
    assert any(len(set(steps[i:i + num_envs])) > 1 for i in range(0, 32, num_envs))
    assert len(set(steps)) > 16
  finally:
    server.stop()
