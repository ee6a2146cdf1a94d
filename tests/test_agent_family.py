"""C51, QR-DQN, noisy nets and Rainbow: the tf-agents fixes (each test also shows the stock
CategoricalDqnAgent failing it), the losses against values computed by hand on a two-state
toy, and the noise that the collect policy has and the greedy policies do not."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.agents.categorical_dqn import categorical_dqn_agent
from tf_agents.networks import categorical_q_network
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import policy_step
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from harness.base.errors import UsageError
from harness.rl.agents import check_settings
from harness.rl.agents import distributional
from harness.rl.agents import make_agent
from harness.rl.agents.noisy import NoisyDense

OBSERVATION = tensor_spec.TensorSpec([1], tf.float32, 'observation')
ACTION = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1, 'action')
TIME_STEP_SPEC = ts.time_step_spec(OBSERVATION)
SUPPORT = np.array([0.0, 1.0, 2.0])
GAMMA = 0.5


def _agent(kind='c51', **kwargs):
  """A toy agent: no hidden layer, so the head reads the 1-d observation directly."""
  settings = dict(agent=kind, fc_layer_params=(), gamma=GAMMA, num_atoms=3, min_q_value=0.0,
                  max_q_value=2.0, num_quantiles=2, epsilon_greedy=0.0)
  settings.update(kwargs)
  return make_agent(TIME_STEP_SPEC, ACTION, tf.Variable(0, dtype=tf.int64),
                    tf.Variable(0, dtype=tf.int64), **settings).agent


def _set_head(net, kernel, bias):
  """The head's one Dense layer: outputs = x * kernel + bias, [A * atoms] flattened."""
  dense = net.layers[-1]._advantage  # pylint: disable=protected-access
  dense.kernel.assign(np.asarray(kernel, np.float32).reshape(1, -1))
  dense.bias.assign(np.asarray(bias, np.float32).reshape(-1))


def _experience(first_type=ts.StepType.FIRST, reward=0.5, discount=1.0, batch=1, action=0):
  """[batch, 2] trajectories s0 (x=0) -action-> s1 (x=1)."""
  step_type = tf.constant([[first_type, ts.StepType.MID]] * batch, tf.int32)
  next_type = tf.constant([[ts.StepType.MID, ts.StepType.MID]] * batch, tf.int32)
  observation = tf.constant([[[0.0], [1.0]]] * batch)
  return trajectory.Trajectory(
      step_type=step_type, observation=observation,
      action=tf.constant([[action, 0]] * batch, tf.int64), policy_info=(),
      next_step_type=next_type, reward=tf.constant([[reward, 0.0]] * batch),
      discount=tf.constant([[discount, 1.0]] * batch))


def _stock_c51():
  net = categorical_q_network.CategoricalQNetwork(OBSERVATION, ACTION, num_atoms=3,
                                                  fc_layer_params=(4,))
  agent = categorical_dqn_agent.CategoricalDqnAgent(
      TIME_STEP_SPEC, ACTION, categorical_q_network=net, optimizer=tf.keras.optimizers.Adam(),
      min_q_value=0.0, max_q_value=2.0, gamma=GAMMA)
  agent.initialize()
  return agent


def _softmax(x):
  e = np.exp(x - np.max(x))
  return e / e.sum()


# -- C51 --------------------------------------------------------------------------------------

def test_c51_loss_matches_the_projection_computed_by_hand():
  agent = _agent('c51', double_q=False)
  # Online logits at s0 (x=0) are the bias; at s1 (x=1) bias + kernel.
  online_bias = [0.0, 1.0, 2.0, 0.5, 0.5, 0.5]
  target_bias = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
  target_kernel = [2.0, 0.0, 0.0, 0.0, 0.0, 3.0]  # at s1: action 0 -> low atoms, action 1 -> high
  _set_head(agent._q_network, np.zeros(6), online_bias)  # pylint: disable=protected-access
  _set_head(agent._target_q_network, target_kernel, target_bias)  # pylint: disable=protected-access
  loss = agent._loss(_experience(), gamma=GAMMA)  # pylint: disable=protected-access

  # By hand. Target at s1: action 1 has the higher mean (no double-Q: the target net picks).
  p = _softmax(np.array([0.0, 0.0, 3.0]))
  # r + gamma * z = 0.5 + 0.5 * [0, 1, 2] = [0.5, 1.0, 1.5] onto [0, 1, 2]:
  target = np.array([0.5 * p[0], 0.5 * p[0] + p[1] + 0.5 * p[2], 0.5 * p[2]])
  expected = -np.sum(target * np.log(_softmax(np.array(online_bias[:3]))))
  assert float(loss.loss) == pytest.approx(expected, rel=1e-5)
  assert float(loss.extra.td_error[0]) == pytest.approx(expected, rel=1e-5)


def test_c51_projection_equals_tf_agents_projection_with_clipping_and_terminals():
  rng = np.random.default_rng(0)
  support = tf.constant(np.linspace(-10.0, 10.0, 51), tf.float32)
  reward = rng.uniform(-15.0, 15.0, size=(64, 1)).astype(np.float32)  # some beyond the range
  discount = rng.choice([0.0, 0.99], size=(64, 1)).astype(np.float32)  # terminals among them
  target_support = tf.constant(reward + discount * support.numpy()[None, :])
  probabilities = tf.nn.softmax(rng.normal(size=(64, 51)).astype(np.float32))
  ours = distributional.project_onto_support(target_support, probabilities, support)
  stock = categorical_dqn_agent.project_distribution(target_support, probabilities, support)
  # float32 round-off of the fractional index (dividing by the spacing) differs
  # between the two ways of computing it: a few 1e-6 where clipped mass piles up.
  np.testing.assert_allclose(ours.numpy(), stock.numpy(), atol=1e-5)
  np.testing.assert_allclose(ours.numpy().sum(axis=1), 1.0, atol=1e-5)


def test_c51_takes_the_next_action_from_the_online_network_with_double_q():
  agent = _agent('c51', double_q=True)
  online_kernel = [0.0, 0.0, 5.0, 0.0, 0.0, 0.0]  # at s1 the online net prefers action 0
  target_kernel = [2.0, 0.0, 0.0, 0.0, 0.0, 3.0]  # ... the target net action 1
  _set_head(agent._q_network, online_kernel, np.zeros(6))  # pylint: disable=protected-access
  _set_head(agent._target_q_network, target_kernel, np.zeros(6))  # pylint: disable=protected-access
  loss = float(agent._loss(_experience(), gamma=GAMMA).loss)  # pylint: disable=protected-access
  p = _softmax(np.array([2.0, 0.0, 0.0]))  # the target net's distribution of action 0
  target = np.array([0.5 * p[0], 0.5 * p[0] + p[1] + 0.5 * p[2], 0.5 * p[2]])
  expected = -np.sum(target * np.log(_softmax(np.zeros(3))))
  assert loss == pytest.approx(expected, rel=1e-5)
  # The stock agent picks with the target network: its next-state distribution is another.
  stock = _stock_c51()
  stock_next = stock._next_q_distribution(  # pylint: disable=protected-access
      ts.transition(tf.constant([[1.0]]), reward=tf.constant([0.0])))
  stock_q = stock._target_q_network(tf.constant([[1.0]]))[0]  # pylint: disable=protected-access
  stock_means = tf.reduce_sum(tf.nn.softmax(stock_q) * stock._support, -1)  # pylint: disable=protected-access
  chosen = int(tf.argmax(stock_means, -1)[0])
  np.testing.assert_allclose(stock_next[0], tf.nn.softmax(stock_q)[0, chosen], rtol=1e-6)


def test_c51_weights_the_loss_where_the_stock_agent_ignores_the_weights():
  experience = _experience(batch=2)
  ours = _agent('c51')
  full = float(ours._loss(experience, gamma=GAMMA).loss)  # pylint: disable=protected-access
  zero = float(ours._loss(experience, gamma=GAMMA, weights=tf.zeros([2])).loss)  # pylint: disable=protected-access
  half = float(ours._loss(experience, gamma=GAMMA, weights=tf.constant([1.0, 0.0])).loss)  # pylint: disable=protected-access
  assert full > 0 and zero == 0.0 and half == pytest.approx(full / 2, rel=1e-5)
  stock = _stock_c51()
  stock_full = float(stock._loss(experience, gamma=GAMMA).loss)  # pylint: disable=protected-access
  stock_zero = float(stock._loss(experience, gamma=GAMMA, weights=tf.zeros([2])).loss)  # pylint: disable=protected-access
  assert stock_zero == pytest.approx(stock_full)  # the stock agent ignores them


def test_c51_returns_a_per_sample_loss_for_priorities_where_the_stock_agent_returns_none():
  experience = _experience(batch=3)
  td_error = _agent('c51')._loss(experience, gamma=GAMMA).extra.td_error  # pylint: disable=protected-access
  assert td_error.shape == (3,) and bool(tf.reduce_all(td_error > 0))
  assert _stock_c51()._loss(experience, gamma=GAMMA).extra.td_error == ()  # pylint: disable=protected-access


def test_c51_masks_a_row_that_starts_at_an_episode_end_where_the_stock_agent_trains_on_it():
  boundary = _experience(first_type=ts.StepType.LAST)
  loss = _agent('c51')._loss(boundary, gamma=GAMMA)  # pylint: disable=protected-access
  assert float(loss.loss) == 0.0 and float(loss.extra.td_error[0]) == 0.0
  assert float(_stock_c51()._loss(boundary, gamma=GAMMA).loss) > 0.0  # pylint: disable=protected-access


# -- QR-DQN -----------------------------------------------------------------------------------

def test_quantile_huber_loss_matches_a_value_computed_by_hand():
  # tau = [0.25, 0.75]; u_ij = T_j - theta_i with theta = [0, 1], T = [0.5, 3]:
  # i=0: u = [0.5, 3] -> Huber [0.125, 2.5], weight 0.25 -> 0.25 * 2.625 / 2 = 0.328125
  # i=1: u = [-0.5, 2] -> Huber [0.125, 1.5], weights [0.25, 0.75] -> 1.15625 / 2 = 0.578125
  loss = distributional.quantile_huber_loss(tf.constant([[0.0, 1.0]]), tf.constant([[0.5, 3.0]]))
  assert float(loss[0]) == pytest.approx(0.328125 + 0.578125)


def _autodiff_quantile_huber(quantiles, targets, kappa=1.0):
  """The loss written plainly, for autodiff to differentiate."""
  n = quantiles.shape[-1]
  tau = (tf.range(n, dtype=tf.float32) + 0.5) / n
  u = targets[:, None, :] - quantiles[:, :, None]
  huber = tf.where(tf.abs(u) <= kappa, 0.5 * tf.square(u), kappa * (tf.abs(u) - 0.5 * kappa))
  weight = tf.abs(tau[None, :, None] - tf.cast(u < 0.0, tf.float32))
  return tf.reduce_sum(tf.reduce_mean(weight * huber / kappa, axis=2), axis=1)


@pytest.mark.parametrize('kappa', [1.0, 0.5])
def test_quantile_huber_gradient_written_by_hand_equals_autodiff(kappa):
  rng = np.random.default_rng(0)
  quantiles = tf.constant(rng.normal(size=(8, 5)).astype(np.float32))
  # Targets far out (|u| > kappa), close (|u| < kappa) and equal to a quantile (u = 0).
  targets = tf.concat([tf.constant(3.0 * rng.normal(size=(8, 6)).astype(np.float32)),
                       quantiles[:, :1]], axis=1)
  row_weights = tf.range(1.0, 9.0)  # a different upstream gradient per sample
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(quantiles)
    ours = distributional.quantile_huber_loss(quantiles, targets, kappa)
    plain = _autodiff_quantile_huber(quantiles, targets, kappa)
    ours_total, plain_total = tf.reduce_sum(ours * row_weights), tf.reduce_sum(plain * row_weights)
  np.testing.assert_allclose(ours, plain, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(tape.gradient(ours_total, quantiles),
                             tape.gradient(plain_total, quantiles), rtol=1e-5, atol=1e-6)


def test_written_out_softmax_equals_tensorflows():
  logits = tf.constant(np.random.default_rng(0).normal(scale=30.0, size=(4, 3, 51)),
                       dtype=tf.float32)  # large logits: the max is subtracted first
  np.testing.assert_allclose(distributional.softmax(logits), tf.nn.softmax(logits),
                             rtol=1e-5, atol=1e-7)


def test_qrdqn_loss_on_the_toy_uses_the_target_quantiles_of_the_online_choice():
  agent = _agent('qrdqn', double_q=True)
  # Quantiles [actions, 2]: online at s0 = bias; at s1 the online net prefers action 1.
  _set_head(agent._q_network, [0.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0])  # pylint: disable=protected-access
  # Target at s1: action 0 -> [9, 9] (it would win without double-Q), action 1 -> [0, 5].
  _set_head(agent._target_q_network, [9.0, 9.0, 0.0, 5.0], np.zeros(4))  # pylint: disable=protected-access
  loss = agent._loss(_experience(reward=0.5), gamma=GAMMA)  # pylint: disable=protected-access
  # T = 0.5 + 0.5 * [0, 5] = [0.5, 3.0]; theta(s0, a0) = [0, 1]: the value above.
  assert float(loss.loss) == pytest.approx(0.90625)
  assert loss.extra.td_error.shape == (1,)


def test_qrdqn_acts_on_the_mean_of_its_quantiles():
  agent = _agent('qrdqn')
  _set_head(agent._q_network, np.zeros(4), [0.0, 3.0, 1.0, 1.0])  # pylint: disable=protected-access
  time_step = ts.restart(tf.constant([[0.0]]), batch_size=1)
  assert int(agent.policy.action(time_step).action[0]) == 0  # mean 1.5 against 1.0


# -- Noisy nets and Rainbow -------------------------------------------------------------------

def test_noisy_dense_draws_new_noise_on_each_training_call_and_none_otherwise():
  layer = NoisyDense(3, sigma0=0.5)
  x = tf.ones([2, 4])
  layer(x)  # built outside the function, so its traces count calls only
  call = tf.function(lambda x, training: layer(x, training=training))
  first, second = call(x, True), call(x, True)
  assert not np.allclose(first, second)
  np.testing.assert_allclose(call(x, False), call(x, False))
  np.testing.assert_allclose(call(x, False), x @ layer.kernel_mu + layer.bias_mu, rtol=1e-6)
  assert call.experimental_get_tracing_count() == 2  # one per value of training, no more


def test_rainbow_explores_by_noise_in_collect_and_the_greedy_policy_has_none():
  agent = make_agent(TIME_STEP_SPEC, ACTION, tf.Variable(0, dtype=tf.int64),
                     tf.Variable(0, dtype=tf.int64), agent='rainbow', fc_layer_params=(16,),
                     noisy_sigma0=2.0)
  assert isinstance(agent.agent, distributional.C51Agent)
  assert float(agent.epsilon()) == 0.0  # noisy nets: the collect epsilon defaults to 0
  observations = tf.constant(np.random.default_rng(0).normal(size=(512, 1)), tf.float32)
  time_step = ts.restart(observations, batch_size=512)
  greedy = [agent.agent.policy.action(time_step).action.numpy() for _ in range(3)]
  collect = [agent.agent.collect_policy.action(time_step).action.numpy() for _ in range(3)]
  assert all((g == greedy[0]).all() for g in greedy)
  assert any((c != collect[0]).any() for c in collect[1:])


def test_exported_greedy_policy_has_no_noise_op_and_the_collect_policy_has(tmp_path):
  from tf_agents.policies import policy_saver  # pylint: disable=g-import-not-at-top
  agent = make_agent(TIME_STEP_SPEC, ACTION, tf.Variable(0, dtype=tf.int64),
                     tf.Variable(0, dtype=tf.int64), agent='rainbow', fc_layer_params=(8,)).agent

  def random_ops(policy, name):
    path = str(tmp_path / name)
    policy_saver.PolicySaver(policy, batch_size=None).save(path)
    loaded = tf.saved_model.load(path)
    graph = loaded.signatures['action'].graph.as_graph_def()
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return sum(n.op == 'RandomStandardNormal' for n in nodes)

  assert random_ops(agent.policy, 'greedy') == 0
  assert random_ops(agent.collect_policy, 'collect') > 0


def test_every_agent_trains_a_step_and_gets_priorities():
  for kind in ('ddqn', 'c51', 'qrdqn', 'rainbow'):
    agent = make_agent(TIME_STEP_SPEC, ACTION, tf.Variable(0, dtype=tf.int64),
                       tf.Variable(0, dtype=tf.int64), agent=kind, fc_layer_params=(8,),
                       num_quantiles=4, num_atoms=5).agent
    info = agent.train(_experience(batch=4), weights=tf.ones([4]))
    assert np.isfinite(float(info.loss)), kind
    assert info.extra.td_error.shape == (4,), kind


# -- Settings ---------------------------------------------------------------------------------

@pytest.mark.parametrize('binding, value, fragment', [
    ('agent', 'dqn', "make_agent.agent='dqn' is unknown"),
    ('num_atoms', 1, 'num_atoms=1 must be an integer >= 2'),
    ('min_q_value', 10.0, 'min_q_value < max_q_value'),
    ('num_quantiles', 0, 'num_quantiles=0 must be an integer >= 1'),
    ('noisy_sigma0', 0.0, 'noisy_sigma0=0.0 must be a positive number'),
    ('noisy', 'yes', "make_agent.noisy='yes' must be True or False"),
    ('fc_layer_params', (0,), 'fc_layer_params=(0,) must be a tuple of positive'),
    ('fc_layer_params', (-5, 3), 'fc_layer_params=(-5, 3) must be a tuple of positive'),
    ('conv_layer_params', ((16, 3),), 'conv_layer_params=((16, 3),) must be None or'),
    ('gamma', 1.5, 'gamma=1.5 is outside [0, 1]'),
    ('target_update_tau', 0, 'target_update_tau=0 must be in (0, 1]'),
    ('target_update_period', 0, 'target_update_period=0 must be an integer >= 1'),
    ('gradient_clipping', -1.0, 'gradient_clipping=-1.0 must be None or'),
    ('reward_scale_factor', 0, 'reward_scale_factor=0 must be'),
    ('adam_epsilon', 0, 'adam_epsilon=0 must be'),
])
def test_bad_make_agent_values_get_one_line_naming_the_binding(binding, value, fragment):
  with pytest.raises(UsageError, match=None) as error:
    check_settings(**{binding: value})
  assert fragment in str(error.value)
  assert '\n' not in str(error.value)


def test_the_default_epsilon_is_zero_with_noisy_nets_only():
  plain = make_agent(TIME_STEP_SPEC, ACTION, tf.Variable(0, dtype=tf.int64),
                     tf.Variable(0, dtype=tf.int64), fc_layer_params=(4,))
  noisy = make_agent(TIME_STEP_SPEC, ACTION, tf.Variable(0, dtype=tf.int64),
                     tf.Variable(0, dtype=tf.int64), fc_layer_params=(4,), noisy=True)
  assert float(plain.epsilon()) == pytest.approx(0.1)
  assert float(noisy.epsilon()) == 0.0
  assert isinstance(noisy.agent, distributional.NoisyDdqnAgent)
  step = policy_step.PolicyStep  # the greedy policy of the noisy DDQN is deterministic
  time_step = ts.restart(tf.zeros([64, 1]), batch_size=64)
  actions = [noisy.agent.policy.action(time_step).action.numpy() for _ in range(3)]
  assert step and all((a == actions[0]).all() for a in actions)


def test_images_on_an_mlp_config_get_a_warning_naming_the_atari_file(caplog):
  image = tensor_spec.BoundedTensorSpec([84, 84, 4], tf.uint8, 0, 255, 'observation')
  with caplog.at_level('WARNING'):
    make_agent(ts.time_step_spec(image), ACTION, tf.Variable(0, dtype=tf.int64),
               tf.Variable(0, dtype=tf.int64), fc_layer_params=(4,))
  assert any('gin/ddqn_atari.gin' in r.getMessage() for r in caplog.records)
  caplog.clear()
  with caplog.at_level('WARNING'):
    make_agent(ts.time_step_spec(image), ACTION, tf.Variable(0, dtype=tf.int64),
               tf.Variable(0, dtype=tf.int64), fc_layer_params=(4,),
               conv_layer_params=((4, 8, 4),))
  assert not any('gin/ddqn_atari.gin' in r.getMessage() for r in caplog.records)
