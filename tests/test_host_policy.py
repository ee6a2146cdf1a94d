"""The numpy policy acts exactly as the TF policy it stands for, and follows training."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.train.utils import train_utils
from tf_agents.trajectories import time_step as ts

from harness.rl import agents
from harness.rl import collect
from harness.rl import envs
from harness.rl import host_policy
from harness.rundir import checkpoints


def _agent(env, dueling: bool, **kwargs):
  return agents.make_agent(tensor_spec.from_spec(env.time_step_spec()),
                           tensor_spec.from_spec(env.action_spec()),
                           train_utils.create_train_step(), checkpoints.RunState().env_steps,
                           fc_layer_params=(32, 16), dueling=dueling, **kwargs)


@pytest.mark.parametrize('dueling', [False, True])
@pytest.mark.parametrize('num_envs', [1, 3])
def test_greedy_actions_and_q_values_match_the_tf_policy(num_envs, dueling):
  # Python's, numpy's and TF's seeds: Keras draws unseeded initializers' seeds from
  # Python's `random`, whose state depends on the tests that ran before.
  tf.keras.utils.set_random_seed(0)
  env = envs.make_batched_env(num_envs, seed=1) if num_envs > 1 else envs.make_env(
      'CartPole-v1', seed=1)
  agent = _agent(env, dueling).agent
  host = collect.py_policy_for(agent.policy, env)
  assert isinstance(host, host_policy.HostQPolicy)
  rng = np.random.default_rng(0)
  time_step = env.reset()
  seen = set()
  for _ in range(200):
    # Observations spread wider than an episode's, so the greedy action varies.
    observation = rng.normal(0, 2, np.shape(time_step.observation)).astype(np.float32)
    time_step = time_step._replace(observation=observation)
    batch = observation if num_envs > 1 else observation[None]
    q_tf = agent._q_network(batch)[0].numpy()  # pylint: disable=protected-access
    np.testing.assert_allclose(host.q_values(batch), q_tf, rtol=1e-5, atol=1e-6)
    expected = agent.policy.action(ts.restart(tf.constant(batch), len(batch))).action.numpy()
    action = host.action(time_step).action
    np.testing.assert_array_equal(np.atleast_1d(action), expected)
    assert np.shape(action) == (() if num_envs == 1 else (num_envs,))
    assert np.asarray(action).dtype == env.action_spec().dtype
    seen.update(np.atleast_1d(action).tolist())
  assert seen == {0, 1}  # the actions depend on the observation: a constant would not pass


def test_refresh_takes_new_weights_and_epsilon():
  env = envs.make_batched_env(4, seed=0)
  built = _agent(env, dueling=True, epsilon_greedy=0.0, epsilon_start=0.0)
  collect_policy = collect.py_policy_for(built.agent.collect_policy, env, seed=3)
  observation = np.random.default_rng(1).normal(size=(4, 4)).astype(np.float32)
  before = collect_policy.q_values(observation)
  for variable in built.agent._q_network.trainable_variables:  # pylint: disable=protected-access
    variable.assign_add(tf.ones_like(variable) * 0.1)
  np.testing.assert_array_equal(collect_policy.q_values(observation), before)  # not yet
  collect_policy.refresh()
  after = collect_policy.q_values(observation)
  assert not np.allclose(after, before)
  np.testing.assert_allclose(
      after, built.agent._q_network(observation)[0].numpy(), rtol=1e-5, atol=1e-6)  # pylint: disable=protected-access
  assert collect_policy.epsilon == 0.0
  built.epsilon.assign(end=1.0, start=1.0, decay_steps=0)
  collect_policy.refresh()
  assert collect_policy.epsilon == 1.0
  time_step = env.reset()
  actions = np.concatenate([collect_policy.action(time_step).action for _ in range(500)])
  # epsilon 1: uniform over both actions, whatever the greedy one is
  assert 0.4 < np.mean(actions == 0) < 0.6


def test_same_seed_same_exploration():
  env = envs.make_batched_env(4, seed=0)
  built = _agent(env, dueling=False, epsilon_greedy=0.5, epsilon_start=0.5)
  time_step = env.reset()
  runs = []
  for _ in range(2):
    policy = collect.py_policy_for(built.agent.collect_policy, env, seed=7)
    runs.append(np.concatenate([policy.action(time_step).action for _ in range(100)]))
  np.testing.assert_array_equal(runs[0], runs[1])


def _image_agent(shape, maximum, conv_layer_params, fc_layer_params=(8,), **kwargs):
  observation_spec = tensor_spec.BoundedTensorSpec(shape, tf.uint8, 0, maximum)
  action_spec = tensor_spec.BoundedTensorSpec((), tf.int64, 0, 3)
  return agents.make_agent(ts.time_step_spec(observation_spec), action_spec,
                           train_utils.create_train_step(), checkpoints.RunState().env_steps,
                           conv_layer_params=conv_layer_params, fc_layer_params=fc_layer_params,
                           **kwargs).agent


@pytest.mark.parametrize('maximum, conv_layer_params, dueling', [
    (1, ((16, 3, 1),), False),           # MinAtar's network on its 0/1 grids
    (255, ((4, 3, 2), (6, 2, 1)), True),  # strides, two convolutions, pixels scaled by 1/255
])
def test_small_convolutional_networks_act_in_numpy_as_the_tf_policy(maximum, conv_layer_params,
                                                                     dueling):
  tf.keras.utils.set_random_seed(0)
  agent = _image_agent((10, 10, 4), maximum, conv_layer_params, dueling=dueling)
  host = host_policy.for_tf_policy(agent.policy, batched=True, seed=0)
  assert isinstance(host, host_policy.HostQPolicy)
  rng = np.random.default_rng(0)
  seen = set()
  for _ in range(50):
    batch = rng.integers(0, maximum + 1, (4, 10, 10, 4)).astype(np.uint8)
    q_tf = agent._q_network(batch)[0].numpy()  # pylint: disable=protected-access
    np.testing.assert_allclose(host.q_values(batch), q_tf, rtol=1e-5, atol=1e-6)
    expected = agent.policy.action(ts.restart(tf.constant(batch), 4)).action.numpy()
    action = host.action(ts.restart(batch, 4)).action
    np.testing.assert_array_equal(action, expected)
    seen.update(action.tolist())
  assert len(seen) > 1  # the actions depend on the observation


def test_large_convolutional_networks_keep_the_compiled_policy():
  """The Nature CNN on Atari frames is faster in TF."""
  nature = _image_agent((84, 84, 4), 255, ((32, 8, 4), (64, 4, 2), (64, 3, 1)),
                        fc_layer_params=(512,))
  assert host_policy.for_tf_policy(nature.policy, batched=True, seed=0) is None
  assert host_policy.for_tf_policy(nature.collect_policy, batched=True, seed=0) is None


def test_bfloat16_networks_act_in_numpy_on_their_float32_weights():
  """A bfloat16 network is computed in float32 from its float32 weights: exactly
  the float32 network with the same weights, and within bfloat16's rounding of
  the graph's own Q-values."""
  tf.keras.utils.set_random_seed(0)
  bfloat16 = _image_agent((10, 10, 4), 1, ((16, 3, 1),), fc_layer_params=(32,),
                          compute_dtype='bfloat16')
  float32 = _image_agent((10, 10, 4), 1, ((16, 3, 1),), fc_layer_params=(32,))
  float32._q_network.set_weights(bfloat16._q_network.get_weights())  # pylint: disable=protected-access
  host = host_policy.for_tf_policy(bfloat16.collect_policy, batched=True, seed=0)
  assert isinstance(host, host_policy.HostQPolicy)
  rng = np.random.default_rng(0)
  agree = 0
  for _ in range(50):
    batch = rng.integers(0, 2, (4, 10, 10, 4)).astype(np.uint8)
    q_host = host.q_values(batch)
    np.testing.assert_allclose(q_host, float32._q_network(batch)[0].numpy(),  # pylint: disable=protected-access
                               rtol=1e-5, atol=1e-6)
    q_bfloat16 = bfloat16._q_network(batch)[0].numpy()  # pylint: disable=protected-access
    assert q_bfloat16.dtype == np.float32
    assert not np.array_equal(q_host, q_bfloat16)  # the graph did compute in bfloat16
    scale = np.abs(q_host).max()
    np.testing.assert_allclose(q_host, q_bfloat16, rtol=0, atol=0.02 * scale)
    agree += np.sum(np.argmax(q_host, -1) == np.argmax(q_bfloat16, -1))
  assert agree >= 0.9 * 200  # the same greedy action but at near-ties
