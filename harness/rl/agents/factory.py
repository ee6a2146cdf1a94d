"""`make_agent`: the agent of a run, its settings' checks, and `BuiltAgent`."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence, Tuple

import gin
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.trajectories import time_step as ts
from tf_agents.utils import common

from harness.base.errors import UsageError
from harness.rl.agents import networks
from harness.rl.agents.schedules import LinearSchedule


_LOSSES = {'huber': common.element_wise_huber_loss,
           'mse': common.element_wise_squared_loss}
# `make_agent.optimizer` values.
OPTIMIZERS = ('adam', 'rmsprop')


@dataclasses.dataclass
class BuiltAgent:
  """A DdqnAgent with the pieces the harness drives, so nothing reaches into privates.

  Attributes:
    agent: the tf-agents DdqnAgent.
    optimizer: its optimizer (Adam or centred RMSProp); `optimizer.learning_rate` is the live variable.
    epsilon: the collect epsilon schedule (variables, read inside the policy graph).
    learning_rate_schedule: the learning rate over env steps; the compiled
      train step copies it into the optimizer before each gradient step.
    n_step_update: n of the n-step TD target.
    gamma: the discount factor.
  """
  agent: dqn_agent.DdqnAgent
  optimizer: tf.keras.optimizers.Optimizer
  epsilon: LinearSchedule
  learning_rate_schedule: LinearSchedule
  n_step_update: int
  gamma: float

  @property
  def sequence_length(self) -> int:
    """Steps per replay item: n_step_update + 1."""
    return self.n_step_update + 1

  @property
  def learning_rate(self) -> tf.Variable:
    """The optimizer's live learning-rate variable: the value the last step used."""
    return self.optimizer.learning_rate

  def schedules(self) -> Dict[str, LinearSchedule]:
    """The settings held in variables, which a resume sets back to this launch's
    values (`SCHEDULE_BINDINGS` names their bindings)."""
    return {'epsilon': self.epsilon, 'learning_rate': self.learning_rate_schedule}

  def update_learning_rate(self) -> None:
    """Copies the scheduled learning rate into the optimizer (in graph or eagerly)."""
    self.optimizer.learning_rate.assign(self.learning_rate_schedule())


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_settings(epsilon_greedy: float = 0.1, epsilon_start: float = 1.0,
                   epsilon_decay_steps: int = 0, learning_rate: float = 1e-3,
                   learning_rate_final: Optional[float] = None,
                   learning_rate_decay_steps: int = 0,
                   n_step_update: int = 1, td_errors_loss_fn: str = 'huber',
                   optimizer: str = 'adam', rmsprop_rho: float = 0.95,
                   rmsprop_epsilon: float = 1e-4) -> None:
  """The one home of the checks on `make_agent` values; raises `UsageError`.

  `harness-train` calls it with the bound values before anything is built, and
  `make_agent` calls it again with what it was given.
  """
  for name, value in (('epsilon_greedy', epsilon_greedy), ('epsilon_start', epsilon_start)):
    if not _is_number(value) or not 0.0 <= value <= 1.0:
      raise UsageError(f'make_agent.{name}={value!r} is outside [0, 1]: epsilon is a '
                       'probability, e.g. make_agent.epsilon_greedy=0.05')
  if not _is_number(learning_rate) or learning_rate <= 0:
    raise UsageError(f'make_agent.learning_rate={learning_rate!r} must be a positive number, '
                     'e.g. 1e-3')
  if learning_rate_final is not None and (not _is_number(learning_rate_final)
                                          or learning_rate_final < 0):
    raise UsageError(f'make_agent.learning_rate_final={learning_rate_final!r} must be a '
                     'number >= 0, or None for a constant learning rate')
  if not isinstance(learning_rate_decay_steps, int) or learning_rate_decay_steps < 0:
    raise UsageError(f'make_agent.learning_rate_decay_steps={learning_rate_decay_steps!r} '
                     'must be an integer >= 0 (0 means a constant learning rate)')
  if not isinstance(n_step_update, int) or n_step_update < 1:
    raise UsageError(f'make_agent.n_step_update={n_step_update!r} must be an integer >= 1')
  if not isinstance(epsilon_decay_steps, int) or epsilon_decay_steps < 0:
    raise UsageError(f'make_agent.epsilon_decay_steps={epsilon_decay_steps!r} must be an '
                     'integer >= 0 (0 means a constant epsilon_greedy)')
  if td_errors_loss_fn not in _LOSSES:
    raise UsageError(f'make_agent.td_errors_loss_fn={td_errors_loss_fn!r} is unknown: '
                     f'use one of {sorted(_LOSSES)}')
  if optimizer not in OPTIMIZERS:
    raise UsageError(f'make_agent.optimizer={optimizer!r} is unknown: use one of '
                     f'{list(OPTIMIZERS)}')
  if not _is_number(rmsprop_rho) or not 0.0 < rmsprop_rho < 1.0:
    raise UsageError(f'make_agent.rmsprop_rho={rmsprop_rho!r} must be in (0, 1), e.g. 0.95')
  if not _is_number(rmsprop_epsilon) or rmsprop_epsilon <= 0:
    raise UsageError(f'make_agent.rmsprop_epsilon={rmsprop_epsilon!r} must be a positive '
                     'number, e.g. 1e-4')


@gin.configurable
def make_agent(time_step_spec: ts.TimeStep,
               action_spec,
               train_step: tf.Variable,
               env_steps: tf.Variable,
               fc_layer_params: Sequence[int] = (100,),
               conv_layer_params: Optional[Sequence[Tuple[int, int, int]]] = None,
               learning_rate: float = 1e-3,
               learning_rate_final: Optional[float] = None,
               learning_rate_decay_steps: int = 0,
               adam_epsilon: float = 1e-7,
               optimizer: str = 'adam',
               rmsprop_rho: float = 0.95,
               rmsprop_epsilon: float = 1e-4,
               gamma: float = 0.99,
               n_step_update: int = 1,
               dueling: bool = False,
               target_update_tau: float = 1.0,
               target_update_period: int = 100,
               gradient_clipping: Optional[float] = None,
               td_errors_loss_fn: str = 'huber',
               reward_scale_factor: float = 1.0,
               epsilon_greedy: float = 0.1,
               epsilon_start: float = 1.0,
               epsilon_decay_steps: int = 0) -> BuiltAgent:
  """Builds a DdqnAgent whose collect epsilon and learning rate live in variables.

  Args:
    time_step_spec, action_spec: tensor specs of the environment.
    train_step: the run's train-step counter (checkpointed).
    env_steps: the run's env-step counter; drives the epsilon decay.
    fc_layer_params: hidden layer sizes of the MLP (after the conv stack).
    conv_layer_params: (filters, kernel, stride) per conv layer, or None.
    learning_rate: the optimizer's learning rate (re-applied on resume).
    adam_epsilon: Adam's epsilon.
    optimizer: 'adam' (default) or 'rmsprop': centred RMSProp, as the MinAtar
      paper trains (Keras adds `rmsprop_epsilon` under the square root, so 1e-4
      here is about the paper's 0.01 outside it).
    rmsprop_rho, rmsprop_epsilon: RMSProp's decay of the squared-gradient mean,
      and its epsilon.
    learning_rate_final, learning_rate_decay_steps: the learning rate decays
      linearly from `learning_rate` to `learning_rate_final` over that many env
      steps (None or 0: constant).
    gamma: discount factor.
    n_step_update: n of the n-step TD target (replay stores n+1 steps); the
      return stops at an episode's end (harness.rl.nstep).
    dueling: a dueling head (value + advantage streams) instead of one layer.
    target_update_tau, target_update_period: soft/hard target network update.
    gradient_clipping: global-norm clip of the gradients, or None.
    td_errors_loss_fn: 'huber' (default) or 'mse'.
    reward_scale_factor: multiplies rewards in the TD target.
    epsilon_greedy: collect epsilon (the final value when decaying).
    epsilon_start, epsilon_decay_steps: linear decay over that many env steps;
      0 means a constant `epsilon_greedy`.
  """
  check_settings(epsilon_greedy=epsilon_greedy, epsilon_start=epsilon_start,
                 epsilon_decay_steps=epsilon_decay_steps, learning_rate=learning_rate,
                 learning_rate_final=learning_rate_final,
                 learning_rate_decay_steps=learning_rate_decay_steps,
                 n_step_update=n_step_update, td_errors_loss_fn=td_errors_loss_fn,
                 optimizer=optimizer, rmsprop_rho=rmsprop_rho, rmsprop_epsilon=rmsprop_epsilon)

  q_net = networks.q_network(time_step_spec.observation, action_spec, fc_layer_params,
                     conv_layer_params, dueling)
  epsilon = LinearSchedule(env_steps, epsilon_greedy, epsilon_start, epsilon_decay_steps,
                           name='epsilon_schedule')
  # No final rate, or no decay steps: a constant rate (end == start).
  constant = learning_rate_final is None or learning_rate_decay_steps == 0
  learning_rate_schedule = LinearSchedule(
      env_steps, learning_rate if constant else learning_rate_final,
      learning_rate, learning_rate_decay_steps, name='learning_rate_schedule')
  if optimizer == 'rmsprop':
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=learning_rate, rho=rmsprop_rho,
                                            epsilon=rmsprop_epsilon, centered=True)
  else:
    optimizer = tf.keras.optimizers.Adam(learning_rate=learning_rate, epsilon=adam_epsilon)
  agent = dqn_agent.DdqnAgent(
      time_step_spec,
      action_spec,
      q_network=q_net,
      optimizer=optimizer,
      epsilon_greedy=epsilon,
      n_step_update=n_step_update,
      target_update_tau=target_update_tau,
      target_update_period=target_update_period,
      td_errors_loss_fn=_LOSSES[td_errors_loss_fn],
      gamma=gamma,
      reward_scale_factor=reward_scale_factor,
      gradient_clipping=gradient_clipping,
      train_step_counter=train_step)
  agent.initialize()
  # Create Adam's slot variables now: otherwise the first call of the compiled
  # train function creates them and traces twice; it also lets a checkpoint
  # restore them at once instead of deferring.
  optimizer.build(q_net.trainable_variables)
  # Tracked by the collect policy, so the checkpoint and the exported collect
  # policy both carry the schedule's variables.
  agent.collect_policy.epsilon_schedule = epsilon
  return BuiltAgent(agent=agent, optimizer=optimizer, epsilon=epsilon,
                    learning_rate_schedule=learning_rate_schedule,
                    n_step_update=n_step_update, gamma=gamma)
