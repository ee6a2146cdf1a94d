"""The record of a sweep's trials: `SWEEP/trials.csv` and `summary.csv`, kept in memory.

Every launch derives all trials from the spec and what trials.csv holds; the
Tune callback (`sweep_tune`) moves rows along as trials start and end. No
TensorFlow and no Ray here.
"""

from __future__ import annotations

from concurrent import futures
import math
import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import logging

from harness.rundir import results
from harness.sweeps import aggregate
from harness.sweeps import spec as sweep_spec
from harness.sweeps.spec import Spec

MAX_FAILURES = 2  # A failed trial is retried once: run again while failures < 2.


class TrialTable:
  """Rows of trials.csv, kept in memory and rewritten (with summary.csv) on change.

  summary.csv is written on a thread of its own (`write`); `flush` waits for it.
  """

  def __init__(self, root: str, spec: Spec):
    self.root = root
    self.spec = spec
    self.swept = [s.name for s in spec.sweeps]
    self.rows: Dict[str, Dict[str, Any]] = {}
    self._summary_cache: Dict[Tuple, Dict[str, Any]] = {}
    self._start_summary_writer()
    stored = aggregate.read_csv(os.path.join(root, aggregate.TRIALS_FILE))
    if spec.search == 'grid':
      for point in sweep_spec.grid_points(spec.sweeps):
        for seed in spec.seeds:
          self._add(sweep_spec.make_trial(spec.sweeps, point, seed))
    else:  # Optuna: the points tried so far are those in trials.csv.
      for row in stored:
        point = {name: row.get(name, '') for name in self.swept}
        self._add(sweep_spec.make_trial(spec.sweeps, point, int(row['seed'])))
    by_id = {row['trial_id']: row for row in stored}
    for tid, row in self.rows.items():
      self._restore(row, by_id.get(tid))

  def _start_summary_writer(self) -> None:
    self._summary_lock = threading.Lock()
    self._summary_writer = futures.ThreadPoolExecutor(max_workers=1,
                                                      thread_name_prefix='summary')
    self._summary_written: Optional[futures.Future] = None

  def __getstate__(self) -> Dict[str, Any]:
    # Tune pickles its callbacks, this table with them, for a Tuner.restore we
    # never use; the thread and its lock stay behind.
    state = dict(self.__dict__)
    for name in ('_summary_lock', '_summary_writer', '_summary_written'):
      del state[name]
    return state

  def __setstate__(self, state: Dict[str, Any]) -> None:
    self.__dict__.update(state)
    self._start_summary_writer()

  @property
  def total(self) -> int:
    if self.spec.search == 'optuna':
      return (self.spec.num_trials or 0) * len(self.spec.seeds)
    return len(self.rows)

  def _add(self, trial: sweep_spec.Trial) -> Dict[str, Any]:
    if trial.trial_id not in self.rows:
      self.rows[trial.trial_id] = {
          'trial_id': trial.trial_id, **trial.point, 'seed': trial.seed, 'status': 'pending',
          'error': '', 'attempts': 0, 'failures': 0, 'wall_seconds': 0.0,
          '_point': trial.point, '_point_id': trial.point_id}
    return self.rows[trial.trial_id]

  def _restore(self, row: Dict[str, Any], stored: Optional[Dict[str, str]]) -> None:
    """A row's state from trials.csv and its run directory."""
    if stored:
      row['attempts'] = int(aggregate.number(stored.get('attempts')) or 0)
      failures = aggregate.number(stored.get('failures'))
      row['failures'] = int(failures) if math.isfinite(failures) else 0
      wall = aggregate.number(stored.get('wall_seconds'))
      row['wall_seconds'] = wall if math.isfinite(wall) else 0.0
      if stored.get('status') in ('failed', 'stopped'):
        row['status'] = stored['status']
        row['error'] = stored.get('error', '')
    res = results.read_results(sweep_spec.trial_dir(self.root, row['trial_id']))
    if res is not None:
      self._set_results(row, res)
      if not row['wall_seconds']:
        row['wall_seconds'] = res.get('wall_seconds')

  def _set_results(self, row: Dict[str, Any], res: Dict[str, Any]) -> None:
    row.update(status='done', error='', final_return=res.get('final_return'),
               best_policy_return=res.get('best_policy_return'),
               train_return_last100=res.get('train_return_last100'),
               env_steps=res.get('env_steps'))

  def to_run(self, row: Dict[str, Any]) -> bool:
    """Whether this launch runs the trial."""
    if row['status'] == 'done' or row['status'] == 'stopped':
      return False
    return not (row['status'] == 'failed' and row['failures'] >= MAX_FAILURES)

  def remaining(self) -> List[Dict[str, Any]]:
    return [row for row in self.rows.values() if self.to_run(row)]

  def finished_count(self) -> int:
    return sum(1 for r in self.rows.values() if r['status'] in ('done', 'failed', 'stopped'))

  def points(self) -> List[Tuple[sweep_spec.Point, List[Dict[str, Any]]]]:
    """(point, its rows) in first-seen order."""
    return _by_point(self.rows.values())

  # Tune events.

  def started(self, point: sweep_spec.Point, seeds: Sequence[int]) -> None:
    for seed in seeds:
      row = self._add(sweep_spec.make_trial(self.spec.sweeps, point, seed))
      if row['status'] != 'done':
        row['status'] = 'running'
        row['attempts'] += 1
    self.write()

  def finished(self, point: sweep_spec.Point, children: Sequence[Dict[str, Any]],
               stopped: bool) -> None:
    """Records the children's outcomes and logs one line per trial that ended now."""
    for child in children:
      row = self.rows.get(child['trial_id'])
      if row is None:
        continue
      was = row['status']
      row['wall_seconds'] = (row.get('wall_seconds') or 0.0) + child.get('wall_seconds', 0.0)
      if child['status'] == 'done':
        res = results.read_results(sweep_spec.trial_dir(self.root, row['trial_id']))
        if res is not None:
          self._set_results(row, res)
        else:
          row.update(status='failed', error='no results.json after the run')
      elif child['status'] in ('running', 'waiting', 'stopped') and stopped:
        row.update(status='stopped', error='stopped early by ASHA (objective below the rung)')
      elif child['status'] in ('running', 'waiting', 'stopped', 'pending'):
        row.update(status='pending')  # Interrupted: the next launch resumes it.
        continue
      else:
        row.update(status='failed', error=child.get('error') or 'failed')
      if row['status'] == 'failed':
        row['failures'] += 1
      if was != 'done' or child.get('launches'):
        self._log_line(row, child)
    self.write()

  def errored(self, point: sweep_spec.Point, seeds: Sequence[int], message: str) -> None:
    """A Tune trial that raised (not a failed child): its rows failed with `message`."""
    for seed in seeds:
      row = self._add(sweep_spec.make_trial(self.spec.sweeps, point, seed))
      if row['status'] != 'done':
        row.update(status='failed', error=message)
        row['failures'] += 1
        self._log_line(row, {})
    self.write()

  def interrupted(self) -> int:
    """Rows still running after Tune returned (Ctrl-C): back to pending."""
    count = 0
    for row in self.rows.values():
      if row['status'] == 'running':
        row['status'] = 'pending'
        count += 1
    return count

  def _log_line(self, row: Dict[str, Any], child: Dict[str, Any]) -> None:
    what = sweep_spec.describe_point(self.spec.sweeps, row['_point'])
    what = f'{what} seed={row["seed"]}'.strip()
    count = f'trial {self.finished_count()}/{self.total}'
    took = format_seconds(child.get('wall_seconds') or row.get('wall_seconds') or 0.0)
    if row['status'] == 'done':
      logging.info('%s done: %s final %.1f (%s)', count, what, row['final_return'], took)
    elif row['status'] == 'stopped':
      logging.info('%s stopped early: %s (%s)', count, what, took)
    else:
      logging.info('%s failed: %s: %s', count, what, row['error'])

  # Files.

  def write(self) -> None:
    """Rewrites trials.csv now and summary.csv soon, from a copy of the rows
    (atomic renames).

    A summary bootstraps the IQM's CI of each point whose trials changed (about
    1.5 s, and rliable's first import 2 s more). Written inside Tune's callback,
    it held back the next trial by that long each time one finished, so it is
    written on a thread of its own.
    """
    os.makedirs(self.root, exist_ok=True)
    rows = [dict(r) for r in self.rows.values()]
    aggregate.write_csv(os.path.join(self.root, aggregate.TRIALS_FILE),
                        aggregate.trial_columns(self.swept), rows)
    self._summary_written = self._summary_writer.submit(self._write_summary, rows)
    self._summary_written.add_done_callback(_log_failure)

  def flush(self) -> None:
    """Waits until summary.csv holds the rows of the last `write`; raises its error."""
    if self._summary_written is not None:
      self._summary_written.result()

  def _write_summary(self, rows: List[Dict[str, Any]]) -> None:
    aggregate.write_csv(os.path.join(self.root, aggregate.SUMMARY_FILE),
                        aggregate.summary_columns(self.swept), self._summarize(rows))

  def summary(self) -> List[Dict[str, Any]]:
    """One row per point (IQM, CI, ...), as summary.csv holds them."""
    return self._summarize(list(self.rows.values()))

  def _summarize(self, rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    with self._summary_lock:
      summary = []
      for point, trials in _by_point(rows):
        key = (tuple(point.items()), tuple(
            (t['status'], t.get('final_return'), t.get('best_policy_return')) for t in trials))
        if key not in self._summary_cache:  # Bootstraps take a second: only new data.
          self._summary_cache[key] = aggregate.summarize([(point, trials)])[0]
        summary.append(self._summary_cache[key])
      return summary

  def failed(self) -> List[Dict[str, Any]]:
    return [r for r in self.rows.values() if r['status'] == 'failed']


def _by_point(rows) -> List[Tuple[sweep_spec.Point, List[Dict[str, Any]]]]:
  """(point, its rows) in first-seen order."""
  return aggregate.group_rows(rows, key=lambda row: row['_point_id'],
                              point=lambda row: row['_point'])


def _log_failure(written: futures.Future) -> None:
  if written.exception() is not None:
    logging.warning('could not write %s: %s', aggregate.SUMMARY_FILE, written.exception())


def format_seconds(seconds: float) -> str:
  seconds = int(round(seconds))
  if seconds < 60:
    return f'{seconds}s'
  if seconds < 3600:
    return f'{seconds // 60}m{seconds % 60:02d}s'
  return f'{seconds // 3600}h{seconds % 3600 // 60:02d}m'
