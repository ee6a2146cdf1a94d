"""Q-networks: an MLP, or a conv stack and an MLP, with a plain or a dueling head.

The same builder makes the distributional agents' networks (one output per
action and atom or quantile) and the noisy ones (NoisyDense for every dense
layer). `QValuesNetwork` turns any of them into the [batch, actions] Q-values
that tf-agents' QPolicy acts on.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tf_agents.networks import network
from tf_agents.networks import sequential

from harness.rl.agents.noisy import NoisyDense

# `make_agent.compute_dtype` values: the dtype the conv and hidden dense layers
# compute in (their weights stay float32; heads, targets and losses are float32).
COMPUTE_DTYPES = ('float32', 'bfloat16')


class DuelingHead(tf.keras.layers.Layer):
  """Q = V + A - mean(A): a value stream and an advantage stream (Wang et al., 2016).

  The value of a state is learned from every action taken in it, which steadies
  the Q-values of actions that are rarely taken.
  """

  def __init__(self, num_actions: int, **kwargs):
    super().__init__(**kwargs)
    self._value = tf.keras.layers.Dense(1, kernel_initializer=_small_uniform())
    self._advantage = tf.keras.layers.Dense(num_actions, kernel_initializer=_small_uniform())

  def call(self, inputs: tf.Tensor) -> tf.Tensor:
    advantage = self._advantage(inputs)
    return self._value(inputs) + advantage - tf.reduce_mean(advantage, axis=-1, keepdims=True)


class ScaleByMaximum(tf.keras.layers.Layer):
  """uint8 -> float32 in [0, 1]: x / maximum (a plain cast when the maximum is 1)."""

  def __init__(self, maximum: int, **kwargs):
    super().__init__(**kwargs)
    self.maximum = maximum

  def call(self, inputs: tf.Tensor) -> tf.Tensor:
    floats = tf.cast(inputs, tf.float32)
    return floats if self.maximum == 1 else floats / float(self.maximum)

  def get_config(self) -> dict:
    return {**super().get_config(), 'maximum': self.maximum}


def _uint8_maximum(observation_spec) -> int:
  """The largest value a uint8 observation takes: its bound, or 255 unbounded."""
  maximum = getattr(observation_spec, 'maximum', None)
  if maximum is None:
    return 255
  values = np.unique(np.asarray(maximum))
  if values.size != 1 or not 1 <= values[0] <= 255:
    return 255
  return int(values[0])


def _small_uniform() -> tf.keras.initializers.Initializer:
  return tf.keras.initializers.RandomUniform(-0.03, 0.03)


class QHead(tf.keras.layers.Layer):
  """The output layer of the distributional or noisy networks.

  [batch, features] -> [batch, actions] (num_atoms None) or
  [batch, actions, num_atoms] (C51's logits, QR-DQN's quantiles). Dueling: a value
  stream and an advantage stream per atom, V + A - mean over actions of A,
  combined before any softmax (as Rainbow). Dense layers are NoisyDense when
  `noisy_sigma0` is given.
  """

  def __init__(self, num_actions: int, num_atoms: Optional[int] = None, dueling: bool = False,
               noisy_sigma0: Optional[float] = None, **kwargs):
    super().__init__(**kwargs)
    self.num_actions, self.num_atoms = num_actions, num_atoms
    self.dueling, self.noisy_sigma0 = dueling, noisy_sigma0
    atoms = num_atoms or 1
    self._advantage = _dense(num_actions * atoms, noisy_sigma0, None, head=True)
    self._value = _dense(atoms, noisy_sigma0, None, head=True) if dueling else None

  def call(self, inputs: tf.Tensor, training: Optional[bool] = None) -> tf.Tensor:
    atoms = self.num_atoms or 1
    out = tf.reshape(self._advantage(inputs, training=training), [-1, self.num_actions, atoms])
    if self._value is not None:
      value = tf.reshape(self._value(inputs, training=training), [-1, 1, atoms])
      out = value + out - tf.reduce_mean(out, axis=1, keepdims=True)
    return out if self.num_atoms else out[..., 0]

  def get_config(self) -> dict:
    return {**super().get_config(), 'num_actions': self.num_actions,
            'num_atoms': self.num_atoms, 'dueling': self.dueling,
            'noisy_sigma0': self.noisy_sigma0}


def _dense(units: int, noisy_sigma0: Optional[float], activation: Optional[str],
           head: bool = False, dtype=None) -> tf.keras.layers.Layer:
  if noisy_sigma0 is not None:
    return NoisyDense(units, sigma0=noisy_sigma0, activation=activation)
  if head:
    return tf.keras.layers.Dense(units, activation=activation,
                                 kernel_initializer=_small_uniform())
  return tf.keras.layers.Dense(units, activation=activation, dtype=dtype)


def _layer_policy(compute_dtype: str) -> Optional[tf.keras.mixed_precision.Policy]:
  """The Keras dtype policy of the conv and hidden dense layers: None (float32)
  or mixed_bfloat16 (bfloat16 math on float32 weights, which keeps checkpoints
  and the optimizer's state in float32)."""
  if compute_dtype not in COMPUTE_DTYPES:
    raise ValueError(f'compute_dtype must be one of {COMPUTE_DTYPES}, got {compute_dtype!r}')
  return None if compute_dtype == 'float32' else tf.keras.mixed_precision.Policy('mixed_bfloat16')


class QValuesNetwork(network.Network):
  """[batch, actions] Q-values of a network with more outputs, for tf-agents' QPolicy.

  `q_values` reduces the wrapped network's output (the expectation over C51's
  atoms, the mean of QR-DQN's quantiles, the identity for plain Q-values). With
  `noise=True` the wrapped network runs as in training (NoisyDense layers draw
  noise): the collect policy's view. With `noise=False` the greedy one.
  The wrapped network's variables are shared, not copied.
  """

  def __init__(self, wrapped: network.Network, q_values: Callable[[tf.Tensor], tf.Tensor],
               noise: bool, name: str = 'QValuesNetwork'):
    super().__init__(input_tensor_spec=wrapped.input_tensor_spec, state_spec=(), name=name)
    self._wrapped = wrapped
    self._q_values = q_values
    self._noise = noise

  def call(self, observation, step_type=None, network_state=(), training=False):
    del training  # the policy's own view decides the noise
    out, _ = self._wrapped(observation, step_type=step_type, network_state=network_state,
                           training=self._noise)
    return self._q_values(out), network_state


def q_network(observation_spec, action_spec, fc_layer_params: Sequence[int],
              conv_layer_params: Optional[Sequence[Tuple[int, int, int]]],
              dueling: bool = False, num_atoms: Optional[int] = None,
              noisy_sigma0: Optional[float] = None, compute_dtype: str = 'float32'):
  """An MLP (or Nature-style CNN + MLP) with one output per action (and per atom
  or quantile when `num_atoms` is given); its dense layers noisy with `noisy_sigma0`.

  With compute_dtype='bfloat16' the conv layers and the plain hidden dense layers
  compute in bfloat16; the output layer (Keras casts its input back) and noisy
  layers compute in float32, so Q-values, targets and losses are float32.
  """
  num_actions = int(action_spec.maximum - action_spec.minimum + 1)
  policy = _layer_policy(compute_dtype)
  layers = []
  if observation_spec.dtype == tf.uint8:
    # uint8 observations keep the replay small; the network casts them to
    # floats in [0, 1] by the spec's maximum: pixels (0..255) are scaled by
    # 1/255, binary grids (MinAtar, 0/1) reach the first layer as 0.0 / 1.0.
    layers.append(ScaleByMaximum(_uint8_maximum(observation_spec)))
  for filters, kernel, stride in conv_layer_params or ():
    layers.append(tf.keras.layers.Conv2D(filters, kernel, stride, activation='relu',
                                         dtype=policy))
  if len(observation_spec.shape) > 1 or conv_layer_params:
    # In the layers' dtype, so bfloat16 features are not cast to float32 and back.
    layers.append(tf.keras.layers.Flatten(dtype=policy))
  if num_atoms is not None or noisy_sigma0 is not None:
    for units in fc_layer_params:
      layers.append(_dense(units, noisy_sigma0, 'relu', dtype=policy))
    layers.append(QHead(num_actions, num_atoms, dueling, noisy_sigma0))
    return sequential.Sequential(layers, input_spec=observation_spec, name='QNetwork')
  # DDQN without noise: the layers the numpy host policy computes (harness.rl.host_policy).
  for units in fc_layer_params:
    layers.append(tf.keras.layers.Dense(units, activation='relu', dtype=policy))
  if dueling:
    layers.append(DuelingHead(num_actions))
  else:
    layers.append(tf.keras.layers.Dense(
        num_actions, kernel_initializer=_small_uniform(),
        bias_initializer=tf.keras.initializers.Constant(-0.2)))
  return sequential.Sequential(layers, input_spec=observation_spec, name='QNetwork')
