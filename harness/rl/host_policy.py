"""Actions of the harness's MLP Q-networks computed in numpy, without a TensorFlow call.

Collection and evaluation ask the policy for actions once per (batched) env
step. Every call of a compiled TensorFlow function costs 0.4 to 0.5 ms on our
2-core machines whatever it computes (a function that adds 1 to a 4 x 4 tensor
included; docs/benchmarks.md), while a (256, 256) MLP on a batch of four
observations is a few tens of microseconds in numpy. A CartPole run makes
about 23,500 policy calls, a one-env MountainCar run 120,000: there the TF call
alone was a tenth to a fifth of the run. TF-Agents has no host-side policy, so
this one is ours, and only for what it can check it computes as the network
does: the networks `harness.rl.agents` builds from Dense layers (a plain or a dueling
head) and small 'valid' ReLU convolutions, on float observations or uint8 ones
that the network scales by their maximum (MinAtar's 0/1 grids). Layers that
compute in bfloat16 (`make_agent.compute_dtype`) keep float32 weights; numpy
computes them in float32, the function those weights define, which the
bfloat16 graph rounds (Q-values within about 1 % of it; an argmax can differ
only where two actions' Q-values are that close).
On MinAtar four policy calls per 16 frames were half the acting thread's time
(py-spy), nearly all of it TF's per-call cost. Anything else, and networks of
more than `MAX_MULTIPLY_ADDS` per observation (the Nature CNN on Atari frames:
numpy's convolution there took 27 ms a batch of four against TF's 4 ms), keeps
the compiled TensorFlow policy (`harness.rl.collect.CompiledPolicy`).

The weights are copied from the network's variables by `refresh()`, which the
collector and the evaluation call before each run of steps (the training calls
happen between those runs, never during one); the collect epsilon is read
there too, as the TF policy would read it (the env-step counter that drives its
decay moves only between runs).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
import tensorflow as tf
from tf_agents.policies import epsilon_greedy_policy
from tf_agents.policies import greedy_policy
from tf_agents.policies import py_policy
from tf_agents.policies import q_policy
from tf_agents.policies import tf_policy
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import policy_step

from harness.base import host_calls
from harness.rl import agents

_EXPLORATION_STREAM = 0x51DE  # any constant other than what gymnasium adds

# Multiply-adds per observation above which the compiled policy is faster here
# (2 cores, a batch of four, timed beside a soak): MinAtar's network is about
# 0.2M (numpy 0.12 ms, TF 0.8-1.1 ms a call), a two-conv net on 42x42 frames
# 1.1M (numpy 1.8 ms, TF 1.5 ms), the Nature CNN on 84x84 frames 9M (numpy
# 27 ms, TF 4 ms).
MAX_MULTIPLY_ADDS = 500_000


# One step of the forward pass: x -> y, with the weights read by `refresh`:
# (kind, variables, params) of kinds 'scale' (uint8 -> float; params: the
# maximum), 'conv' (ReLU; params: the strides), 'flatten', 'relu', 'linear',
# 'dueling' (params: empty).
_Layer = Tuple[str, List[tf.Variable], Tuple[int, ...]]


def _layers_of(q_network) -> Optional[List[_Layer]]:
  """The network's layers as `_Layer`s, or None if a layer is of a kind this
  module does not compute."""
  plan = []
  for index, layer in enumerate(getattr(q_network, 'layers', ())):
    if isinstance(layer, agents.DuelingHead):
      value, advantage = layer._value, layer._advantage  # pylint: disable=protected-access
      if not all(_is_plain_dense(d, 'linear') for d in (value, advantage)):
        return None
      plan.append(('dueling', [value.kernel, value.bias, advantage.kernel, advantage.bias], ()))
    elif _is_plain_dense(layer, 'relu'):
      plan.append(('relu', [layer.kernel, layer.bias], ()))
    elif _is_plain_dense(layer, 'linear'):
      plan.append(('linear', [layer.kernel, layer.bias], ()))
    elif _is_plain_conv(layer):
      plan.append(('conv', [layer.kernel, layer.bias], tuple(layer.strides)))
    elif type(layer) is tf.keras.layers.Flatten:  # pylint: disable=unidiomatic-typecheck
      plan.append(('flatten', [], ()))
    elif type(layer) is agents.ScaleByMaximum and index == 0:  # pylint: disable=unidiomatic-typecheck
      plan.append(('scale', [], (layer.maximum,)))
    else:
      return None
  return plan or None


def _has_float32_weights(layer) -> bool:
  """float32 weights, computed in float32 or (mixed_bfloat16) in bfloat16: numpy
  computes both in float32, so a bfloat16 run of a small network does not pay
  TensorFlow's per-call cost for each action (0.8-1.1 ms against 0.12 ms on MinAtar)."""
  return layer.variable_dtype == 'float32' and layer.compute_dtype in ('float32', 'bfloat16')


def _is_plain_dense(layer, activation: str) -> bool:
  return (type(layer) is tf.keras.layers.Dense  # pylint: disable=unidiomatic-typecheck
          and _has_float32_weights(layer) and layer.use_bias
          and layer.activation is getattr(tf.keras.activations, activation))


def _is_plain_conv(layer) -> bool:
  return (type(layer) is tf.keras.layers.Conv2D  # pylint: disable=unidiomatic-typecheck
          and _has_float32_weights(layer) and layer.use_bias
          and layer.activation is tf.keras.activations.relu and layer.padding == 'valid'
          and layer.data_format == 'channels_last' and tuple(layer.dilation_rate) == (1, 1)
          and layer.groups == 1)


def _reads_images(plan: List[_Layer]) -> bool:
  """Whether the network reads observations as images (it has a convolution);
  an MLP reads them flattened (the networks have no Flatten layer for vector
  observations)."""
  return any(kind == 'conv' for kind, _, _ in plan)


def _multiply_adds(plan: List[_Layer], observation_shape: Sequence[int]) -> int:
  """Multiply-adds of one observation's forward pass."""
  shape, total = tuple(observation_shape), 0
  if not _reads_images(plan):
    shape = (int(np.prod(shape)),)
  for kind, variables, params in plan:
    if kind == 'conv':
      kh, kw, channels, filters = variables[0].shape
      shape = ((shape[0] - kh) // params[0] + 1, (shape[1] - kw) // params[1] + 1, filters)
      total += shape[0] * shape[1] * kh * kw * channels * filters
    elif kind == 'flatten':
      shape = (int(np.prod(shape)),)
    elif kind in ('relu', 'linear', 'dueling'):
      for kernel in variables[::2]:
        total += int(np.prod(kernel.shape))
      shape = (int(variables[-2].shape[-1]),)
  return total


def _conv_relu(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray,
               strides: Tuple[int, int]) -> np.ndarray:
  """Keras' Conv2D with 'valid' padding and ReLU: [B, H, W, C] -> [B, H', W', F]."""
  windows = sliding_window_view(x, kernel.shape[:2], axis=(1, 2))  # [B, H-kh+1, W-kw+1, C, kh, kw]
  windows = windows[:, ::strides[0], ::strides[1]]
  return np.maximum(np.tensordot(windows, kernel, axes=([4, 5, 3], [0, 1, 2])) + bias, 0.0)


class HostQPolicy(py_policy.PyPolicy):
  """Greedy or epsilon-greedy actions of a Q-network, computed in numpy.

  Build it with `for_tf_policy`, which checks that the network is one this
  class computes. Observations come in as the env gives them: a batch
  ([B, ...]) from a batched env, one observation otherwise.
  """

  def __init__(self, policy: tf_policy.TFPolicy, plan: List[_Layer],
               epsilon: Optional[Callable[[], tf.Tensor]], batched: bool, seed: int):
    super().__init__(tensor_spec.to_array_spec(policy.time_step_spec),
                     tensor_spec.to_array_spec(policy.action_spec))
    self._kinds = [(kind, params) for kind, _, params in plan]
    self._flatten_input = not _reads_images(plan)
    variables = [list(layer_variables) for _, layer_variables, _ in plan]
    zero = lambda: tf.constant(0.0)
    # One traced call reads every weight and the epsilon: eagerly, reading six
    # variables and computing the epsilon schedule took 2 ms per refresh here
    # (0.2 ms in one call), paid every 16 env steps on MountainCar.
    # A HostCall hands them over as numpy: no EagerTensor per weight (each one
    # leaks ~48 bytes in TF 2.15 on Python 3.11, and a refresh comes every
    # iteration).
    self._read = host_calls.HostCall(
        lambda: ([[v.read_value() for v in vs] for vs in variables],
                 tf.cast((epsilon or zero)(), tf.float32)), name='host_policy_weights')
    self._batched = batched
    spec = policy.action_spec
    self._num_actions = int(spec.maximum) - int(spec.minimum) + 1
    self._action_dtype = spec.dtype.as_numpy_dtype
    # A stream of its own: gymnasium seeds its envs with default_rng(seed) too,
    # and the same draws for env starts and exploration would correlate them.
    self._rng = np.random.default_rng([seed, _EXPLORATION_STREAM])
    self._weights: List[Tuple[Tuple[str, Tuple[int, ...]], List[np.ndarray]]] = []
    self.epsilon = 0.0
    self.refresh()

  def refresh(self) -> None:
    """Copies the network's current weights (and the epsilon) for the next steps."""
    weights, epsilon = self._read()
    self._weights = [(kind, list(layer)) for kind, layer in zip(self._kinds, weights)]
    self.epsilon = float(epsilon)

  def q_values(self, observation: np.ndarray) -> np.ndarray:
    """[B, num_actions] Q-values of a batch of observations."""
    x = np.asarray(observation)
    if self._flatten_input:
      x = x.reshape(len(x), -1)
    x = x.astype(np.float32, copy=False)
    for (kind, params), w in self._weights:
      if kind == 'scale':
        x = x if params[0] == 1 else x / np.float32(params[0])
      elif kind == 'conv':
        x = _conv_relu(x, w[0], w[1], params)
      elif kind == 'flatten':
        x = x.reshape(len(x), -1)
      elif kind == 'relu':
        x = np.maximum(x @ w[0] + w[1], 0.0)
      elif kind == 'linear':
        x = x @ w[0] + w[1]
      else:  # dueling: V + A - mean(A), as agents.DuelingHead
        advantage = x @ w[2] + w[3]
        x = (x @ w[0] + w[1]) + advantage - advantage.mean(axis=-1, keepdims=True)
    return x

  def _action(self, time_step, policy_state, seed=None):
    del seed  # the generator is seeded once, at construction
    observation = time_step.observation
    if not self._batched:
      observation = observation[None]
    action = np.argmax(self.q_values(observation), axis=-1)
    if self.epsilon > 0.0:
      explore = self._rng.random(len(action)) < self.epsilon
      if explore.any():  # most steps once epsilon is small; a draw costs 30 us here
        action = np.where(explore, self._rng.integers(self._num_actions, size=len(action)),
                          action)
    action = action.astype(self._action_dtype)
    return policy_step.PolicyStep(action if self._batched else action[0], policy_state, ())

  def trace_count(self) -> int:
    """Nothing is traced: actions never enter TensorFlow."""
    return 0


def for_tf_policy(policy: tf_policy.TFPolicy, batched: bool,
                  seed: int) -> Optional[HostQPolicy]:
  """The numpy twin of a DQN greedy or epsilon-greedy policy, or None where the
  network or the policy is one it does not compute.

  Reads the structure of tf-agents 0.19's policies (EpsilonGreedyPolicy wraps a
  GreedyPolicy wrapping a QPolicy): a change there gives None, not a wrong policy.
  """
  epsilon = None
  if isinstance(policy, epsilon_greedy_policy.EpsilonGreedyPolicy):
    epsilon = policy._epsilon  # pylint: disable=protected-access
    if policy._exploration_mask is not None:  # pylint: disable=protected-access
      return None
    policy = policy._greedy_policy  # pylint: disable=protected-access
  if not isinstance(policy, greedy_policy.GreedyPolicy):
    return None
  inner = policy.wrapped_policy
  if (type(inner) is not q_policy.QPolicy  # pylint: disable=unidiomatic-typecheck
      or inner._observation_and_action_constraint_splitter is not None  # pylint: disable=protected-access
      or inner.info_spec != () or inner.policy_state_spec != ()):  # pylint: disable=g-explicit-bool-comparison
    return None
  observation_spec = inner.time_step_spec.observation
  if not isinstance(observation_spec, tf.TensorSpec):
    return None
  plan = _layers_of(inner._q_network)  # pylint: disable=protected-access
  if plan is None or _multiply_adds(plan, observation_spec.shape) > MAX_MULTIPLY_ADDS:
    return None
  # uint8 observations only where the network scales them first, as it does.
  if not (observation_spec.dtype.is_floating or
          (observation_spec.dtype == tf.uint8 and plan[0][0] == 'scale')):
    return None
  if epsilon is not None and not callable(epsilon):
    constant = float(epsilon)
    epsilon = lambda: constant
  return HostQPolicy(inner, plan, epsilon, batched, seed)
