"""n-step transitions that stop at the end of an episode.

A replay item holds `n + 1` consecutive steps of one env, and may run across an
episode's end (the harness writes an item at every step, so that every step
starts one). tf-agents 0.19's n-step conversion (`to_n_step_transition`) sums
rewards over all n steps and multiplies discounts; that is right while the
episode goes on and at a termination (discount 0 stops the sum), but after a
*truncation* (time limit: discount 1) it adds the next episode's rewards and
bootstraps from a state of another episode (tf-agents marks this as a TODO).

Here the return stops at the first step that ends the episode:

  m = number of transitions before (and including) the first one whose next
      step is LAST, at most n
  G = r_0 + g r_1 + ... + g^(m-1) r_(m-1)
  target = G + g^m * d_(m-1) * Q_target(s_m, argmax Q(s_m))

with d the env's discount of the last transition taken: 0 after a termination
(no bootstrap), 1 after a truncation (bootstrap from the final observation),
1 within the episode. With n = 1 this is exactly tf-agents' own transition.
The result is a tf-agents `Transition` whose `next_time_step.reward` is G and
whose `next_time_step.discount` is g^(m-1) * d_(m-1), the form DqnAgent's loss
expects (it multiplies the discount by gamma once more). Rows whose first step
is an episode's LAST step (the LAST -> FIRST boundary) are masked by the
agent's loss, as in tf-agents.
"""

from __future__ import annotations

import tensorflow as tf
from tf_agents.trajectories import policy_step
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory as trajectory_lib


def n_step_transition(experience: trajectory_lib.Trajectory,
                      gamma: float) -> trajectory_lib.Transition:
  """[B, n + 1] trajectories -> n-step transitions, cut at the episode's end."""
  reward = tf.cast(experience.reward, tf.float32)
  discount = tf.cast(experience.discount, tf.float32)
  steps = reward.shape[1] - 1  # n
  ends = tf.cast(tf.equal(experience.next_step_type[:, :steps], ts.StepType.LAST),
                 tf.float32)  # [B, n]: transition k reaches the episode's last step
  # Transition k is taken while no earlier transition ended the episode.
  taken = tf.math.cumprod(1.0 - ends, axis=1, exclusive=True)  # [B, n]
  m = tf.cast(tf.reduce_sum(taken, axis=1), tf.int32)  # transitions in the return, 1..n
  powers = tf.pow(tf.constant(gamma, tf.float32), tf.range(steps, dtype=tf.float32))
  n_step_return = tf.reduce_sum(taken * powers * reward[:, :steps], axis=1)
  last_discount = tf.gather(discount, m - 1, batch_dims=1)
  final_discount = tf.pow(tf.constant(gamma, tf.float32), tf.cast(m - 1, tf.float32))
  final_discount *= last_discount

  at = lambda tensor, index: tf.gather(tensor, index, batch_dims=1)
  first = tf.zeros_like(m)
  time_step = ts.TimeStep(
      step_type=at(experience.step_type, first),
      reward=tf.zeros_like(n_step_return),  # unknown, as in tf-agents
      discount=tf.zeros_like(final_discount),
      observation=tf.nest.map_structure(lambda o: at(o, first), experience.observation))
  next_time_step = ts.TimeStep(
      step_type=at(experience.step_type, m),
      reward=tf.cast(n_step_return, experience.reward.dtype),
      discount=tf.cast(final_discount, experience.discount.dtype),
      observation=tf.nest.map_structure(lambda o: at(o, m), experience.observation))
  action_step = policy_step.PolicyStep(
      action=tf.nest.map_structure(lambda a: at(a, first), experience.action),
      state=(),
      info=tf.nest.map_structure(lambda i: at(i, first), experience.policy_info))
  return trajectory_lib.Transition(time_step, action_step, next_time_step)
