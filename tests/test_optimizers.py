"""FusedAdam: Keras' Adam update in one fused op per variable, with Keras' variables."""

import numpy as np
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from harness.rl.agents import make_agent
from harness.rl.agents.optimizers import FusedAdam

SHAPES = [(4, 32), (32,), (32, 6), (6,)]


def _variables():
  rng = np.random.default_rng(0)
  return [tf.Variable(rng.normal(size=s).astype(np.float32)) for s in SHAPES]


def _gradients(step):
  rng = np.random.default_rng(100 + step)
  return [tf.constant(rng.normal(size=s).astype(np.float32)) for s in SHAPES]


def _train(optimizer_class, steps=6, new_rate_at=3):
  """`steps` compiled updates; the rate is changed by assignment mid-way, as a resume does."""
  variables = _variables()
  optimizer = optimizer_class(learning_rate=1e-2, epsilon=3e-4)
  optimizer.build(variables)

  @tf.function(autograph=False)
  def apply(gradients):
    optimizer.apply_gradients(zip(gradients, variables))

  for step in range(steps):
    if step == new_rate_at:
      optimizer.learning_rate.assign(2e-3)
    apply(_gradients(step))
  return variables, optimizer, apply


def test_fused_adam_updates_as_keras_adam_does_with_one_op_per_variable():
  keras_vars, keras_opt, keras_apply = _train(tf.keras.optimizers.Adam)
  fused_vars, fused_opt, fused_apply = _train(FusedAdam)
  for expected, got in zip(keras_vars, fused_vars):
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
  for expected, got in zip(keras_opt.variables, fused_opt.variables):
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
  specs = [tf.TensorSpec(s, tf.float32) for s in SHAPES]
  def op_types(apply):
    return [op.type for op in apply.get_concrete_function(specs).graph.get_operations()]
  fused, stock = op_types(fused_apply), op_types(keras_apply)
  assert fused.count('ResourceApplyAdam') == len(SHAPES)
  assert stock.count('ResourceApplyAdam') == 0
  assert len(fused) < len(stock) / 2, (len(fused), len(stock))


def test_two_steps_built_in_one_graph_each_read_the_step_count():
  """The per-step scalars are shared between variables, never between steps."""
  def two_steps_with(optimizer_class):
    variables = _variables()
    optimizer = optimizer_class(learning_rate=1e-2)
    optimizer.build(variables)

    @tf.function(autograph=False)
    def two_steps(first, second):
      optimizer.apply_gradients(zip(first, variables))
      optimizer.apply_gradients(zip(second, variables))

    two_steps(_gradients(0), _gradients(1))
    assert int(optimizer.iterations.numpy()) == 2
    return variables

  for expected, got in zip(two_steps_with(tf.keras.optimizers.Adam), two_steps_with(FusedAdam)):
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_a_keras_adam_checkpoint_restores_into_fused_adam(tmp_path):
  """Runs checkpointed before FusedAdam resume with their moments."""
  keras_vars, keras_opt, _ = _train(tf.keras.optimizers.Adam)
  path = tf.train.Checkpoint(variables=keras_vars, optimizer=keras_opt).save(
      str(tmp_path / 'ckpt'))
  variables = _variables()
  fused = FusedAdam(learning_rate=1e-2, epsilon=3e-4)
  fused.build(variables)
  tf.train.Checkpoint(variables=variables, optimizer=fused).restore(path).assert_consumed()
  for expected, got in zip(keras_opt.variables, fused.variables):
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_make_agent_builds_fused_adam_for_adam_and_keras_rmsprop_for_rmsprop():
  spec = tensor_spec.TensorSpec([4], tf.float32, 'observation')
  action = tensor_spec.BoundedTensorSpec([], tf.int64, 0, 1, 'action')
  def optimizer(name):
    return make_agent(ts.time_step_spec(spec), action, env_steps=tf.Variable(0, dtype=tf.int64),
                      train_step=tf.Variable(0, dtype=tf.int64), fc_layer_params=(8,),
                      optimizer=name).optimizer
  assert isinstance(optimizer('adam'), FusedAdam)
  assert type(optimizer('rmsprop')) is tf.keras.optimizers.RMSprop  # pylint: disable=unidiomatic-typecheck
