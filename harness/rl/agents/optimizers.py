"""Adam as Keras computes it, in TensorFlow's fused kernel: one op per variable.

Keras 2.15's Adam writes its update as about twenty small ops per variable
(casts, powers, the moment updates, the step) and compiles them with XLA only
when a GPU is present. On the CPU each of those ops is a separate kernel
launch and a separate pass over the variable. `ResourceApplyAdam` computes the
same update in one pass, which took 8-9 % off CartPole's gradient steps and
17 % off the bfloat16 Breakout step (docs/performance.md, "The optimizer"):

    m <- beta_1 m + (1 - beta_1) g
    v <- beta_2 v + (1 - beta_2) g^2
    w <- w - lr sqrt(1 - beta_2^t) / (1 - beta_1^t) m / (sqrt(v) + epsilon)

which is Keras' dense update written out. The optimizer's variables are
Keras' own (the same `m` and `v` slots, the same `iterations` and
`learning_rate`), so checkpoints written before this class restore into it
and `learning_rate.assign` still sets the live rate.
"""

from __future__ import annotations

from typing import Optional, Tuple

import tensorflow as tf


class FusedAdam(tf.keras.optimizers.Adam):
  """`tf.keras.optimizers.Adam` with its dense update in `ResourceApplyAdam`.

  Sparse gradients and AMSGrad keep Keras' own update.
  """

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    # (graph, dtype, scalars) of the step being built: the learning rate and
    # the bias corrections are read once per step, not once per variable.
    self._step_scalars_cache: Optional[tuple] = None

  def apply_gradients(self, grads_and_vars, *args, **kwargs):
    # The scalars serve one step only: two steps built in one graph (unrolled
    # by hand) must each read `iterations` and the rate afresh.
    try:
      return super().apply_gradients(grads_and_vars, *args, **kwargs)
    finally:
      self._step_scalars_cache = None

  def _step_scalars(self, dtype: tf.DType) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """lr, beta_1^t and beta_2^t of the update being built (t = iterations + 1).

    Every variable's update of one step is built in the same graph before
    `iterations` is incremented, so one read serves them all (the cache lives
    for one `apply_gradients`). Eagerly they are computed per variable.
    """
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    cached = self._step_scalars_cache
    if graph is not None and cached is not None and cached[0] is graph and cached[1] == dtype:
      return cached[2]
    local_step = tf.cast(self.iterations + 1, dtype)
    scalars = (tf.cast(self.learning_rate, dtype),
               tf.pow(tf.cast(self.beta_1, dtype), local_step),
               tf.pow(tf.cast(self.beta_2, dtype), local_step))
    if graph is not None:
      self._step_scalars_cache = (graph, dtype, scalars)
    return scalars

  def update_step(self, gradient, variable):
    if isinstance(gradient, tf.IndexedSlices) or self.amsgrad:
      return super().update_step(gradient, variable)
    dtype = variable.dtype
    lr, beta_1_power, beta_2_power = self._step_scalars(dtype)
    index = self._index_dict[self._var_key(variable)]
    return tf.raw_ops.ResourceApplyAdam(
        var=variable.handle, m=self._momentums[index].handle,
        v=self._velocities[index].handle, beta1_power=beta_1_power,
        beta2_power=beta_2_power, lr=lr, beta1=tf.cast(self.beta_1, dtype),
        beta2=tf.cast(self.beta_2, dtype), epsilon=tf.cast(self.epsilon, dtype),
        grad=gradient, use_locking=False)
