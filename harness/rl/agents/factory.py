"""`make_agent`: the agent of a run, its settings' checks, and `BuiltAgent`."""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence, Tuple

from absl import logging
import gin
import numpy as np
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.trajectories import time_step as ts
from tf_agents.utils import common

from harness.base import hardware
from harness.base.errors import UsageError
from harness.rl.agents import distributional
from harness.rl.agents import networks
from harness.rl.agents import optimizers
from harness.rl.agents.noisy import DEFAULT_SIGMA0
from harness.rl.agents.schedules import LinearSchedule


_LOSSES = {'huber': common.element_wise_huber_loss,
           'mse': common.element_wise_squared_loss}
# `make_agent.optimizer` values.
OPTIMIZERS = ('adam', 'rmsprop')
# `make_agent.agent` values. Rainbow is C51 with double-Q, dueling and noisy
# nets on; its n-step targets and prioritized replay are bindings of their own
# (gin/rainbow_*.gin sets them).
AGENTS = ('ddqn', 'c51', 'qrdqn', 'rainbow')
# `make_agent.compute_dtype` values: networks.COMPUTE_DTYPES, or 'auto' for
# bfloat16 where the hardware has bfloat16 units and float32 elsewhere.
COMPUTE_DTYPES = networks.COMPUTE_DTYPES + ('auto',)
# The collect epsilon when make_agent.epsilon_greedy is left unbound.
DEFAULT_EPSILON = 0.1


@dataclasses.dataclass
class BuiltAgent:
  """A DdqnAgent with the pieces the harness drives, so nothing reaches into privates.

  Attributes:
    agent: the tf-agents agent (DdqnAgent, or one of harness.rl.agents.distributional).
    optimizer: its optimizer (Adam or centred RMSProp); `optimizer.learning_rate` is the live variable.
    epsilon: the collect epsilon schedule (variables, read inside the policy graph).
    learning_rate_schedule: the learning rate over env steps; the compiled
      train step copies it into the optimizer before each gradient step.
    n_step_update: n of the n-step TD target.
    gamma: the discount factor.
    name, features: the agent in words for the start-up line, e.g. 'C51' and
      ('double-Q', 'dueling').
  """
  agent: dqn_agent.DqnAgent
  optimizer: tf.keras.optimizers.Optimizer
  epsilon: LinearSchedule
  learning_rate_schedule: LinearSchedule
  n_step_update: int
  gamma: float
  name: str = 'DDQN'
  features: Tuple[str, ...] = ()

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


def _warn_on_images_without_convolutions(observation_spec, conv_layer_params) -> None:
  """An MLP on raw frames (a vector config on Atari) trains, but crawls and learns little."""
  shape = tuple(getattr(observation_spec, 'shape', ()) or ())
  if conv_layer_params is None and len(shape) >= 3:
    logging.warning('observations are images of shape %s but make_agent.conv_layer_params is '
                    'None: an MLP on %d raw inputs is slow and learns little; for Atari use '
                    'gin/ddqn_atari.gin (or bind make_agent.conv_layer_params)', shape,
                    int(np.prod(shape)))


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_positive_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _check_layers(fc_layer_params, conv_layer_params) -> None:
  if (not isinstance(fc_layer_params, (tuple, list))
      or not all(_is_positive_int(u) for u in fc_layer_params)):
    raise UsageError(f'make_agent.fc_layer_params={fc_layer_params!r} must be a tuple of '
                     'positive layer sizes, e.g. (256, 256), or () for none')
  if conv_layer_params is None:
    return
  if (not isinstance(conv_layer_params, (tuple, list)) or not conv_layer_params
      or not all(isinstance(c, (tuple, list)) and len(c) == 3
                 and all(_is_positive_int(v) for v in c) for c in conv_layer_params)):
    raise UsageError(f'make_agent.conv_layer_params={conv_layer_params!r} must be None or a '
                     'tuple of (filters, kernel, stride) triples of positive integers, e.g. '
                     '((32, 8, 4), (64, 4, 2), (64, 3, 1)) as gin/ddqn_atari.gin')


def _check_family(agent, num_atoms, min_q_value, max_q_value, num_quantiles, noisy,
                  noisy_sigma0, double_q, dueling) -> None:
  if agent not in AGENTS:
    raise UsageError(f'make_agent.agent={agent!r} is unknown: use one of {list(AGENTS)}')
  for name, value in (('noisy', noisy), ('double_q', double_q), ('dueling', dueling)):
    if not isinstance(value, bool) and not (value is None and name != 'double_q'):
      raise UsageError(f'make_agent.{name}={value!r} must be True or False')
  if not _is_positive_int(num_atoms) or num_atoms < 2:
    raise UsageError(f'make_agent.num_atoms={num_atoms!r} must be an integer >= 2 (C51 uses 51)')
  if not (_is_number(min_q_value) and _is_number(max_q_value)) or min_q_value >= max_q_value:
    raise UsageError(f'make_agent.min_q_value={min_q_value!r} and max_q_value={max_q_value!r} '
                     'must be numbers with min_q_value < max_q_value: the support of the '
                     "returns' distribution, e.g. -10 and 10")
  if not _is_positive_int(num_quantiles):
    raise UsageError(f'make_agent.num_quantiles={num_quantiles!r} must be an integer >= 1 '
                     '(QR-DQN uses 200)')
  if not _is_number(noisy_sigma0) or noisy_sigma0 <= 0:
    raise UsageError(f'make_agent.noisy_sigma0={noisy_sigma0!r} must be a positive number '
                     f'(the paper\'s {DEFAULT_SIGMA0})')


def check_settings(epsilon_greedy: Optional[float] = None, epsilon_start: float = 1.0,
                   epsilon_decay_steps: int = 0, learning_rate: float = 1e-3,
                   learning_rate_final: Optional[float] = None,
                   learning_rate_decay_steps: int = 0,
                   n_step_update: int = 1, td_errors_loss_fn: str = 'huber',
                   optimizer: str = 'adam', rmsprop_rho: float = 0.95,
                   rmsprop_epsilon: float = 1e-4, rmsprop_momentum: float = 0.0,
                   fc_layer_params: Sequence[int] = (100,),
                   conv_layer_params: Optional[Sequence[Tuple[int, int, int]]] = None,
                   adam_epsilon: float = 1e-7, gamma: float = 0.99,
                   target_update_tau: float = 1.0, target_update_period: int = 100,
                   gradient_clipping: Optional[float] = None,
                   reward_scale_factor: float = 1.0, agent: str = 'ddqn',
                   num_atoms: int = 51, min_q_value: float = -10.0, max_q_value: float = 10.0,
                   num_quantiles: int = 200, noisy: Optional[bool] = None,
                   noisy_sigma0: float = DEFAULT_SIGMA0, double_q: bool = True,
                   dueling: Optional[bool] = None, compute_dtype: str = 'float32') -> None:
  """The one home of the checks on `make_agent` values; raises `UsageError`.

  `harness-train` calls it with the bound values before anything is built, and
  `make_agent` calls it again with what it was given.
  """
  _check_layers(fc_layer_params, conv_layer_params)
  if compute_dtype not in COMPUTE_DTYPES:
    raise UsageError(f'make_agent.compute_dtype={compute_dtype!r} is unknown: use one of '
                     f'{list(COMPUTE_DTYPES)}')
  _check_family(agent, num_atoms, min_q_value, max_q_value, num_quantiles, noisy, noisy_sigma0,
                double_q, dueling)
  if not _is_number(gamma) or not 0.0 <= gamma <= 1.0:
    raise UsageError(f'make_agent.gamma={gamma!r} is outside [0, 1]: the discount factor, '
                     'e.g. 0.99')
  if not _is_number(target_update_tau) or not 0.0 < target_update_tau <= 1.0:
    raise UsageError(f'make_agent.target_update_tau={target_update_tau!r} must be in (0, 1]: '
                     '1.0 copies the online network, smaller values blend it in')
  if not _is_positive_int(target_update_period):
    raise UsageError(f'make_agent.target_update_period={target_update_period!r} must be an '
                     'integer >= 1 (gradient steps between target updates)')
  if gradient_clipping is not None and (not _is_number(gradient_clipping)
                                        or gradient_clipping <= 0):
    raise UsageError(f'make_agent.gradient_clipping={gradient_clipping!r} must be None or a '
                     'positive global-norm bound, e.g. 10.0')
  if not _is_number(reward_scale_factor) or reward_scale_factor <= 0:
    raise UsageError(f'make_agent.reward_scale_factor={reward_scale_factor!r} must be a '
                     'positive number')
  if not _is_number(adam_epsilon) or adam_epsilon <= 0:
    raise UsageError(f'make_agent.adam_epsilon={adam_epsilon!r} must be a positive number, '
                     'e.g. 1e-7')
  if epsilon_greedy is None:
    epsilon_greedy = 0.0 if noisy or (noisy is None and agent == 'rainbow') else DEFAULT_EPSILON
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
  if not _is_number(rmsprop_momentum) or not 0.0 <= rmsprop_momentum < 1.0:
    raise UsageError(f'make_agent.rmsprop_momentum={rmsprop_momentum!r} must be in [0, 1), '
                     'e.g. 0.95 as the MinAtar paper (0: none)')


def resolve_compute_dtype(compute_dtype: str) -> str:
  """'auto' -> 'bfloat16' where the hardware has bfloat16 units, else 'float32'."""
  if compute_dtype != 'auto':
    return compute_dtype
  resolved = 'bfloat16' if hardware.has_bfloat16_units() else 'float32'
  logging.info('make_agent.compute_dtype=auto: %s on this machine', resolved)
  return resolved


@gin.configurable
def make_agent(time_step_spec: ts.TimeStep,
               action_spec,
               train_step: tf.Variable,
               env_steps: tf.Variable,
               agent: str = 'ddqn',
               fc_layer_params: Sequence[int] = (100,),
               conv_layer_params: Optional[Sequence[Tuple[int, int, int]]] = None,
               learning_rate: float = 1e-3,
               learning_rate_final: Optional[float] = None,
               learning_rate_decay_steps: int = 0,
               adam_epsilon: float = 1e-7,
               optimizer: str = 'adam',
               rmsprop_rho: float = 0.95,
               rmsprop_epsilon: float = 1e-4,
               rmsprop_momentum: float = 0.0,
               gamma: float = 0.99,
               n_step_update: int = 1,
               dueling: Optional[bool] = None,
               double_q: bool = True,
               num_atoms: int = 51,
               min_q_value: float = -10.0,
               max_q_value: float = 10.0,
               num_quantiles: int = 200,
               noisy: Optional[bool] = None,
               noisy_sigma0: float = DEFAULT_SIGMA0,
               target_update_tau: float = 1.0,
               target_update_period: int = 100,
               gradient_clipping: Optional[float] = None,
               td_errors_loss_fn: str = 'huber',
               reward_scale_factor: float = 1.0,
               epsilon_greedy: Optional[float] = None,
               epsilon_start: float = 1.0,
               epsilon_decay_steps: int = 0,
               compute_dtype: str = 'float32') -> BuiltAgent:
  """Builds the run's agent; its collect epsilon and learning rate live in variables.

  Args:
    time_step_spec, action_spec: tensor specs of the environment.
    train_step: the run's train-step counter (checkpointed).
    env_steps: the run's env-step counter; drives the epsilon decay.
    agent: 'ddqn' (default: tf-agents' DdqnAgent; DqnAgent with double_q=False),
      'c51' (categorical, `num_atoms` on [min_q_value, max_q_value]), 'qrdqn'
      (`num_quantiles` quantiles) or 'rainbow' (C51 with double-Q, dueling and
      noisy nets; bind n_step_update=3 and train_eval.prioritized_replay=True
      beside it, as gin/rainbow_*.gin do).
    fc_layer_params: hidden layer sizes of the MLP (after the conv stack).
    conv_layer_params: (filters, kernel, stride) per conv layer, or None.
    learning_rate: the optimizer's learning rate (re-applied on resume).
    adam_epsilon: Adam's epsilon.
    optimizer: 'adam' (default) or 'rmsprop': centred RMSProp, as the MinAtar
      paper trains (Keras adds `rmsprop_epsilon` under the square root, so 1e-4
      here is about the paper's 0.01 outside it).
    rmsprop_rho, rmsprop_epsilon: RMSProp's decay of the squared-gradient mean,
      and its epsilon.
    rmsprop_momentum: RMSProp's momentum (0: none, as the MinAtar paper's
      examples/dqn.py trains: it defines a GRAD_MOMENTUM of 0.95 that it never
      passes to the optimizer). 0.95 makes the steps about 1 / (1 - 0.95) = 20
      times larger once the momentum has built up.
    learning_rate_final, learning_rate_decay_steps: the learning rate decays
      linearly from `learning_rate` to `learning_rate_final` over that many env
      steps (None or 0: constant).
    gamma: discount factor.
    n_step_update: n of the n-step TD target (replay stores n+1 steps); the
      return stops at an episode's end (harness.rl.nstep).
    dueling: a dueling head (value + advantage streams) instead of one layer;
      per atom or quantile for the distributional agents. None: on for Rainbow only.
    double_q: the next action by the online network (double-Q) rather than the
      target network's.
    num_atoms, min_q_value, max_q_value: C51's support.
    num_quantiles: QR-DQN's quantiles per action.
    noisy, noisy_sigma0: NoisyDense layers (factorised Gaussian noise, sigma0 as
      Fortunato et al.) for every dense layer; noise in the collect policy only.
      None: on for Rainbow only.
    target_update_tau, target_update_period: soft/hard target network update.
    gradient_clipping: global-norm clip of the gradients, or None.
    td_errors_loss_fn: 'huber' (default) or 'mse'.
    reward_scale_factor: multiplies rewards in the TD target.
    epsilon_greedy: collect epsilon (the final value when decaying); None means
      0.1, or 0.0 with noisy nets (Rainbow included), which explore by their noise.
    epsilon_start, epsilon_decay_steps: linear decay over that many env steps;
      0 means a constant `epsilon_greedy`.
    compute_dtype: 'float32' (default) or 'bfloat16': the conv layers and the
      hidden (non-noisy) dense layers compute in bfloat16 with float32 weights;
      the Q head, the targets and the loss stay float32. Checkpoints are the same
      either way, so a resume may change it. 'auto': bfloat16 where the hardware
      has bfloat16 units (harness.base.hardware), float32 elsewhere.
  """
  check_settings(epsilon_greedy=epsilon_greedy, epsilon_start=epsilon_start,
                 epsilon_decay_steps=epsilon_decay_steps, learning_rate=learning_rate,
                 learning_rate_final=learning_rate_final,
                 learning_rate_decay_steps=learning_rate_decay_steps,
                 n_step_update=n_step_update, td_errors_loss_fn=td_errors_loss_fn,
                 optimizer=optimizer, rmsprop_rho=rmsprop_rho, rmsprop_epsilon=rmsprop_epsilon,
                 rmsprop_momentum=rmsprop_momentum,
                 fc_layer_params=fc_layer_params, conv_layer_params=conv_layer_params,
                 adam_epsilon=adam_epsilon, gamma=gamma, target_update_tau=target_update_tau,
                 target_update_period=target_update_period,
                 gradient_clipping=gradient_clipping, reward_scale_factor=reward_scale_factor,
                 agent=agent, num_atoms=num_atoms, min_q_value=min_q_value,
                 max_q_value=max_q_value, num_quantiles=num_quantiles, noisy=noisy,
                 noisy_sigma0=noisy_sigma0, double_q=double_q, dueling=dueling,
                 compute_dtype=compute_dtype)
  compute_dtype = resolve_compute_dtype(compute_dtype)
  # Rainbow is C51 with these on; an explicit False turns one off (an ablation).
  rainbow = agent == 'rainbow'
  kind = 'c51' if rainbow else agent
  dueling = rainbow if dueling is None else dueling
  noisy = rainbow if noisy is None else noisy
  if epsilon_greedy is None:
    epsilon_greedy = 0.0 if noisy else DEFAULT_EPSILON
  _warn_on_images_without_convolutions(time_step_spec.observation, conv_layer_params)
  atoms = {'c51': num_atoms, 'qrdqn': num_quantiles}.get(kind)
  def network():
    return networks.q_network(time_step_spec.observation, action_spec, fc_layer_params,
                              conv_layer_params, dueling, num_atoms=atoms,
                              noisy_sigma0=noisy_sigma0 if noisy else None,
                              compute_dtype=compute_dtype)

  q_net = network()
  # tf-agents copies the online network into the target network from its config
  # once it is built; that copy's bfloat16 layers get plain float32 kernels and
  # fail in Conv2D, so a bfloat16 target is built fresh (initialize() copies the
  # weights in, as it does for the copy).
  target_net = network() if compute_dtype != 'float32' else None
  epsilon = LinearSchedule(env_steps, epsilon_greedy, epsilon_start, epsilon_decay_steps,
                           name='epsilon_schedule')
  # No final rate, or no decay steps: a constant rate (end == start).
  constant = learning_rate_final is None or learning_rate_decay_steps == 0
  learning_rate_schedule = LinearSchedule(
      env_steps, learning_rate if constant else learning_rate_final,
      learning_rate, learning_rate_decay_steps, name='learning_rate_schedule')
  if optimizer == 'rmsprop':
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=learning_rate, rho=rmsprop_rho,
                                            epsilon=rmsprop_epsilon, centered=True,
                                            momentum=rmsprop_momentum)
  else:
    # Keras' Adam in one fused op per variable (optimizers.py: the same update).
    optimizer = optimizers.FusedAdam(learning_rate=learning_rate, epsilon=adam_epsilon)
  common_args = dict(optimizer=optimizer, epsilon_greedy=epsilon, n_step_update=n_step_update,
                     target_update_tau=target_update_tau,
                     target_update_period=target_update_period, gamma=gamma,
                     reward_scale_factor=reward_scale_factor,
                     gradient_clipping=gradient_clipping, train_step_counter=train_step)
  if kind == 'c51':
    for net in filter(None, (q_net, target_net)):
      net.num_atoms = num_atoms  # what CategoricalDqnAgent checks for
    agent = distributional.C51Agent(time_step_spec, action_spec, categorical_q_network=q_net,
                                    target_categorical_q_network=target_net,
                                    min_q_value=float(min_q_value),
                                    max_q_value=float(max_q_value), double_q=double_q,
                                    **common_args)
  elif kind == 'qrdqn':
    agent = distributional.QrDqnAgent(time_step_spec, action_spec, q_network=q_net,
                                      target_q_network=target_net,
                                      num_quantiles=num_quantiles, double_q=double_q,
                                      **common_args)
  else:
    agent_class = {(True, False): dqn_agent.DdqnAgent, (False, False): dqn_agent.DqnAgent,
                   (True, True): distributional.NoisyDdqnAgent,
                   (False, True): distributional.NoisyDqnAgent}[(double_q, noisy)]
    agent = agent_class(time_step_spec, action_spec, q_network=q_net, target_q_network=target_net,
                        td_errors_loss_fn=_LOSSES[td_errors_loss_fn], **common_args)
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
                    n_step_update=n_step_update, gamma=gamma,
                    **_described(rainbow, kind, double_q, dueling, noisy))


def _described(rainbow: bool, kind: str, double_q: bool, dueling: bool, noisy: bool) -> dict:
  if rainbow and double_q and dueling and noisy:
    return {'name': 'Rainbow', 'features': ()}
  name = {'c51': 'C51', 'qrdqn': 'QR-DQN'}.get(kind, 'DDQN' if double_q else 'DQN')
  features = tuple(f for f, on in (('double-Q', double_q and kind != 'ddqn'),
                                   ('dueling', dueling), ('noisy nets', noisy)) if on)
  return {'name': name, 'features': features}
