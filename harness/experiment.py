"""`train_eval`: wires envs, agent, replay, collection, training and reporting.

This is the only module that knows how the pieces connect.
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
from tf_agents.specs import tensor_spec
from tf_agents.train.utils import train_utils

from harness import agents
from harness import checkpoints
from harness import collect
from harness import envs
from harness import learn
from harness import metrics
from harness import replay
from harness import resume
from harness.errors import UsageError


def _check_positive(**values: int) -> None:
  for name, value in values.items():
    if value is None or value <= 0:
      raise UsageError(f'train_eval.{name}={value} must be a positive number of '
                       f'steps, e.g. --gin_bindings="train_eval.{name}=1000"')


def _crossed(before: int, after: int, interval: int) -> bool:
  """True when an interval boundary lies in (before, after]."""
  return after // interval > before // interval


def _seed_everything(seed: int) -> None:
  random.seed(seed)
  np.random.seed(seed)
  tf.random.set_seed(seed)


@dataclasses.dataclass
class _Evaluation:
  """Greedy-policy evaluation on an env of its own."""
  env: object
  policy: object
  episodes: int

  def run(self) -> metrics.EpisodeStats:
    stats = metrics.EpisodeStats(num_envs=1, window=self.episodes)
    driver = py_driver.PyDriver(self.env, self.policy, [stats], max_episodes=self.episodes)
    driver.run(self.env.reset())
    return stats


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
               checkpoint_interval: int = 10_000,
               log_interval: int = 1_000,
               seed: int = 0,
               prioritized_replay: bool = False,
               replay_address: Optional[str] = None) -> None:
  """Trains and evaluates a DdqnAgent in one process until `num_env_steps`.

  Args:
    root_dir: the run directory; an existing run there is resumed.
    num_env_steps: absolute target of env steps for the run.
    replay_capacity: maximum number of items in the replay table.
    batch_size: sampled sequences per gradient step.
    initial_collect_steps: env steps of uniformly random actions at the start.
    num_envs: environments stepped as one batch by the collector.
    collect_steps_per_iteration: env steps (over all envs) between training calls.
    train_steps_per_iteration: gradient steps per compiled training call; the
      replay ratio train_steps_per_iteration / collect_steps_per_iteration is
      held over the env steps actually collected.
    eval_interval, eval_episodes: greedy evaluation every that many env steps.
    checkpoint_interval: env steps between checkpoints (TF, Reverb, policies).
    log_interval: env steps between rows of metrics.csv and progress lines.
    seed: seeds environments, networks and sampling.
    prioritized_replay: prioritized sampling with importance weights (settings
      in `PrioritizedReplay`); otherwise uniform.
    replay_address: host:port of an external Reverb server (not available yet).
  """
  _check_positive(num_env_steps=num_env_steps, replay_capacity=replay_capacity,
                  batch_size=batch_size, num_envs=num_envs,
                  collect_steps_per_iteration=collect_steps_per_iteration,
                  train_steps_per_iteration=train_steps_per_iteration,
                  eval_interval=eval_interval, eval_episodes=eval_episodes,
                  checkpoint_interval=checkpoint_interval, log_interval=log_interval)
  if initial_collect_steps < 0:
    raise UsageError(f'train_eval.initial_collect_steps={initial_collect_steps} must be >= 0')
  if batch_size % num_envs:
    raise UsageError(f'train_eval.batch_size={batch_size} must be a multiple of '
                     f'train_eval.num_envs={num_envs}: a replay item holds one step of each env')
  if replay_address:
    raise UsageError('an external replay server is not available yet: drop --replay_address')
  _seed_everything(seed)

  # Environments first: an unknown id or a continuous action space fails here,
  # before anything is written to root_dir.
  collect_env = envs.make_batched_env(num_envs, seed) if num_envs > 1 else envs.make_env(seed=seed)
  eval_env = envs.make_env(seed=seed + 10_000)
  time_step_spec = tensor_spec.from_spec(collect_env.time_step_spec())
  action_spec = tensor_spec.from_spec(collect_env.action_spec())

  train_step = train_utils.create_train_step()
  run_state = checkpoints.RunState()
  agent = agents.make_agent(time_step_spec, action_spec, train_step, run_state.env_steps)
  sequence_length = agent._n_step_update + 1  # pylint: disable=protected-access
  if num_envs > 1 and sequence_length != 2:
    raise UsageError(f'train_eval.num_envs={num_envs} needs make_agent.n_step_update=1 (grouped '
                     'replay items run across episode ends); use num_envs=1 for n-step targets')

  # A resume with a change that cannot apply stops here, before ROOT is touched.
  config_dir = os.path.join(root_dir, 'config')
  operative_config = gin.operative_config_str()
  binding_changes = resume.check_changes(config_dir, operative_config)
  checkpointer = checkpoints.ResumableCheckpointer(root_dir, agent, run_state)
  reapplied = checkpointer.initialize_or_restore()
  stats = metrics.EpisodeStats(num_envs=num_envs)
  run_state.load_stats(stats)
  restored_step = int(train_step.numpy())
  if checkpointer.restored:
    logging.info('Resumed from %s at train_step %d, env_steps %d', checkpointer.latest(),
                 restored_step, stats.env_steps)
  os.makedirs(config_dir, exist_ok=True)

  per_settings = learn.PrioritizedReplay() if prioritized_replay else None
  table = replay.make_table(
      agent.collect_data_spec, sequence_length, replay_capacity, num_envs,
      priority_exponent=per_settings.priority_exponent if per_settings else None)
  pair_warning = (checkpoints.check_replay_pair(run_state, replay.replay_dir(root_dir))
                  if checkpointer.restored else None)
  server = replay.start_server([table], replay.replay_dir(root_dir))
  address = f'localhost:{server.port}'
  client = server.localhost_client()
  replay_observer = replay.make_observer(client, sequence_length, num_envs)

  collector = collect.Collector(collect_env, agent.collect_policy,
                                [replay_observer, stats], collect_steps_per_iteration)
  evaluation = _Evaluation(eval_env, collect.eager_policy(agent.policy, eval_env), eval_episodes)
  dataset = replay.make_dataset(agent.collect_data_spec, address, sequence_length, batch_size,
                                num_envs)
  priorities = per_settings and learn.PriorityUpdater(
      per_settings, address, replay.TABLE, train_step, run_state.max_priority, num_envs)
  trainer = learn.Trainer(agent, dataset, train_steps_per_iteration, priorities)
  exporter = checkpoints.PolicyExporter(root_dir, agent)
  learning_rate = agents.learning_rate_variable(agent)

  with open(os.path.join(config_dir, f'operative_config-{restored_step}.gin'), 'w') as f:
    f.write(operative_config)
  if checkpointer.restored:
    report = resume.write_report(config_dir, restored_step, binding_changes, reapplied,
                                 pair_warning)
    logging.info('Resume report (%s):\n%s', report, open(report).read())

  metrics_csv = metrics.CsvLog(os.path.join(root_dir, 'metrics.csv'), metrics.METRICS_COLUMNS)
  eval_csv = metrics.CsvLog(os.path.join(root_dir, 'eval.csv'), metrics.EVAL_COLUMNS)
  # Rows written after the checkpoint we resume from would be written again.
  for log in (metrics_csv, eval_csv):
    dropped = log.keep_rows_up_to(restored_step)
    if dropped:
      logging.info('Dropped %d rows after train_step %d from %s', dropped, restored_step,
                   log.path)
  train_summaries = metrics.SummaryWriter(checkpoints.train_dir(root_dir))
  eval_summaries = metrics.SummaryWriter(os.path.join(root_dir, 'eval'))

  def evaluate() -> None:
    result = evaluation.run()
    mean, std = metrics.mean_std(result.recent_returns)
    length = float(np.mean(result.recent_lengths))
    row = {'train_step': int(train_step.numpy()), 'env_steps': stats.env_steps,
           'wall_time': time.time(), 'avg_return': mean, 'std_return': std,
           'avg_episode_length': length, 'episodes': result.episodes}
    eval_csv.append(row)
    eval_summaries.scalars(row['train_step'], {
        'eval/avg_return': mean, 'eval/avg_episode_length': length})
    logging.info('eval at env_steps %d: return %.1f +- %.1f over %d episodes',
                 stats.env_steps, mean, std, result.episodes)
    if mean > float(run_state.best_eval_return.numpy()):
      run_state.best_eval_return.assign(mean)
      exporter.save_best()

  def save_checkpoint() -> None:
    replay_observer.flush()
    run_state.save_stats(stats)
    checkpoints.save_pair(client, checkpointer, run_state, train_step)
    exporter.save_current()

  # Initial random collect: the first `initial_collect_steps` env steps of a run.
  started = stats.env_steps
  collector.collect_random(min(initial_collect_steps, num_env_steps) - stats.env_steps)
  run_state.env_steps.assign(stats.env_steps)

  last_log = (time.time(), stats.env_steps)
  start_time, start_steps = last_log
  loss = float('nan')
  # Gradient steps follow the env steps actually collected (a batched driver
  # step can overshoot), so train_step stays at replay_ratio * env_steps.
  replay_ratio = train_steps_per_iteration / collect_steps_per_iteration
  while stats.env_steps < num_env_steps:
    before = stats.env_steps
    if priorities:  # new items enter with the highest priority given so far
      replay_observer.update_priority(float(run_state.max_priority.numpy()))
    collector.run()
    run_state.env_steps.assign(stats.env_steps)
    due = (stats.env_steps - initial_collect_steps) * replay_ratio
    while int(train_step.numpy()) + trainer.steps_per_call / 2 <= due:
      loss = trainer()
    after = stats.env_steps

    if _crossed(before, after, log_interval) or after >= num_env_steps:
      now = time.time()
      row = {'train_step': int(train_step.numpy()), 'env_steps': after,
             'wall_time': now,
             'steps_per_sec': (after - last_log[1]) / max(now - last_log[0], 1e-9),
             'loss': loss, 'epsilon': float(agent.epsilon_schedule().numpy()),
             'learning_rate': float(learning_rate.numpy()),
             'replay_size': replay.table_size(client) * num_envs,
             'avg_return': stats.average_return(), 'rss_mb': metrics.rss_mb(),
             'train_traces': trainer.trace_count(),
             'policy_traces': collector.trace_count(),
             'per_beta': float(priorities.beta.numpy()) if priorities else None,
             'mean_priority': (float(priorities.mean_sampled_priority.numpy())
                               if priorities else None)}
      last_log = (now, after)
      metrics_csv.append(row)
      train_summaries.scalars(row['train_step'], {
          k: row[k] for k in ('loss', 'epsilon', 'learning_rate', 'replay_size',
                              'avg_return', 'rss_mb', 'steps_per_sec')})
      rate = (after - start_steps) / max(now - start_time, 1e-9)
      eta = (num_env_steps - after) / rate if rate > 0 else None
      logging.info('%s', metrics.format_progress(row, num_env_steps, eta))

    if _crossed(before, after, eval_interval) or after >= num_env_steps:
      evaluate()
    if _crossed(before, after, checkpoint_interval) or after >= num_env_steps:
      save_checkpoint()

  if stats.env_steps == started or not os.path.exists(exporter.path('greedy_policy')):
    # Nothing new was trained (target already reached): still leave a complete run dir.
    save_checkpoint()
  logging.info('Done: env_steps %d, train_step %d', stats.env_steps, int(train_step.numpy()))
  replay_observer.close()
  train_summaries.close()
  eval_summaries.close()
  server.stop()
