"""What a run reports: CSV files, TensorBoard scalars, episode statistics, RSS."""

from __future__ import annotations

import collections
import csv
import os
from typing import Dict, Iterable, List, Optional

import numpy as np
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from harness.base import disk

_LAST = int(ts.StepType.LAST)

METRICS_COLUMNS = [
    'train_step', 'env_steps', 'wall_time', 'steps_per_sec', 'loss', 'epsilon',
    'learning_rate', 'replay_size', 'avg_return', 'rss_mb', 'train_traces',
    'policy_traces', 'per_beta', 'mean_priority']
EVAL_COLUMNS = [
    'train_step', 'env_steps', 'wall_time', 'avg_return', 'std_return',
    'avg_episode_length', 'episodes']


class CsvLog:
  """An append-only CSV file with a fixed header, flushed after every row.

  A failed write (full disk) raises `disk.WriteError`; a row it tore is
  dropped by `keep_rows_up_to` when the run resumes.
  """

  def __init__(self, path: str, columns: List[str]):
    self.path = path
    self.columns = columns

  def append(self, row: Dict[str, object]) -> None:
    new_file = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
    with disk.writing(self.path), open(self.path, 'a', newline='') as f:
      writer = csv.DictWriter(f, fieldnames=self.columns, extrasaction='ignore')
      if new_file:
        writer.writeheader()
      writer.writerow({k: _format(row.get(k)) for k in self.columns})

  def keep_rows_up_to(self, train_step: int) -> int:
    """Drops rows after `train_step` (never checkpointed) and torn rows.

    After a crash the file may hold rows past the checkpoint the run resumes
    from, which the resumed run would write again; the file is rewritten
    atomically (temporary file + rename), so it is never left truncated.
    Returns the number of rows dropped.
    """
    if not os.path.exists(self.path):
      return 0
    rows = self.rows()
    torn = not _ends_with_newline(self.path)
    kept = [r for r in (rows[:-1] if torn else rows)
            if None not in r.values() and r.get('train_step', '').isdigit()
            and int(r['train_step']) <= train_step]
    if len(kept) == len(rows) and not torn:
      return 0
    tmp = self.path + '.tmp'
    with disk.writing(self.path, cleanup=lambda: os.remove(tmp)):
      with open(tmp, 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=self.columns, extrasaction='ignore')
        writer.writeheader()
        writer.writerows(kept)
        f.flush()
        os.fsync(f.fileno())
      os.replace(tmp, self.path)
    return len(rows) - len(kept)

  def rows(self) -> List[Dict[str, str]]:
    if not os.path.exists(self.path):
      return []
    with open(self.path, newline='') as f:
      return list(csv.DictReader(f))


def _ends_with_newline(path: str) -> bool:
  with open(path, 'rb') as f:
    f.seek(0, os.SEEK_END)
    if f.tell() == 0:
      return True
    f.seek(-1, os.SEEK_END)
    return f.read(1) == b'\n'


def _format(value: object) -> object:
  if isinstance(value, (float, np.floating)):
    # Six significant digits, but wall-clock seconds keep their milliseconds.
    return f'{float(value):.3f}' if abs(value) >= 1e5 else f'{float(value):.6g}'
  return '' if value is None else value


# Training episodes in `EpisodeStats.train_return_last100`.
TRAIN_RETURN_WINDOW = 100


class EpisodeStats:
  """Observer of (possibly batched) trajectories: env steps and episode returns.

  Our own rather than `py_metrics`: its state (counters and recent returns)
  must go into the TF checkpoint so a resumed run continues its averages.
  """

  def __init__(self, num_envs: int, window: int = 10):
    self.env_steps = 0
    self.episodes = 0
    self._returns = np.zeros(num_envs, np.float64)
    self._lengths = np.zeros(num_envs, np.int64)
    self.recent_returns = collections.deque(maxlen=window)
    self.recent_lengths = collections.deque(maxlen=window)
    # MinAtar's (and Dopamine's) published curves: the mean return of the last
    # 100 training episodes, results.json's `train_return_last100`.
    self.last100_returns = collections.deque(maxlen=TRAIN_RETURN_WINDOW)

  def __call__(self, traj) -> None:
    reward = np.atleast_1d(traj.reward)
    # Step types compared in numpy: tf-agents' is_boundary() / is_last() first
    # ask tf.is_tensor, about 50 us per call on a numpy array (harness.rl.collect).
    not_boundary = np.atleast_1d(traj.step_type) != _LAST
    self.env_steps += int(not_boundary.sum())
    self._returns += np.where(not_boundary, reward, 0.0)
    self._lengths += not_boundary
    for i in np.flatnonzero(np.atleast_1d(traj.next_step_type) == _LAST):
      self.recent_returns.append(float(self._returns[i]))
      self.last100_returns.append(float(self._returns[i]))
      self.recent_lengths.append(int(self._lengths[i]))
      self.episodes += 1
      self._returns[i] = 0.0
      self._lengths[i] = 0

  def average_return(self) -> float:
    return float(np.mean(self.recent_returns)) if self.recent_returns else float('nan')

  def train_return_last100(self) -> Optional[float]:
    """Mean return of the last 100 training episodes (fewer early on); None before any."""
    return float(np.mean(self.last100_returns)) if self.last100_returns else None


class SummaryWriter:
  """TensorBoard scalars written eagerly from Python (never inside a tf.function).

  A failed write (full disk) raises `disk.WriteError`.
  """

  def __init__(self, logdir: str):
    self._logdir = logdir
    with disk.writing(logdir):
      self._writer = tf.summary.create_file_writer(logdir)

  def scalars(self, step: int, values: Dict[str, Optional[float]]) -> None:
    with disk.writing(self._logdir), self._writer.as_default():
      for name, value in values.items():
        if value is not None and np.isfinite(value):
          # numpy values: TF keeps a tensor per distinct Python scalar (RunState.set_env_steps).
          tf.summary.scalar(name, np.float64(value), step=np.int64(step))
      self._writer.flush()

  def close(self) -> None:
    with disk.writing(self._logdir):
      self._writer.close()


def format_progress(row: Dict[str, object], target: int, eta_s: Optional[float]) -> str:
  """One readable progress line for the log."""
  eta = '?' if eta_s is None else _duration(eta_s)
  return ('env_steps %d/%d  %.0f steps/s  loss %.4g  eps %.3f  lr %.3g  return %.1f  '
          'replay %d  rss %.0f MiB  traces train=%s policy=%s  ETA %s' % (
              row['env_steps'], target, row['steps_per_sec'], row['loss'],
              row['epsilon'], row['learning_rate'], row['avg_return'],
              row['replay_size'], row['rss_mb'], row['train_traces'],
              row['policy_traces'], eta))


def _duration(seconds: float) -> str:
  seconds = int(seconds)
  return f'{seconds // 3600}h{seconds % 3600 // 60:02d}m' if seconds >= 3600 else (
      f'{seconds // 60}m{seconds % 60:02d}s')


def mean_std(values: Iterable[float]):
  values = np.asarray(list(values), np.float64)
  return float(values.mean()), float(values.std())
