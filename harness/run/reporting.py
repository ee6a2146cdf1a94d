"""What a run reports: metrics rows, evaluations, exported policies, the final results.

`Reporter` owns `metrics.csv`, `eval.csv`, TensorBoard, the progress line, the
policy exports, the videos (`ROOT/videos/`), `results.json` and, with
`--track`, the W&B run (`harness.base.tracking`); every training job (one process,
or the learner of a distributed run) reports through it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Optional

from absl import logging
import gin
import numpy as np
from tf_agents.environments import py_environment
from tf_agents.policies import py_tf_eager_policy

from harness.base import disk
from harness.base import memory
from harness.rl import collect
from harness.rl import envs
from harness.rl import learn
from harness.run import evaluation
from harness.run import video
from harness.run.parts import AgentParts
from harness.run.settings import RunConfig
from harness.rundir import checkpoints
from harness.rundir import metrics
from harness.rundir import results


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
    self.exporter.prepare()
    self._evaluation = self._make_evaluation(self._greedy_policy, cfg.eval_episodes,
                                             cfg.seed + 10_000)
    self._recorder = (video.Recorder(root, envs.make_env, self._greedy_policy, cfg.seed + 30_000,
                                     cfg.video_format, epsilon=cfg.eval_epsilon)
                      if cfg.video_interval else None)
    self._tracker = None
    # One W&B run per ROOT: the job that writes the checkpoints streams to it.
    if cfg.track and cfg.job in ('all', 'learn'):
      from harness.base import tracking  # pylint: disable=g-import-not-at-top  (an optional extra)
      settings = {k: v for k, v in dataclasses.asdict(cfg).items()
                  if k not in ('root_dir', 'track', 'replay_address', 'collector_id')}
      try:
        self._tracker = tracking.Tracker(root, settings, gin.operative_config_str())
      except Exception as e:  # pylint: disable=broad-except  (W&B unreachable: train anyway)
        logging.warning('W&B tracking did not start (%s): the run goes on without it; '
                        'TensorBoard and the csv files have everything', str(e).split('\n')[0])
    self._last = None
    self._start = None

  def _greedy_policy(self, env: py_environment.PyEnvironment):
    """The greedy policy as a py policy for `env` (evaluations and videos add
    `eval_epsilon` themselves, per env, and refresh its weights before playing)."""
    return collect.py_policy_for(self._parts.agent.policy, env)

  def _make_evaluation(self, policy_for, episodes: int, seed: int) -> evaluation.Evaluation:
    """Episodes side by side on envs of their own (seeds seed, seed+1, ...)."""
    env = evaluation.make_eval_env(episodes, seed)
    return evaluation.Evaluation(env, policy_for(env), episodes,
                                 epsilon=self._cfg.eval_epsilon, seed=seed)

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
    if self._tracker:
      self._tracker.log('train', row)
    rate = (env_steps - self._start[1]) / max(now - self._start[0], 1e-9)
    eta = max(0, self._cfg.num_env_steps - env_steps) / rate if rate > 0 else None
    logging.info('%s', metrics.format_progress(row, self._cfg.num_env_steps, eta))

  def train_step(self) -> int:
    return int(self._parts.train_step.numpy())

  def start_clock(self, env_steps: int) -> None:
    """Rates count from here (after start-up and the initial collect)."""
    self._last = self._start = (time.time(), env_steps)

  def evaluate(self, env_steps: int) -> None:
    """Runs the greedy policy; exports it as best_policy when it beats the best."""
    train_step = int(self._parts.train_step.numpy())
    result = self._evaluation.run()
    mean, std = metrics.mean_std(result.returns)
    length = float(np.mean(result.lengths))
    row = {'train_step': train_step, 'env_steps': env_steps, 'wall_time': time.time(),
           'avg_return': mean, 'std_return': std, 'avg_episode_length': length,
           'episodes': result.episodes}
    self.eval_csv.append(row)
    if self._tracker:
      self._tracker.log('eval', row)
    self._eval_summaries.scalars(train_step, {'eval/avg_return': mean,
                                              'eval/avg_episode_length': length})
    logging.info('eval at env_steps %d: return %.1f +- %.1f over %d episodes', env_steps,
                 mean, std, result.episodes)
    best = self._parts.run_state.best_eval_return
    if mean > float(best.numpy()):
      best.assign(mean)
      self.exporter.save_best()

  def record_video(self, env_steps: int) -> None:
    """Records one episode of the evaluation policy to ROOT/videos/<env_steps>.<format>."""
    if not self._recorder:
      return
    with disk.writing(self._recorder.path(env_steps)):
      path, episode_return, length = self._recorder.record(env_steps)
    logging.info('video at env_steps %d: %s (%d steps, return %.1f)', env_steps, path, length,
                 episode_return)
    if self._tracker:
      self._tracker.video(env_steps, path)

  def write_results(self, env_steps: int, episodes: int, wall_seconds: float,
                    train_return_last100: Optional[float] = None) -> None:
    """Evaluates the final greedy policy and best_policy; writes ROOT/results.json.

    `train_return_last100` (the mean return of the last 100 training episodes,
    the protocol of MinAtar's and Dopamine's published curves) goes in beside
    the greedy `final_return`; null where the job does not see the episodes.

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
    final = self._run_once(self._make_evaluation(self._greedy_policy, episodes_each, seed))
    final_mean, final_std = metrics.mean_std(final.returns)
    best_mean, best_std = final_mean, final_std
    best_dir = self.exporter.path('best_policy')
    if os.path.isfile(os.path.join(best_dir, 'saved_model.pb')):
      best = self._run_once(self._make_evaluation(lambda env: self._saved_policy(best_dir),
                                                  episodes_each, seed))
      best_mean, best_std = metrics.mean_std(best.returns)
    values = {
        'final_return': final_mean, 'final_return_std': final_std,
        'best_policy_return': best_mean, 'best_policy_return_std': best_std,
        'best_eval_return': float(self._parts.run_state.best_eval_return.numpy()),
        'env_steps': env_steps, 'train_step': train_step, 'wall_seconds': wall_seconds,
        'episodes': episodes, 'final_eval_episodes': episodes_each,
        'train_return_last100': train_return_last100,
        'eval_epsilon': self._cfg.eval_epsilon, 'num_env_steps': self._cfg.num_env_steps}
    path = results.write_results(self._cfg.root_dir, values)
    if self._tracker:
      self._tracker.summary(values)
    logging.info('final policy: return %.1f +- %.1f over %d episodes; best_policy: %.1f +- %.1f '
                 '(%s)', final_mean, final_std, episodes_each, best_mean, best_std, path)

  @staticmethod
  def _run_once(once: evaluation.Evaluation) -> evaluation.EvalResult:
    try:
      return once.run()
    finally:
      once.close()

  def _saved_policy(self, policy_dir: str):
    """An exported policy as a py policy for a batched env."""
    return py_tf_eager_policy.SavedModelPyTFEagerPolicy(
        policy_dir, load_specs_from_pbtxt=True, use_tf_function=True, batch_time_steps=False)

  def close(self) -> None:
    self._evaluation.close()
    self._train_summaries.close()
    self._eval_summaries.close()
    if self._recorder:
      self._recorder.close()
    if self._tracker:
      self._tracker.close()


def describe_run(cfg: RunConfig, parts: AgentParts, env_id: str) -> str:
  """The start-up summary line: run directory, agent, environment, target."""
  built = parts.built
  agent = built.name
  options = list(built.features)
  options += [f'{built.n_step_update}-step targets'] if built.n_step_update > 1 else []
  options += ['prioritized replay'] if cfg.prioritized_replay else []
  if options:
    agent += f' ({", ".join(options)})'
  return (f'Run {cfg.root_dir}: {agent} on {env_id}, {cfg.num_env_steps} env steps '
          f'({cfg.num_envs} env{"s" if cfg.num_envs > 1 else ""}, replay ratio '
          f'{cfg.replay_ratio:g}, seed {cfg.seed})')


def metrics_row(parts: AgentParts, env_steps: int, loss: float, replay_size: int,
                avg_return: float, trainer: learn.Trainer,
                policy_traces: Optional[int]) -> dict:
  """One metrics.csv row; epsilon and learning rate come from the live variables."""
  priorities = trainer.priorities
  # Free heap pages go back to the OS first, so rss_mb is what the run holds.
  memory.release_free_memory()
  return {'train_step': int(parts.train_step.numpy()), 'env_steps': env_steps,
          'wall_time': time.time(), 'loss': loss,
          'epsilon': float(parts.built.epsilon().numpy()),
          'learning_rate': float(parts.built.learning_rate.numpy()),
          'replay_size': replay_size, 'avg_return': avg_return, 'rss_mb': memory.rss_mb(),
          'train_traces': trainer.trace_count(), 'policy_traces': policy_traces,
          'per_beta': float(priorities.beta.numpy()) if priorities else None,
          'mean_priority': (float(priorities.mean_sampled_priority.numpy())
                            if priorities else None)}
