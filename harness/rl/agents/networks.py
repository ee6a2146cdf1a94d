"""Q-networks: an MLP, or a conv stack and an MLP, with a plain or a dueling head."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

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


def _small_uniform() -> tf.keras.initializers.Initializer:
  return tf.keras.initializers.RandomUniform(-0.03, 0.03)


def q_network(observation_spec, action_spec, fc_layer_params: Sequence[int],
               conv_layer_params: Optional[Sequence[Tuple[int, int, int]]],
               dueling: bool = False):
  """An MLP (or Nature-style CNN + MLP) that outputs one Q-value per action."""
  num_actions = int(action_spec.maximum - action_spec.minimum + 1)
  layers = []
  if observation_spec.dtype == tf.uint8:
    # Images are stored as uint8 (4x smaller replay); scale inside the network.
    layers.append(tf.keras.layers.Lambda(lambda x: tf.cast(x, tf.float32) / 255.0))
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
