"""`train_eval`: wires envs, agent, replay, collection, training and reporting.

This module and `distributed.py` are the only ones that know how the pieces
connect. `train_eval` holds every run setting (one gin name, `train_eval.*`, for
all jobs of a run) and dispatches to the job that `--job` names.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from typing import Optional

from absl import logging
import gin
import numpy as np
import tensorflow as tf
from tf_agents.drivers import py_driver
from tf_agents.environments import py_environment
from tf_agents.policies import epsilon_greedy_policy
from tf_agents.policies import py_epsilon_greedy_policy
from tf_agents.policies import py_tf_eager_policy
from tf_agents.specs import tensor_spec
from tf_agents.train.utils import train_utils

from harness import agents
from harness import checkpoints
from harness import collect
from harness import envs
from harness import frame_replay
from harness import learn
from harness import memory
from harness import metrics
from harness import replay
from harness import results
from harness import resume
from harness.errors import UsageError

JOBS = ('all', 'replay', 'collect', 'learn', 'eval')


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """The settings of a run, as bound to `train_eval` (see its docstring)."""
  root_dir: str
  num_env_steps: int
  replay_capacity: int
  batch_size: int
  initial_collect_steps: int
  num_envs: int
  collect_steps_per_iteration: int
  train_steps_per_iteration: int
  eval_interval: int
  eval_episodes: int
  checkpoint_interval: int
  log_interval: int
  seed: int
  prioritized_replay: bool
  job: str
  replay_address: Optional[str]
  eval_epsilon: float = 0.0
  final_eval_episodes: int = 20

  @property
  def replay_ratio(self) -> float:
    """Gradient steps per env step."""
    return self.train_steps_per_iteration / self.collect_steps_per_iteration

  def validate(self) -> None:
    for name in ('num_env_steps', 'replay_capacity', 'batch_size', 'num_envs',
                 'collect_steps_per_iteration', 'train_steps_per_iteration', 'eval_interval',
                 'eval_episodes', 'checkpoint_interval', 'log_interval', 'final_eval_episodes'):
      value = getattr(self, name)
      if value is None or value <= 0:
        raise UsageError(f'train_eval.{name}={value} must be positive, e.g. '
                         f'--gin_bindings="train_eval.{name}=1000"')
    if self.initial_collect_steps < 0:
      raise UsageError(
          f'train_eval.initial_collect_steps={self.initial_collect_steps} must be >= 0')
    if self.batch_size % self.num_envs:
      raise UsageError(f'train_eval.batch_size={self.batch_size} must be a multiple of '
                       f'train_eval.num_envs={self.num_envs}: a replay item holds one step of '
                       'each env')
    if self.job not in JOBS:
      raise UsageError(f'--job={self.job} is unknown: use one of {", ".join(JOBS)}')
    if not 0.0 <= self.eval_epsilon <= 1.0:
      raise UsageError(f'train_eval.eval_epsilon={self.eval_epsilon} is outside [0, 1], '
                       'e.g. train_eval.eval_epsilon=0.05 (0 = greedy)')


@dataclasses.dataclass
class AgentParts:
  """The agent and the counters a run checkpoints with it."""
  agent: object
  train_step: tf.Variable
  run_state: checkpoints.RunState
  sequence_length: int


def seed_everything(seed: int) -> None:
  random.seed(seed)
  np.random.seed(seed)
  tf.random.set_seed(seed)


def make_collect_env(cfg: RunConfig, seed: int) -> py_environment.PyEnvironment:
  """`num_envs` envs as one batch (or one env); fails early on a bad env id."""
  return envs.make_batched_env(cfg.num_envs, seed) if cfg.num_envs > 1 else envs.make_env(
      seed=seed)


def build_agent(cfg: RunConfig, env: py_environment.PyEnvironment) -> AgentParts:
  """The gin-configured DdqnAgent for `env`'s specs, with fresh counters."""
  train_step = train_utils.create_train_step()
  run_state = checkpoints.RunState()
  agent = agents.make_agent(tensor_spec.from_spec(env.time_step_spec()),
                            tensor_spec.from_spec(env.action_spec()),
                            train_step, run_state.env_steps)
  sequence_length = agent._n_step_update + 1  # pylint: disable=protected-access
  if cfg.num_envs > 1 and sequence_length != 2:
    raise UsageError(f'train_eval.num_envs={cfg.num_envs} needs make_agent.n_step_update=1 '
                     '(grouped replay items run across episode ends); use num_envs=1 for '
                     'n-step targets')
  # Checks the frame_replay bindings now (before ROOT is touched) and puts them
  # into the operative config, which RunDirectory reads next.
  frame_replay.frame_replay(agent.collect_data_spec, sequence_length)
  return AgentParts(agent, train_step, run_state, sequence_length)


def replay_layout(cfg: RunConfig, parts: AgentParts):
  """How transitions are stored: whole steps (grouped per env batch), or each
  image frame once (`frame_replay.enabled`, Atari)."""
  frames = frame_replay.frame_replay(parts.agent.collect_data_spec, parts.sequence_length)
  if frames:
    return frames
  return replay.StepReplay(parts.agent.collect_data_spec, parts.sequence_length, cfg.num_envs)


def prioritized_settings(cfg: RunConfig) -> Optional[learn.PrioritizedReplay]:
  return learn.PrioritizedReplay() if cfg.prioritized_replay else None


def make_replay_table(cfg: RunConfig, layout, rate_limiter=None):
  per = prioritized_settings(cfg)
  return layout.make_table(cfg.replay_capacity,
                           priority_exponent=per.priority_exponent if per else None,
                           rate_limiter=rate_limiter)


class RunDirectory:
  """Opens ROOT for a launch: refuses bad resumes, restores, writes launch files.

  Nothing is written to ROOT until `write_launch_files`, so a refused resume
  (exit status 2) leaves ROOT as it was.
  """

  def __init__(self, root_dir: str, parts: AgentParts):
    self.root_dir = root_dir
    self.config_dir = os.path.join(root_dir, 'config')
    self._operative_config = gin.operative_config_str()
    self._changes = resume.check_changes(self.config_dir, self._operative_config)
    self.checkpointer = checkpoints.ResumableCheckpointer(root_dir, parts.agent,
                                                          parts.run_state)
    self._reapplied = self.checkpointer.initialize_or_restore()
    self.restored_step = int(parts.train_step.numpy())
    if self.checkpointer.restored:
      logging.info('Resumed from %s at train_step %d, env_steps %d',
                   self.checkpointer.latest(), self.restored_step,
                   int(parts.run_state.env_steps.numpy()))

  def write_launch_files(self, pair_warning: Optional[str]) -> None:
    """The operative config of this launch and, on a resume, its report."""
    os.makedirs(self.config_dir, exist_ok=True)
    path = os.path.join(self.config_dir, f'operative_config-{self.restored_step}.gin')
    with open(path, 'w') as f:
      f.write(self._operative_config)
    if self.checkpointer.restored:
      report = resume.write_report(self.config_dir, self.restored_step, self._changes,
                                   self._reapplied, pair_warning)
      with open(report) as f:
        logging.info('Resume report (%s):\n%s', report, f.read())


@dataclasses.dataclass
class Evaluation:
  """Greedy-policy evaluation on an env of its own."""
  env: py_environment.PyEnvironment
  policy: object
  episodes: int

  def run(self) -> metrics.EpisodeStats:
    stats = metrics.EpisodeStats(num_envs=1, window=self.episodes)
    driver = py_driver.PyDriver(self.env, self.policy, [stats], max_episodes=self.episodes)
    driver.run(self.env.reset())
    return stats


class Reporter:
  """metrics.csv, eval.csv, TensorBoard, the progress line and policy exports."""

  def __init__(self, cfg: RunConfig, parts: AgentParts, restored_step: Optional[int]):
    """`restored_step`: the step this launch resumed from; None for a job that
    only appends (the eval job), which leaves existing rows alone."""
    root = cfg.root_dir
    self._cfg = cfg
    self._parts = parts
    self.metrics_csv = metrics.CsvLog(os.path.join(root, 'metrics.csv'),
                                      metrics.METRICS_COLUMNS)
    self.eval_csv = metrics.CsvLog(os.path.join(root, 'eval.csv'), metrics.EVAL_COLUMNS)
    # Rows written after the checkpoint we resume from would be written again.
    for log in (self.metrics_csv, self.eval_csv) if restored_step is not None else ():
      dropped = log.keep_rows_up_to(restored_step)
      if dropped:
        logging.info('Dropped %d rows after train_step %d from %s', dropped, restored_step,
                     log.path)
    self._train_summaries = metrics.SummaryWriter(checkpoints.train_dir(root))
    self._eval_summaries = metrics.SummaryWriter(os.path.join(root, 'eval'))
    self.exporter = checkpoints.PolicyExporter(root, parts.agent)
    eval_env = envs.make_env(seed=cfg.seed + 10_000)
    self._evaluation = Evaluation(eval_env, self._eval_policy(eval_env), cfg.eval_episodes)
    self._last = None
    self._start = None

  def _eval_policy(self, env: py_environment.PyEnvironment) -> collect.CompiledPolicy:
    """The greedy policy (epsilon-greedy with `eval_epsilon`), compiled for `env`."""
    policy = self._parts.agent.policy
    if self._cfg.eval_epsilon > 0:
      policy = epsilon_greedy_policy.EpsilonGreedyPolicy(policy, self._cfg.eval_epsilon)
    return collect.CompiledPolicy(policy, env)

  def log(self, row: dict) -> None:
    """Appends a metrics row (steps_per_sec filled in) and prints the progress line."""
    now, env_steps = row['wall_time'], row['env_steps']
    if self._last is None:
      self._last = self._start = (now, env_steps)
    row['steps_per_sec'] = (env_steps - self._last[1]) / max(now - self._last[0], 1e-9)
    self._last = (now, env_steps)
    self.metrics_csv.append(row)
    self._train_summaries.scalars(row['train_step'], {
        k: row.get(k) for k in ('loss', 'epsilon', 'learning_rate', 'replay_size',
                                'avg_return', 'rss_mb', 'steps_per_sec', 'per_beta',
                                'mean_priority')})
    rate = (env_steps - self._start[1]) / max(now - self._start[0], 1e-9)
    eta = (self._cfg.num_env_steps - env_steps) / rate if rate > 0 else None
    logging.info('%s', metrics.format_progress(row, self._cfg.num_env_steps, eta))

  def start_clock(self, env_steps: int) -> None:
    """Rates count from here (after start-up and the initial collect)."""
    self._last = self._start = (time.time(), env_steps)

  def evaluate(self, env_steps: int) -> None:
    """Runs the greedy policy; exports it as best_policy when it beats the best."""
    train_step = int(self._parts.train_step.numpy())
    result = self._evaluation.run()
    mean, std = metrics.mean_std(result.recent_returns)
    length = float(np.mean(result.recent_lengths))
    self.eval_csv.append({'train_step': train_step, 'env_steps': env_steps,
                          'wall_time': time.time(), 'avg_return': mean, 'std_return': std,
                          'avg_episode_length': length, 'episodes': result.episodes})
    self._eval_summaries.scalars(train_step, {'eval/avg_return': mean,
                                              'eval/avg_episode_length': length})
    logging.info('eval at env_steps %d: return %.1f +- %.1f over %d episodes', env_steps,
                 mean, std, result.episodes)
    best = self._parts.run_state.best_eval_return
    if mean > float(best.numpy()):
      best.assign(mean)
      self.exporter.save_best()

  def write_results(self, env_steps: int, episodes: int, wall_seconds: float) -> None:
    """Evaluates the final greedy policy and best_policy; writes ROOT/results.json.

    Both play `final_eval_episodes` episodes from the same seeded starts, with
    the evaluation epsilon of the run. Skipped when results.json already
    describes this train step (a resumed run that was already at its target).
    """
    train_step = int(self._parts.train_step.numpy())
    previous = results.read_results(self._cfg.root_dir)
    if previous is not None and previous['train_step'] == train_step:
      return
    episodes_each = self._cfg.final_eval_episodes
    seed = self._cfg.seed + 20_000
    final = self._final_evaluation(self._eval_policy, seed).run()
    final_mean, final_std = metrics.mean_std(final.recent_returns)
    best_mean, best_std = final_mean, final_std
    best_dir = self.exporter.path('best_policy')
    if os.path.isfile(os.path.join(best_dir, 'saved_model.pb')):
      best = self._final_evaluation(self._saved_policy(best_dir), seed).run()
      best_mean, best_std = metrics.mean_std(best.recent_returns)
    path = results.write_results(self._cfg.root_dir, {
        'final_return': final_mean, 'final_return_std': final_std,
        'best_policy_return': best_mean, 'best_policy_return_std': best_std,
        'best_eval_return': float(self._parts.run_state.best_eval_return.numpy()),
        'env_steps': env_steps, 'train_step': train_step, 'wall_seconds': wall_seconds,
        'episodes': episodes, 'final_eval_episodes': episodes_each,
        'eval_epsilon': self._cfg.eval_epsilon, 'num_env_steps': self._cfg.num_env_steps})
    logging.info('final policy: return %.1f +- %.1f over %d episodes; best_policy: %.1f +- %.1f '
                 '(%s)', final_mean, final_std, episodes_each, best_mean, best_std, path)

  def _final_evaluation(self, policy, seed: int) -> 'Evaluation':
    env = envs.make_env(seed=seed)
    if callable(policy):
      policy = policy(env)
    return Evaluation(env, policy, self._cfg.final_eval_episodes)

  def _saved_policy(self, policy_dir: str):
    """An exported policy as a py policy, epsilon-greedy like the evaluations."""
    policy = py_tf_eager_policy.SavedModelPyTFEagerPolicy(
        policy_dir, load_specs_from_pbtxt=True, use_tf_function=True)
    if self._cfg.eval_epsilon > 0:
      policy = py_epsilon_greedy_policy.EpsilonGreedyPolicy(policy, self._cfg.eval_epsilon)
    return policy

  def close(self) -> None:
    self._train_summaries.close()
    self._eval_summaries.close()


def metrics_row(parts: AgentParts, env_steps: int, loss: float, replay_size: int,
                avg_return: float, trainer: learn.Trainer,
                policy_traces: Optional[int]) -> dict:
  """One metrics.csv row; epsilon and learning rate come from the live variables."""
  priorities = trainer.priorities
  # Free heap pages go back to the OS first, so rss_mb is what the run holds.
  memory.release_free_memory()
  return {'train_step': int(parts.train_step.numpy()), 'env_steps': env_steps,
          'wall_time': time.time(), 'loss': loss,
          'epsilon': float(parts.agent.epsilon_schedule().numpy()),
          'learning_rate': float(agents.learning_rate_variable(parts.agent).numpy()),
          'replay_size': replay_size, 'avg_return': avg_return, 'rss_mb': memory.rss_mb(),
          'train_traces': trainer.trace_count(), 'policy_traces': policy_traces,
          'per_beta': float(priorities.beta.numpy()) if priorities else None,
          'mean_priority': (float(priorities.mean_sampled_priority.numpy())
                            if priorities else None)}


def crossed(before: int, after: int, interval: int) -> bool:
  """True when an interval boundary lies in (before, after]."""
  return after // interval > before // interval


@gin.configurable
def train_eval(root_dir: str,
               num_env_steps: int = 50_000,
               replay_capacity: int = 100_000,
               batch_size: int = 64,
               initial_collect_steps: int = 1_000,
               num_envs: int = 1,
               collect_steps_per_iteration: int = 1,
               train_steps_per_iteration: int = 1,
               eval_interval: int = 5_000,
               eval_episodes: int = 10,
               eval_epsilon: float = 0.0,
               final_eval_episodes: int = 20,
               checkpoint_interval: int = 10_000,
               log_interval: int = 1_000,
               seed: int = 0,
               prioritized_replay: bool = False,
               job: str = 'all',
               replay_address: Optional[str] = None,
               collector_id: int = 0) -> None:
  """Trains and evaluates a DdqnAgent until `num_env_steps`.

  Args:
    root_dir: the run directory; an existing run there is resumed.
    num_env_steps: absolute target of env steps for the run.
    replay_capacity: maximum number of transitions in the replay table.
    batch_size: sampled sequences per gradient step.
    initial_collect_steps: env steps of uniformly random actions at the start.
    num_envs: environments stepped as one batch by a collector.
    collect_steps_per_iteration: env steps (over all envs) between training calls.
    train_steps_per_iteration: gradient steps per compiled training call; the
      replay ratio train_steps_per_iteration / collect_steps_per_iteration is
      held over the env steps actually collected.
    eval_interval, eval_episodes: greedy evaluation every that many env steps.
    eval_epsilon: evaluation acts epsilon-greedy with this (Atari: 0.05); 0 = greedy.
    final_eval_episodes: episodes of the final policy (and of best_policy) at the
      target, written to ROOT/results.json.
    checkpoint_interval: env steps between checkpoints (TF, Reverb, policies).
    log_interval: env steps between rows of metrics.csv and progress lines.
    seed: seeds environments, networks and sampling.
    prioritized_replay: prioritized sampling with importance weights (settings
      in `PrioritizedReplay`); otherwise uniform.
    job: `all` runs everything in this process; `replay`, `collect`, `learn`
      and `eval` are the jobs of a distributed run (see distributed.py).
    replay_address: host:port of the Reverb server of a distributed run.
    collector_id: which collector this is (`--job=collect`): its seed and file.
  """
  cfg = RunConfig(root_dir, num_env_steps, replay_capacity, batch_size, initial_collect_steps,
                  num_envs, collect_steps_per_iteration, train_steps_per_iteration,
                  eval_interval, eval_episodes, checkpoint_interval, log_interval, seed,
                  prioritized_replay, job, replay_address, eval_epsilon, final_eval_episodes)
  cfg.validate()
  seed_everything(seed)
  if job == 'all':
    if replay_address:
      raise UsageError('--job=all runs its own replay server: drop --replay_address, or run '
                       'the replay, collect and learn jobs separately')
    run_single_process(cfg)
  else:
    from harness import distributed  # pylint: disable=g-import-not-at-top
    distributed.run_job(cfg, collector_id)


def run_single_process(cfg: RunConfig) -> None:
  """Collection, replay, training and evaluation in this process."""
  # Environments and agent first: an unknown id or a continuous action space
  # fails here, before anything is written to root_dir.
  collect_env = make_collect_env(cfg, cfg.seed)
  parts = build_agent(cfg, collect_env)
  run_dir = RunDirectory(cfg.root_dir, parts)
  run_state, train_step = parts.run_state, parts.train_step
  clock = checkpoints.WallClock(run_state)
  stats = metrics.EpisodeStats(num_envs=cfg.num_envs)
  run_state.load_stats(stats)

  layout = replay_layout(cfg, parts)
  table = make_replay_table(cfg, layout)
  pair_warning = (checkpoints.check_replay_pair(run_state, replay.replay_dir(cfg.root_dir))
                  if run_dir.checkpointer.restored else None)
  server = replay.start_server([table], replay.replay_dir(cfg.root_dir))
  address = f'localhost:{server.port}'
  client = server.localhost_client()
  replay_observer = layout.make_observer(client, cfg.num_envs)
  collector = collect.Collector(collect_env, parts.agent.collect_policy,
                                [replay_observer, stats], cfg.collect_steps_per_iteration)
  per = prioritized_settings(cfg)
  priorities = per and learn.PriorityUpdater(per, address, replay.TABLE, train_step,
                                             run_state.max_priority, layout.rows_per_item)
  trainer = learn.Trainer(parts.agent, layout.make_dataset(address, cfg.batch_size),
                          cfg.train_steps_per_iteration, priorities)
  run_dir.write_launch_files(pair_warning)
  reporter = Reporter(cfg, parts, run_dir.restored_step)

  def save_checkpoint() -> None:
    replay_observer.flush()
    run_state.save_stats(stats)
    clock.record()
    checkpoints.save_pair(client, run_dir.checkpointer, run_state, train_step)
    reporter.exporter.save_current()

  # Initial random collect: the first `initial_collect_steps` env steps of a run.
  started = stats.env_steps
  collector.collect_random(min(cfg.initial_collect_steps, cfg.num_env_steps) - stats.env_steps)
  run_state.set_env_steps(stats.env_steps)
  reporter.start_clock(stats.env_steps)
  loss = float('nan')
  while stats.env_steps < cfg.num_env_steps:
    before = stats.env_steps
    if priorities:  # new items enter with the highest priority given so far
      replay_observer.update_priority(float(run_state.max_priority.numpy()))
    collector.run()
    run_state.set_env_steps(stats.env_steps)
    # Gradient steps follow the env steps actually collected after the initial
    # collect (a batched driver step can overshoot), so train_step stays at
    # replay_ratio * (env_steps - initial_collect_steps).
    due = (stats.env_steps - cfg.initial_collect_steps) * cfg.replay_ratio
    while int(train_step.numpy()) + trainer.steps_per_call / 2 <= due:
      loss = trainer()
    after = stats.env_steps
    done = after >= cfg.num_env_steps
    if crossed(before, after, cfg.log_interval) or done:
      reporter.log(metrics_row(parts, after, loss,
                               replay.table_size(client) * layout.rows_per_item,
                               stats.average_return(), trainer, collector.trace_count()))
    if crossed(before, after, cfg.eval_interval) or done:
      reporter.evaluate(after)
    if crossed(before, after, cfg.checkpoint_interval) or done:
      save_checkpoint()

  if stats.env_steps == started or not os.path.exists(reporter.exporter.path('greedy_policy')):
    # Nothing new was trained (target already reached): still leave a complete run dir.
    save_checkpoint()
  reporter.write_results(stats.env_steps, stats.episodes, clock.total())
  logging.info('Done: env_steps %d, train_step %d', stats.env_steps, int(train_step.numpy()))
  replay_observer.close()
  reporter.close()
  server.stop()
