"""NoisyDense: a dense layer with learned, factorised Gaussian weight noise.

Fortunato et al. 2017 ("Noisy Networks for Exploration"), factorised form:
w = mu_w + sigma_w * (f(eps_in) outer f(eps_out)), b = mu_b + sigma_b * f(eps_out),
f(x) = sign(x) * sqrt(|x|), eps ~ N(0, 1) drawn afresh on every call inside the
graph (a stateful random op: no retrace, new noise each time). mu starts
uniform in +-1/sqrt(inputs), sigma at sigma0/sqrt(inputs); the paper's
sigma0 = 0.5 is the default (`make_agent.noisy_sigma0`).

Noise is on only when the layer is called with `training=True`: the harness's
collect policy and the loss's online forward pass call it so; the greedy
policy (evaluation, best_policy, the exported greedy policy) and the target
network call it without, and see the mean weights.
"""

from __future__ import annotations

import math
from typing import Optional

import tensorflow as tf

# The paper's initial noise scale for factorised noise.
DEFAULT_SIGMA0 = 0.5


def _scaled_noise(size: int) -> tf.Tensor:
  noise = tf.random.normal([size])
  return tf.sign(noise) * tf.sqrt(tf.abs(noise))


class NoisyDense(tf.keras.layers.Layer):
  """A Dense layer whose weights carry learned factorised Gaussian noise."""

  def __init__(self, units: int, sigma0: float = DEFAULT_SIGMA0,
               activation: Optional[str] = None, **kwargs):
    super().__init__(**kwargs)
    self.units = int(units)
    self.sigma0 = float(sigma0)
    self.activation = tf.keras.activations.get(activation)

  def build(self, input_shape) -> None:
    inputs = int(input_shape[-1])
    bound = 1.0 / math.sqrt(inputs)
    uniform = lambda: tf.keras.initializers.RandomUniform(-bound, bound)  # one per weight
    sigma = tf.keras.initializers.Constant(self.sigma0 / math.sqrt(inputs))
    self.kernel_mu = self.add_weight('kernel_mu', [inputs, self.units], initializer=uniform())
    self.kernel_sigma = self.add_weight('kernel_sigma', [inputs, self.units], initializer=sigma)
    self.bias_mu = self.add_weight('bias_mu', [self.units], initializer=uniform())
    self.bias_sigma = self.add_weight('bias_sigma', [self.units], initializer=sigma)
    super().build(input_shape)

  def call(self, inputs: tf.Tensor, training: Optional[bool] = None) -> tf.Tensor:
    if not training:
      return self.activation(tf.matmul(inputs, self.kernel_mu) + self.bias_mu)
    noise_in = _scaled_noise(self.kernel_mu.shape[0])
    noise_out = _scaled_noise(self.units)
    # x (mu + sigma * outer(in, out)) = x mu + ((x * in) sigma) * out: no [in, out] noise matrix.
    noisy = tf.matmul(inputs * noise_in, self.kernel_sigma) * noise_out
    bias = self.bias_mu + self.bias_sigma * noise_out
    return self.activation(tf.matmul(inputs, self.kernel_mu) + noisy + bias)

  def get_config(self) -> dict:
    return {**super().get_config(), 'units': self.units, 'sigma0': self.sigma0,
            'activation': tf.keras.activations.serialize(self.activation)}
