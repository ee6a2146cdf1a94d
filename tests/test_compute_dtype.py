"""make_agent.compute_dtype: bfloat16 conv and hidden layers, float32 weights, heads and losses."""

import os

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from harness.base import hardware
from harness.base.errors import UsageError
from harness.rl import host_policy
from harness.rl.agents import check_settings
from harness.rl.agents import make_agent
from harness.rl.agents.factory import resolve_compute_dtype

IMAGE = tensor_spec.BoundedTensorSpec([10, 10, 4], tf.uint8, 0, 1, 'observation')
VECTOR = tensor_spec.TensorSpec([4], tf.float32, 'observation')
ACTION = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 2, 'action')


def _built(observation_spec, compute_dtype, agent='ddqn', conv=((16, 3, 1),)):
  return make_agent(ts.time_step_spec(observation_spec), ACTION, tf.Variable(0, dtype=tf.int64),
                    tf.Variable(0, dtype=tf.int64), agent=agent, fc_layer_params=(32,),
                    conv_layer_params=conv if observation_spec is IMAGE else None,
                    compute_dtype=compute_dtype, num_atoms=11, num_quantiles=8)


def _observations(batch=8):
  return tf.constant(np.random.default_rng(0).integers(0, 2, (batch, 10, 10, 4)), tf.uint8)


def _experience(batch=8):
  observation = tf.stack([_observations(batch), _observations(batch)], axis=1)
  steps = tf.fill([batch, 2], tf.constant(ts.StepType.MID, tf.int32))
  return trajectory.Trajectory(
      step_type=steps, observation=observation, action=tf.zeros([batch, 2], tf.int64),
      policy_info=(), next_step_type=steps, reward=tf.ones([batch, 2]),
      discount=tf.ones([batch, 2]))


@pytest.mark.parametrize('agent', ['ddqn', 'c51', 'qrdqn', 'rainbow'])
def test_bfloat16_layers_compute_in_bfloat16_on_float32_weights_and_train(agent):
  built = _built(IMAGE, 'bfloat16', agent)
  net = built.agent._q_network  # pylint: disable=protected-access
  outputs, _ = net(_observations())
  conv = [layer for layer in net.layers if isinstance(layer, tf.keras.layers.Conv2D)]
  assert conv and conv[0].compute_dtype == 'bfloat16'
  assert all(v.dtype == tf.float32 for v in net.variables)
  assert outputs.dtype == tf.float32  # the head, and so the loss, in float32
  loss = built.agent.train(_experience()).loss
  assert np.isfinite(float(loss))


def test_bfloat16_outputs_match_float32_ones_with_the_same_weights_to_bfloat16_precision():
  nets = []
  for dtype in ('float32', 'bfloat16'):
    net = _built(IMAGE, dtype).agent._q_network  # pylint: disable=protected-access
    net(_observations())
    nets.append(net)
  for target, source in zip(nets[1].variables, nets[0].variables):
    target.assign(source)
  full, _ = nets[0](_observations())
  half, _ = nets[1](_observations())
  assert not np.array_equal(full.numpy(), half.numpy())  # bfloat16 really ran
  np.testing.assert_allclose(half.numpy(), full.numpy(), atol=0.02 * float(tf.reduce_max(
      tf.abs(full))))


def test_a_float32_checkpoint_restores_into_a_bfloat16_network(tmp_path):
  source = _built(IMAGE, 'float32').agent
  target = _built(IMAGE, 'bfloat16').agent
  for agent in (source, target):
    agent._q_network(_observations())  # pylint: disable=protected-access
  path = tf.train.Checkpoint(net=source._q_network).save(str(tmp_path / 'ckpt'))  # pylint: disable=protected-access
  tf.train.Checkpoint(net=target._q_network).restore(path).assert_consumed()  # pylint: disable=protected-access
  for a, b in zip(source._q_network.variables, target._q_network.variables):  # pylint: disable=protected-access
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_the_numpy_host_policy_computes_a_bfloat16_mlp_on_its_float32_weights():
  """Both dtypes act in numpy; the bfloat16 one within bfloat16's rounding of its graph
  (tests/test_host_policy.py checks the conv networks the same way)."""
  assert host_policy.for_tf_policy(_built(VECTOR, 'float32').agent.policy, True, 0) is not None
  agent = _built(VECTOR, 'bfloat16').agent
  host = host_policy.for_tf_policy(agent.policy, True, 0)
  assert isinstance(host, host_policy.HostQPolicy)
  observations = np.random.default_rng(0).normal(0, 2, (8, 4)).astype(np.float32)
  q_graph = agent._q_network(observations)[0].numpy()  # pylint: disable=protected-access
  q_host = host.q_values(observations)
  np.testing.assert_allclose(q_host, q_graph, rtol=0, atol=0.02 * np.abs(q_host).max())


def test_an_unknown_compute_dtype_gets_one_line_naming_the_binding():
  with pytest.raises(UsageError, match=r"make_agent.compute_dtype='float16' is unknown"):
    check_settings(compute_dtype='float16')


def test_an_exported_bfloat16_greedy_policy_acts_as_the_agent_does(tmp_path):
  from tf_agents.policies import policy_saver  # pylint: disable=g-import-not-at-top
  agent = _built(IMAGE, 'bfloat16').agent
  policy_saver.PolicySaver(agent.policy, batch_size=None).save(str(tmp_path / 'greedy'))
  loaded = tf.saved_model.load(str(tmp_path / 'greedy'))
  step = ts.restart(_observations(), batch_size=8)
  np.testing.assert_array_equal(loaded.action(step).action.numpy(),
                                agent.policy.action(step).action.numpy())


@pytest.mark.slow
def test_a_float32_run_resumes_in_bfloat16_to_its_target(tmp_path):
  from tests import cli  # pylint: disable=g-import-not-at-top
  root = str(tmp_path / 'root')
  first = cli.harness_train(root, cli.TINY_BINDINGS)
  assert first.returncode == 0, cli.tail(first)
  second = cli.harness_train(root, cli.TINY_BINDINGS + [
      'train_eval.num_env_steps=900', "make_agent.compute_dtype='bfloat16'"])
  assert second.returncode == 0, cli.tail(second)
  assert any(
      name.startswith('resume-') for name in os.listdir(os.path.join(root, 'config')))
  assert int(cli.rows(f'{root}/metrics.csv')[-1]['env_steps']) >= 900


def test_cpu_flags_are_read_from_cpuinfo_and_missing_cpuinfo_means_none(tmp_path):
  cpuinfo = tmp_path / 'cpuinfo'
  cpuinfo.write_text('processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n')
  assert {'avx512f', 'avx512_bf16'} <= hardware.cpu_flags(str(cpuinfo))
  assert hardware.cpu_flags(str(tmp_path / 'missing')) == frozenset()


def test_bfloat16_units_need_avx512_bf16_or_amx_on_a_cpu():
  assert hardware.cpu_has_bfloat16_units({'avx512f', 'avx512_bf16'})
  assert hardware.cpu_has_bfloat16_units({'amx_bf16'})
  assert not hardware.cpu_has_bfloat16_units({'avx2', 'avx512f'})


def test_auto_resolves_to_what_this_machine_has_and_builds_that():
  expected = 'bfloat16' if hardware.has_bfloat16_units() else 'float32'
  assert resolve_compute_dtype('auto') == expected
  assert resolve_compute_dtype('float32') == 'float32'
  net = _built(IMAGE, 'auto').agent._q_network  # pylint: disable=protected-access
  conv = [layer for layer in net.layers if isinstance(layer, tf.keras.layers.Conv2D)]
  assert conv and conv[0].compute_dtype == expected
