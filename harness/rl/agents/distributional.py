"""The DQN family beside DDQN: C51, QR-DQN, and the noisy DQN/DDQN, as tf-agents agents.

All of them train on the harness's n-step `Transition`s (harness.rl.nstep) and
act through tf-agents' QPolicy on the expected Q-values
(`networks.QValuesNetwork`), so the epsilon schedule, the compiled or exported
policies, checkpoints and resume work as they do for DDQN. Each returns a
per-sample loss as `td_error`, which prioritized replay turns into priorities.

C51 (Bellemare et al. 2017) is tf-agents' `CategoricalDqnAgent` with its loss
rewritten, because in tf-agents 0.19 that loss
- ignores the importance weights it is given (prioritized replay would be biased),
- returns no per-sample loss (`td_error=()`: no priorities to update),
- does not mask a transition that starts at an episode's LAST step (the
  LAST -> FIRST row that every item-per-step replay holds; DqnAgent masks it),
- picks the next action with the target network (no double-Q), and
- only takes `Trajectory` batches, not the n-step transitions the harness makes.
The projection onto the support is ours (`project_onto_support`, one segment
sum): tf-agents' `project_distribution` gives the same values through tiling
and reshapes at O(BN^2) cost.

QR-DQN (Dabney et al. 2018) is ours: tf-agents 0.19 has none.
"""

from __future__ import annotations

import tensorflow as tf
from tf_agents.agents import tf_agent
from tf_agents.agents.categorical_dqn import categorical_dqn_agent
from tf_agents.agents.dqn import dqn_agent
from tf_agents.networks import utils as network_utils
from tf_agents.policies import boltzmann_policy
from tf_agents.policies import epsilon_greedy_policy
from tf_agents.policies import greedy_policy
from tf_agents.policies import q_policy
from tf_agents.utils import common

from harness.rl.agents.networks import QValuesNetwork

# QR-DQN's Huber threshold (kappa = 1, as the paper's experiments).
QUANTILE_HUBER_KAPPA = 1.0


class _QValuesPolicies:
  """Policies on `QValuesNetwork`s: noise in the collect policy, none in the greedy one.

  Mixed into the agents below in front of tf-agents' agent, whose constructor
  calls `_setup_policy`.
  """

  def _q_values(self, outputs: tf.Tensor) -> tf.Tensor:
    return outputs

  def _setup_policy(self, time_step_spec, action_spec, boltzmann_temperature,
                    emit_log_probability):
    def policy_on(noise: bool) -> q_policy.QPolicy:
      net = QValuesNetwork(self._q_network, self._q_values, noise=noise,
                           name='QValuesNetwork_' + ('noisy' if noise else 'mean'))
      return q_policy.QPolicy(time_step_spec, action_spec, q_network=net,
                              emit_log_probability=emit_log_probability)

    if boltzmann_temperature is not None:
      collect = boltzmann_policy.BoltzmannPolicy(policy_on(True),
                                                 temperature=boltzmann_temperature)
    else:
      collect = epsilon_greedy_policy.EpsilonGreedyPolicy(policy_on(True),
                                                          epsilon=self._epsilon_greedy)
    return greedy_policy.GreedyPolicy(policy_on(False)), collect


class NoisyDdqnAgent(_QValuesPolicies, dqn_agent.DdqnAgent):
  """DDQN with NoisyDense layers: noisy collect policy, noise-free greedy policy and target."""


class NoisyDqnAgent(_QValuesPolicies, dqn_agent.DqnAgent):
  """DQN (no double-Q) with NoisyDense layers."""


class _DistributionalLoss:
  """What the C51 and QR-DQN losses share: the transition, the next action, the masks."""

  _double_q: bool

  def _check_network_output(self, net, label):
    network_utils.check_single_floating_network_output(
        net.create_variables(), expected_output_shape=(self._num_actions, self._num_atoms),
        label=label)

  def _next_action(self, next_time_steps, target_outputs: tf.Tensor) -> tf.Tensor:
    """argmax of the expected Q at the next state: of the online network with
    double-Q (noise-free), of the target network's otherwise."""
    if self._double_q:
      online, _ = self._q_network(next_time_steps.observation,
                                  step_type=next_time_steps.step_type, training=False)
      q_values = self._q_values(online)
    else:
      q_values = self._q_values(target_outputs)
    return tf.argmax(q_values, axis=-1, output_type=tf.int32)

  def _outputs(self, time_steps, next_time_steps, training):
    """The online network's [B, A, N] outputs at the first steps, the target
    network's at the next steps, and the next action."""
    outputs, _ = self._q_network(time_steps.observation, step_type=time_steps.step_type,
                                 training=training)
    target_outputs, _ = self._target_q_network(next_time_steps.observation,
                                               step_type=next_time_steps.step_type,
                                               training=False)
    return outputs, target_outputs, self._next_action(next_time_steps, target_outputs)

  def _distribution_loss(self, time_steps, actions, next_time_steps, gamma,
                         reward_scale_factor, training) -> tf.Tensor:
    raise NotImplementedError

  def _loss(self, experience, td_errors_loss_fn=None, gamma=1.0, reward_scale_factor=1.0,
            weights=None, training=False):
    del td_errors_loss_fn  # the distributional losses are their own
    time_steps, policy_steps, next_time_steps = self._as_transition(experience)
    actions = tf.cast(policy_steps.action, tf.int32)
    with tf.name_scope('loss'):
      per_sample = self._distribution_loss(time_steps, actions, next_time_steps, gamma,
                                           reward_scale_factor, training)
      # A row starting at an episode's LAST step has no transition: masked, as DqnAgent.
      per_sample *= tf.cast(~time_steps.is_last(), tf.float32)
      aggregated = common.aggregate_losses(per_example_loss=per_sample, sample_weight=weights,
                                           regularization_loss=self._q_network.losses)
      return tf_agent.LossInfo(aggregated.total_loss,
                               dqn_agent.DqnLossInfo(td_loss=per_sample, td_error=per_sample))


def _at_action(values: tf.Tensor, actions: tf.Tensor) -> tf.Tensor:
  """[B, A, N] at each row's action -> [B, N]."""
  return tf.gather(values, actions, axis=1, batch_dims=1)


def project_onto_support(target_support: tf.Tensor, probabilities: tf.Tensor,
                         support: tf.Tensor) -> tf.Tensor:
  """C51's projection: [B, N] atoms r + gamma z_j with [B, N] probabilities onto
  the evenly spaced [N] `support` -> [B, N] probabilities.

  Each target atom, clipped to the support's range, lands at a fractional index
  b_j between two support atoms and shares its probability between them in
  proportion to closeness (1 - frac(b_j) to the lower, frac(b_j) to the upper).
  All 2BN shares are summed into place by one segment sum: O(BN) work, where a
  dense [B, N, N] weight tensor (and tf-agents' tiling) costs O(BN^2), about 5x
  the time at 51 atoms and batch 64 on CPU (docs/benchmarks.md, "The DQN family").
  """
  num_atoms = support.shape[0]
  spacing = (support[-1] - support[0]) / (num_atoms - 1)
  position = (tf.clip_by_value(target_support, support[0], support[-1]) - support[0]) / spacing
  lower = tf.floor(position)
  upper_share = position - lower
  lower_index = tf.cast(lower, tf.int32)
  # At the top atom the upper share is 0; clamping keeps its index in range.
  upper_index = tf.minimum(lower_index + 1, num_atoms - 1)
  batch = tf.shape(position)[0]
  row_start = tf.range(batch)[:, None] * num_atoms
  indices = tf.concat([row_start + lower_index, row_start + upper_index], axis=1)
  shares = tf.concat([probabilities * (1.0 - upper_share), probabilities * upper_share], axis=1)
  projected = tf.math.unsorted_segment_sum(tf.reshape(shares, [-1]), tf.reshape(indices, [-1]),
                                           batch * num_atoms)
  return tf.reshape(projected, tf.shape(position))


def softmax(logits: tf.Tensor) -> tf.Tensor:
  """Softmax over the last axis, written out: oneDNN's softmax kernel costs about
  5x these four ops on C51's small [B, A, 51] tensors (measured on this CPU:
  45-70 us against 12 us), and C51 calls it in every policy call and train step."""
  exp = tf.exp(logits - tf.reduce_max(logits, axis=-1, keepdims=True))
  return exp / tf.reduce_sum(exp, axis=-1, keepdims=True)


class C51Agent(_QValuesPolicies, _DistributionalLoss, categorical_dqn_agent.CategoricalDqnAgent):
  """Categorical DQN with importance weights, priorities, masking and optional double-Q."""

  def __init__(self, *args, double_q: bool = True, **kwargs):
    self._double_q = double_q
    super().__init__(*args, **kwargs)

  def _q_values(self, logits: tf.Tensor) -> tf.Tensor:
    return tf.reduce_sum(softmax(logits) * self._support, axis=-1)

  def _distribution_loss(self, time_steps, actions, next_time_steps, gamma,
                         reward_scale_factor, training):
    logits, target_logits, next_action = self._outputs(time_steps, next_time_steps, training)
    next_probabilities = softmax(_at_action(target_logits, next_action))
    reward = reward_scale_factor * tf.cast(next_time_steps.reward, tf.float32)
    discount = gamma * tf.cast(next_time_steps.discount, tf.float32)
    target_support = reward[:, None] + discount[:, None] * self._support[None, :]
    target = tf.stop_gradient(project_onto_support(target_support, next_probabilities,
                                                   self._support))
    return tf.nn.softmax_cross_entropy_with_logits(labels=target,
                                                   logits=_at_action(logits, actions))


def quantile_huber_loss(quantiles: tf.Tensor, targets: tf.Tensor,
                        kappa: float = QUANTILE_HUBER_KAPPA) -> tf.Tensor:
  """QR-DQN's loss per sample: [B, N] predicted quantiles, [B, N'] target samples -> [B].

  rho_tau(u) = |tau - 1{u < 0}| * Huber_kappa(u) / kappa, u = target_j - quantile_i,
  tau_i = (2i + 1) / 2N (the quantile midpoints); summed over i, averaged over j.
  The targets get no gradient (they are the bootstrap).

  The gradient is written by hand, d rho / d quantile_i = -mean_j(w_ij clip(u_ij,
  -kappa, kappa)) / kappa: autodiff through the [B, N, N'] Huber and weight ops
  makes about three times the elementwise work (measured on CartPole's batch of
  64 at 25 quantiles: 585 -> 210 us for loss and gradient).
  """
  num_quantiles = quantiles.shape[-1]
  num_targets = targets.shape[-1]
  tau = (tf.range(num_quantiles, dtype=tf.float32) + 0.5) / num_quantiles
  targets = tf.stop_gradient(targets)

  @tf.custom_gradient
  def loss(predicted):
    u = targets[:, None, :] - predicted[:, :, None]  # [B, N, N']
    abs_u = tf.abs(u)
    capped = tf.minimum(abs_u, kappa)
    huber = capped * (abs_u - 0.5 * capped)  # 0.5 u^2 inside kappa, linear outside
    weight = tf.where(u < 0.0, 1.0 - tau[None, :, None], tau[None, :, None])

    def gradient(upstream):
      slope = weight * tf.clip_by_value(u, -kappa, kappa)
      return -upstream[:, None] * tf.reduce_sum(slope, axis=2) / (kappa * num_targets)

    value = tf.reduce_sum(weight * huber, axis=[1, 2]) / (kappa * num_targets)
    return value, gradient

  return loss(quantiles)


class QrDqnAgent(_QValuesPolicies, _DistributionalLoss, dqn_agent.DqnAgent):
  """QR-DQN: `num_quantiles` quantiles per action, the quantile Huber loss, optional double-Q."""

  def __init__(self, *args, num_quantiles: int, double_q: bool = True, **kwargs):
    self._num_atoms = num_quantiles
    self._double_q = double_q
    super().__init__(*args, **kwargs)

  @property
  def num_quantiles(self) -> int:
    return self._num_atoms

  def _q_values(self, quantiles: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(quantiles, axis=-1)

  def _distribution_loss(self, time_steps, actions, next_time_steps, gamma,
                         reward_scale_factor, training):
    quantiles, target_quantiles, next_action = self._outputs(time_steps, next_time_steps,
                                                             training)
    reward = reward_scale_factor * tf.cast(next_time_steps.reward, tf.float32)
    discount = gamma * tf.cast(next_time_steps.discount, tf.float32)
    targets = tf.stop_gradient(reward[:, None] + discount[:, None]
                               * _at_action(target_quantiles, next_action))
    return quantile_huber_loss(_at_action(quantiles, actions), targets)
