"""The jobs of a distributed run: replay server, collectors, learner, evaluator.

All jobs read the same gin file. Reverb is the transport: the replay job serves
the replay table and a one-slot `variables` table; the learner pushes policy
weights there (tf-agents' `ReverbVariableContainer`) and collectors pull them.

Env steps of a distributed run are counted by the learner through the replay
ratio that the rate limiter enforces: env_steps = initial_collect_steps +
train_step / replay_ratio. The count is exact up to the limiter's tolerance,
survives restarts of any job, and is what `num_env_steps` is compared with.

Jobs find the replay server through a `ReplayLocator`: a fixed `host:port`
(`harness-train --job=... --replay_address`), or a lookup that runs again on
every reconnect (`harness-launch` asks the server's Ray actor, as a restarted
server may come back on another port or node).
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Callable, Dict, Optional, Tuple, TypeVar

from absl import logging
import reverb
import tensorflow as tf
from tf_agents.experimental.distributed import reverb_variable_container

from harness.base import disk
from harness.base import shutdown
from harness.base.errors import UsageError
from harness.rl import collect
from harness.rl import envs
from harness.rl import learn
from harness.rl import replay
from harness.run import loop
from harness.run import reporting
from harness.run import triggers
from harness.rundir import checkpoints
from harness.rundir import metrics
from harness.run.parts import (AgentParts, build_agent, collect_policy, make_collect_env,
                           make_replay_table, prioritized_settings, replay_layout)
from harness.run.settings import Distributed, RunConfig
from harness.rundir.directory import RunDirectory

VARIABLES_TABLE = reverb_variable_container.DEFAULT_TABLE
COLLECTOR_COLUMNS = ['wall_time', 'env_steps', 'policy_train_step', 'epsilon']
T = TypeVar('T')
# What a lost connection to the replay server looks like from TF and from Reverb.
_CONNECTION_ERRORS = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
                      tf.errors.CancelledError, tf.errors.OutOfRangeError,
                      tf.errors.InternalError, tf.errors.AbortedError, RuntimeError)


def _check_address(cfg: RunConfig) -> str:
  if not cfg.replay_address or ':' not in cfg.replay_address:
    raise UsageError(f'--job={cfg.job} needs --replay_address=host:port (got '
                     f'{cfg.replay_address!r})')
  return cfg.replay_address


@dataclasses.dataclass(frozen=True)
class ReplayLocator:
  """Where the jobs find the replay server.

  Attributes:
    find: returns the server's `host:port`; asked again on every (re)connect.
    hint: what to do when the server stays unreachable (ends the error line).
  """
  find: Callable[[], str]
  hint: str


def fixed_address(address: str) -> ReplayLocator:
  """The locator of a server at a known address (`--replay_address`)."""
  return ReplayLocator(lambda: address, 'start it with --job=replay, check --replay_address')


def wait_for_server(locator: ReplayLocator, limit_s: float) -> Tuple[str, reverb.Client]:
  """The address of a reachable server and a client of it, retrying with
  back-off for `limit_s` seconds (the address is looked up on every try).

  A stop request (a signal) ends the wait with `shutdown.Stopped`.
  """
  deadline, delay, address = time.time() + limit_s, 0.25, '(not found)'
  while True:
    shutdown.exit_if_requested(f'while waiting for the replay server at {address}',
                               'no checkpoint written (it needs the server); the last one stays')
    try:
      address = locator.find()
      client = reverb.Client(address)
      client.server_info(timeout=5)
      return address, client
    except Exception as e:  # pylint: disable=broad-except  (any failure = not reachable)
      if time.time() + delay > deadline:
        raise UsageError(
            f'cannot reach the replay server at {address} for {limit_s:.0f} s ({type(e).__name__}): '
            f'{locator.hint}, or raise Distributed.max_unreachable_seconds') from e
      logging.warning('Replay server at %s unreachable (%s); retrying in %.1f s', address,
                      type(e).__name__, delay)
      shutdown.current().wait(delay)
      delay = min(delay * 2, 5.0)


def _retrying(settings: Distributed, locator: ReplayLocator, action: Callable[[], T],
              reconnect: Callable[[str, reverb.Client], None]) -> T:
  """Runs `action`; on a lost connection finds the server again, reconnects, retries."""
  while True:
    try:
      return action()
    except _CONNECTION_ERRORS as e:
      logging.warning('Lost the replay server (%s: %s); reconnecting', type(e).__name__,
                      str(e).splitlines()[0] if str(e) else '')
      reconnect(*wait_for_server(locator, settings.max_unreachable_seconds))


def shared_variables(parts: AgentParts) -> Dict[str, object]:
  """What the learner pushes and collectors pull: weights, epsilon, counters.

  The epsilon variables travel too, so collectors use the learner's (possibly
  re-applied) settings, and `env_steps` drives their epsilon schedule.
  """
  schedule = parts.built.epsilon
  return {
      reverb_variable_container.POLICY_KEY: parts.agent.policy.variables(),
      'epsilon': [schedule.start, schedule.end, schedule.decay_steps],
      'env_steps': parts.run_state.env_steps,
      reverb_variable_container.TRAIN_STEP_KEY: parts.train_step,
  }


def _variables_table(parts: AgentParts) -> reverb.Table:
  signature = tf.nest.map_structure(lambda v: tf.TensorSpec(v.shape, v.dtype),
                                    shared_variables(parts))
  return reverb.Table(VARIABLES_TABLE, max_size=1, sampler=reverb.selectors.Uniform(),
                      remover=reverb.selectors.Fifo(),
                      rate_limiter=reverb.rate_limiters.MinSize(1), signature=signature)


def rate_limiter_settings(batch_size: int, replay_ratio: float, initial_collect_steps: int,
                          rows_per_item: int, tolerance_inserts: int) -> Tuple[float, int, float]:
  """(samples_per_insert, min_size_to_sample, error_buffer) that hold the replay ratio.

  An item holds rows_per_item env steps, which earn rows_per_item * ratio
  gradient steps, each sampling batch_size / rows_per_item items: so
  batch_size * ratio samples per inserted item, whatever the grouping.
  """
  samples_per_insert = batch_size * replay_ratio
  min_items = max(1, initial_collect_steps // rows_per_item)
  error_buffer = max(tolerance_inserts * samples_per_insert, 2.0 * max(1.0, samples_per_insert))
  return samples_per_insert, min_items, error_buffer


def _rate_limiter(cfg: RunConfig, settings: Distributed, rows_per_item: int):
  """The rate limiter of the replay table that keeps learner and collectors in step."""
  return reverb.rate_limiters.SampleToInsertRatio(*rate_limiter_settings(
      cfg.batch_size, cfg.replay_ratio, cfg.initial_collect_steps, rows_per_item,
      settings.tolerance_inserts))


def run_job(cfg: RunConfig) -> None:
  """Runs the job that `cfg.job` names."""
  settings = Distributed()
  address = _check_address(cfg)
  if cfg.job == 'replay':
    run_replay(cfg, settings, address)
  elif cfg.job == 'collect':
    run_collector(cfg, settings, fixed_address(address), cfg.collector_id)
  elif cfg.job == 'learn':
    run_learner(cfg, settings, fixed_address(address))
  else:
    run_evaluator(cfg, settings, fixed_address(address))


def start_replay(cfg: RunConfig, settings: Distributed, port: int) -> reverb.Server:
  """Starts the server of the replay and variables tables on `port` (0: a free
  one), restored from the newest checkpoint in `ROOT/replay/`.

  The learner asks for a replay checkpoint together with each of its own, so
  the two stay paired; the replay job writes only `ROOT/replay/`. A port in
  use raises `ValueError` (Reverb's "Failed to BuildAndStart gRPC server").
  """
  parts = build_agent(cfg, envs.make_env(seed=cfg.seed))
  layout = replay_layout(cfg, parts)
  table = make_replay_table(cfg, layout, _rate_limiter(cfg, settings, layout.rows_per_item))
  server = replay.start_server([table, _variables_table(parts)],
                               replay.replay_dir(cfg.root_dir), port=port or None)
  logging.info('Replay job serving %s and %s on port %d (all interfaces, no authentication); '
               '%d replay items restored', replay.TABLE, VARIABLES_TABLE, server.port,
               replay.table_size(server.localhost_client()))
  return server


def run_replay(cfg: RunConfig, settings: Distributed, address: str) -> None:
  """Serves the replay and variables tables on `address`'s port until SIGTERM or
  SIGINT, then stops the server and raises `shutdown.Stopped` (exit 143 or 130)."""
  server = start_replay(cfg, settings, int(address.rsplit(':', 1)[1]))
  stop = shutdown.current()
  stop.wait()
  server.stop()
  message = (f'replay job stopped by {stop.reason}: server stopped (the learner\'s checkpoints '
             'hold the paired table); run the same command to resume')
  logging.info('%s', message)
  raise shutdown.Stopped(message, stop.exit_code)


class _CollectorConnection:
  """A collector's client, observer and variable container; rebuilt on reconnect."""

  def __init__(self, layout, num_envs: int, address: str, client: reverb.Client):
    self._layout, self._num_envs = layout, num_envs
    self.connect(address, client)

  def connect(self, address: str, client: reverb.Client) -> None:
    self.address, self.client = address, client
    self.observer = self._layout.make_observer(client, self._num_envs)
    self.variables = reverb_variable_container.ReverbVariableContainer(address)

  def __call__(self, traj) -> None:
    self.observer(traj)


def run_collector(cfg: RunConfig, settings: Distributed, locator: ReplayLocator,
                  collector_id: int) -> None:
  """Steps its own envs, inserts into the replay table, pulls weights periodically.

  On a stop request it finishes its iteration, flushes its items to the server
  and raises `shutdown.Stopped`.
  """
  seed = cfg.seed + 1000 * (collector_id + 1)
  env = make_collect_env(cfg, seed)
  parts = build_agent(cfg, env)
  layout = replay_layout(cfg, parts)
  conn = _CollectorConnection(layout, cfg.num_envs,
                              *wait_for_server(locator, settings.max_unreachable_seconds))
  stats = metrics.EpisodeStats(cfg.num_envs)
  collector = collect.Collector(env, collect_policy(parts, env, seed), [conn, stats],
                                settings.pull_interval_steps)
  variables = shared_variables(parts)
  with disk.writing(os.path.join(cfg.root_dir, 'collectors')):
    os.makedirs(os.path.join(cfg.root_dir, 'collectors'), exist_ok=True)
  log = metrics.CsvLog(os.path.join(cfg.root_dir, 'collectors',
                                    f'collector-{collector_id}.csv'), COLLECTOR_COLUMNS)
  # Until the learner has pushed weights, act with epsilon_start (random).
  pulled = False

  def pull() -> None:
    nonlocal pulled
    if conn.client.server_info(timeout=5)[VARIABLES_TABLE].current_size > 0:
      conn.variables.update(variables)
      pulled = True

  logging.info('Collector %d connected to %s', collector_id, conn.address)
  stop = shutdown.current()
  while not stop.requested:
    _retrying(settings, locator, pull, conn.connect)
    learner_env_steps = int(parts.run_state.env_steps.numpy())
    log.append({'wall_time': time.time(), 'env_steps': stats.env_steps,
                'policy_train_step': int(parts.train_step.numpy()) if pulled else -1,
                'epsilon': float(parts.built.epsilon().numpy())})
    if pulled and learner_env_steps >= cfg.num_env_steps:
      logging.info('Learner reached its target (%d env steps): collector %d done',
                   learner_env_steps, collector_id)
      break
    _retrying(settings, locator, lambda: collect_and_flush(collector, conn), conn.connect)
  conn.observer.close()
  if stop.requested:
    message = (f'collector {collector_id} stopped by {stop.reason} at env_steps '
               f'{stats.env_steps}: its items are flushed; run the same command to resume')
    logging.info('%s', message)
    raise shutdown.Stopped(message, stop.exit_code)


def collect_and_flush(collector: collect.Collector, conn: _CollectorConnection) -> None:
  """Collects, then waits until the server has taken the items.

  Reverb's writer queues items on the client: without the flush a collector
  would run far ahead of the rate limiter (and queue items in memory).
  """
  collector.run()
  conn.observer.flush()


def _env_steps_of(cfg: RunConfig, train_step: int) -> int:
  """The learner's count of env steps: the initial collect plus train steps over the ratio."""
  return cfg.initial_collect_steps + int(round(train_step / cfg.replay_ratio))


@dataclasses.dataclass
class LearnerStart:
  """The learner's agent and run directory, opened (resume checked, checkpoint
  restored) but nothing written yet."""
  parts: AgentParts
  run_dir: RunDirectory


def open_learner(cfg: RunConfig) -> LearnerStart:
  """Builds the agent and opens ROOT: a refused resume raises `UsageError` here,
  before anything is written (`harness-launch` lets no other job write to ROOT until then)."""
  parts = build_agent(cfg, envs.make_env(seed=cfg.seed))
  return LearnerStart(parts, RunDirectory(cfg.root_dir, parts))


def run_learner(cfg: RunConfig, settings: Distributed, locator: ReplayLocator,
                start: Optional[LearnerStart] = None) -> None:
  """Trains from the server's dataset, pushes weights, checkpoints, logs, evaluates."""
  start = start or open_learner(cfg)
  parts, run_dir = start.parts, start.run_dir
  layout = replay_layout(cfg, parts)
  train_step, run_state = parts.train_step, parts.run_state
  clock = checkpoints.WallClock(run_state)
  address, client = wait_for_server(locator, settings.max_unreachable_seconds)
  pair_warning = (checkpoints.check_replay_pair(run_state, replay.replay_dir(cfg.root_dir))
                  if run_dir.checkpointer.restored else None)
  shutdown.exit_if_requested('during start-up')  # before the first write
  run_dir.write_launch_files(pair_warning)
  reporter = reporting.Reporter(cfg, parts, run_dir.restored_step)
  per = prioritized_settings(cfg)
  state = {'loss': float('nan')}

  def connect(address: str, new_client: reverb.Client) -> None:
    state['client'] = new_client
    state['variables'] = reverb_variable_container.ReverbVariableContainer(address)
    priorities = per and learn.PriorityUpdater(per, address, replay.TABLE, train_step,
                                               run_state.max_priority, layout.rows_per_item)
    # A new dataset after a reconnect means one more trace of the train function.
    state['trainer'] = learn.Trainer(parts.built, layout.make_dataset(address, cfg.batch_size),
                                     cfg.train_steps_per_iteration, priorities)

  def push(_: int = 0) -> None:
    _retrying(settings, locator,
              lambda: state['variables'].push(shared_variables(parts)), connect)

  def iteration() -> int:
    state['loss'] = _retrying(settings, locator, lambda: state['trainer'](), connect)
    env_steps = _env_steps_of(cfg, int(train_step.numpy()))
    run_state.set_env_steps(env_steps)
    return env_steps

  def metrics_row(env_steps: int) -> dict:
    size = _retrying(settings, locator, lambda: replay.table_size(state['client']), connect)
    return reporting.metrics_row(parts, env_steps, state['loss'], size * layout.rows_per_item,
                                 float('nan'), state['trainer'], None)

  def save_checkpoint() -> None:
    def save() -> None:
      clock.record()
      checkpoints.save_pair(state['client'], run_dir.checkpointer, run_state, train_step)
      reporter.exporter.save_current()
    _retrying(settings, locator, save, connect)

  connect(address, client)
  env_steps = _env_steps_of(cfg, int(train_step.numpy()))
  run_state.set_env_steps(env_steps)
  push()
  logging.info('Learner training from %s until %d env steps', address, cfg.num_env_steps)
  hooks = loop.JobHooks(
      iteration=iteration, metrics_row=metrics_row, save_checkpoint=save_checkpoint,
      episodes=lambda: None, evaluate=settings.eval_in_learner,
      extra_triggers=[triggers.IntervalTrigger(settings.push_interval_steps, push)])
  loop.train_to_target(cfg, reporter, clock, hooks, env_steps)
  # The final push carries env_steps >= target: collectors see it and stop.
  push()
  reporter.close()


def run_evaluator(cfg: RunConfig, settings: Distributed, locator: ReplayLocator) -> None:
  """Evaluates the newest pushed weights every `eval_job_interval_seconds`.

  Writes eval.csv rows itself; run it with `Distributed.eval_in_learner=False`.
  A stop request ends it after the evaluation under way (`shutdown.Stopped`).
  """
  parts = build_agent(cfg, envs.make_env(seed=cfg.seed))
  reporter = reporting.Reporter(cfg, parts, restored_step=None)
  conn = {}

  def connect(address: str, client: reverb.Client) -> None:
    conn['client'] = client
    conn['variables'] = reverb_variable_container.ReverbVariableContainer(address)

  def pull(variables: Dict[str, object]) -> bool:
    if conn['client'].server_info(timeout=5)[VARIABLES_TABLE].current_size == 0:
      return False
    conn['variables'].update(variables)
    return True

  connect(*wait_for_server(locator, settings.max_unreachable_seconds))
  variables = shared_variables(parts)
  last_step = -1
  stop = shutdown.current()
  while not stop.requested:
    if _retrying(settings, locator, lambda: pull(variables), connect):
      env_steps = int(parts.run_state.env_steps.numpy())
      if int(parts.train_step.numpy()) != last_step:
        last_step = int(parts.train_step.numpy())
        reporter.evaluate(env_steps)
      if env_steps >= cfg.num_env_steps:
        break
    stop.wait(settings.eval_job_interval_seconds)
  reporter.close()
  if stop.requested:
    message = (f'eval job stopped by {stop.reason} after evaluating train_step {last_step}; '
               'run the same command to resume')
    logging.info('%s', message)
    raise shutdown.Stopped(message, stop.exit_code)
