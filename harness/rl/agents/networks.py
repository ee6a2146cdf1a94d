"""Q-networks: an MLP, or a conv stack and an MLP, with a plain or a dueling head."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
from tf_agents.networks import sequential


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


class _ScaleByMaximum(tf.keras.layers.Layer):
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


def q_network(observation_spec, action_spec, fc_layer_params: Sequence[int],
               conv_layer_params: Optional[Sequence[Tuple[int, int, int]]],
               dueling: bool = False):
  """An MLP (or Nature-style CNN + MLP) that outputs one Q-value per action."""
  num_actions = int(action_spec.maximum - action_spec.minimum + 1)
  layers = []
  if observation_spec.dtype == tf.uint8:
    # uint8 observations keep the replay small; the network casts them to
    # floats in [0, 1] by the spec's maximum: pixels (0..255) are scaled by
    # 1/255, binary grids (MinAtar, 0/1) reach the first layer as 0.0 / 1.0.
    layers.append(_ScaleByMaximum(_uint8_maximum(observation_spec)))
  for filters, kernel, stride in conv_layer_params or ():
    layers.append(tf.keras.layers.Conv2D(filters, kernel, stride, activation='relu'))
  if len(observation_spec.shape) > 1 or conv_layer_params:
    layers.append(tf.keras.layers.Flatten())
  for units in fc_layer_params:
    layers.append(tf.keras.layers.Dense(units, activation='relu'))
  if dueling:
    layers.append(DuelingHead(num_actions))
  else:
    layers.append(tf.keras.layers.Dense(
        num_actions, kernel_initializer=_small_uniform(),
        bias_initializer=tf.keras.initializers.Constant(-0.2)))
  return sequential.Sequential(layers, input_spec=observation_spec, name='QNetwork')
