"""Statistics and files of a sweep: trials.csv, summary.csv, summary.png.

IQM (interquartile mean) across seeds with 95% stratified bootstrap confidence
intervals (percentile), computed by rliable's `StratifiedBootstrap` with its
resamples drawn from a seed of their own, and rliable's `metrics.aggregate_iqm`
cut, as Agarwal et al. (2021) recommend for few runs. Reads run directories
(eval.csv, results.json) only: no TensorFlow, no Ray.
"""

from __future__ import annotations

import csv
import functools
import io
import math
import os
from typing import Any, Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from harness.sweeps import spec as sweep_spec

TRIALS_FILE = 'trials.csv'
SUMMARY_FILE = 'summary.csv'
SUMMARY_PNG = 'summary.png'
STATUSES = ('done', 'failed', 'running', 'pending', 'stopped')
# Columns after the swept bindings.
TRIAL_COLUMNS = ('seed', 'status', 'final_return', 'best_policy_return', 'train_return_last100',
                 'env_steps',
                 'wall_seconds', 'error', 'attempts', 'failures')
# train_*: the mean return of each trial's last 100 training episodes, the
# protocol of MinAtar's and Dopamine's published curves.
SUMMARY_COLUMNS = ('n_seeds', 'iqm', 'ci_low', 'ci_high', 'mean', 'median', 'best_iqm',
                   'best_ci_low', 'best_ci_high', 'train_iqm', 'train_ci_low', 'train_ci_high')
# rliable's default is 50,000 bootstrap replications: 16 s per estimate on this
# machine, repeated every time a trial finishes. 2,000 take 0.7 s; the CI
# bounds move by a few percent of their width at most.
BOOTSTRAP_REPS = 2000
CONFIDENCE = 0.95


@functools.lru_cache(maxsize=1)
def _seeded_stratified_bootstrap() -> type:
  """rliable's StratifiedBootstrap, drawing its resamples from its own seed.

  Ours because rliable 1.x's `StratifiedBootstrap.update_indices` draws from
  numpy's global `np.random`, not from the `random_state` it is given: the
  intervals then depended on whatever had drawn from the global generator
  before (a previous bootstrap, the import order under PYTHONHASHSEED) and
  moved by a resample quantile from one process to the next. The subclass
  draws from arch's generator, seeded per bootstrap; everything else is
  rliable's (runs resampled within each task and step). It reads the parent's
  `_num_items`, `_args_shape` and `_strata_indices`: setup.cfg pins rliable.
  """
  from rliable import library as rly  # pylint: disable=g-import-not-at-top

  class SeededStratifiedBootstrap(rly.StratifiedBootstrap):

    def update_indices(self) -> Tuple[np.ndarray, ...]:
      runs = self.generator.integers(self._num_items, size=self._args_shape)
      return (runs, *self._strata_indices)

  return SeededStratifiedBootstrap


def _percentile_interval(data: np.ndarray, statistic: Callable[[np.ndarray], np.ndarray],
                         reps: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
  """(statistic of `data`, its 2 x ... percentile interval), runs on axis 0."""
  bootstrap = _seeded_stratified_bootstrap()(data, seed=seed)
  interval = bootstrap.conf_int(statistic, reps=reps, size=CONFIDENCE, method='percentile')
  return statistic(data), interval


def iqm(scores: np.ndarray, axis: Optional[int] = None) -> np.ndarray:
  """Interquartile mean: rliable's `metrics.aggregate_iqm` (scipy's 25% `trim_mean`).

  Our own few lines because scipy's `trim_mean` spends ~4 ms per call in its
  argument-checking wrapper (8 ms on a busy machine), and a bootstrap calls it
  thousands of times: 16 s for one curve of 20 evaluations. Same cut: int(0.25 n)
  values off each end. `tests/test_sweep.py` checks it against aggregate_iqm.
  """
  values = np.asarray(scores, np.float64)
  if axis is None:
    values, axis = values.ravel(), 0
  values = np.sort(np.moveaxis(values, axis, 0), axis=0)
  cut = int(0.25 * values.shape[0])
  return values[cut:values.shape[0] - cut].mean(axis=0)


def iqm_ci(scores: Sequence[float], reps: int = BOOTSTRAP_REPS,
           seed: int = 0) -> Tuple[float, float, float]:
  """(IQM, CI low, CI high) of one number per run; NaNs when there are none."""
  values = tuple(float(s) for s in scores if s is not None and math.isfinite(s))
  if not values:
    return (math.nan, math.nan, math.nan)
  if len(values) == 1:  # every resample of one run is that run
    return (values[0], values[0], values[0])
  return _bootstrap_iqm_ci(values, reps, seed)


# A sweep rewrites summary.csv each time a trial ends; a point whose runs did not
# change keeps its interval (the bootstrap is seeded), so it is not drawn again:
# ~0.15 CPU-seconds per point and statistic.
@functools.lru_cache(maxsize=4096)
def _bootstrap_iqm_ci(values: Tuple[float, ...], reps: int,
                      seed: int) -> Tuple[float, float, float]:
  point, interval = _percentile_interval(
      np.asarray(values).reshape(-1, 1), lambda s: np.array([iqm(s.ravel())]), reps, seed)
  return float(point[0]), float(interval[0, 0]), float(interval[1, 0])


def iqm_curve(scores: np.ndarray, reps: int = BOOTSTRAP_REPS,
              seed: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
  """IQM and CI at each column of `scores` (runs x steps), in one bootstrap."""
  data = scores[:, None, :]  # runs x tasks (1) x steps

  def per_step(s: np.ndarray) -> np.ndarray:
    return iqm(s.reshape(-1, s.shape[-1]), axis=0)

  point, interval = _percentile_interval(data, per_step, reps, seed)
  return point, interval[0], interval[1]


# --- trials.csv -----------------------------------------------------------------------


def _cell(value: Any) -> str:
  if value is None:
    return ''
  if isinstance(value, float):
    return '' if not math.isfinite(value) else repr(round(value, 6))
  return str(value)


def write_csv(path: str, columns: Sequence[str], rows: Sequence[Dict[str, Any]]) -> None:
  """Writes rows atomically (a reader never sees half a file)."""
  out = io.StringIO()
  writer = csv.DictWriter(out, fieldnames=list(columns), extrasaction='ignore',
                          lineterminator='\n')
  writer.writeheader()
  for row in rows:
    writer.writerow({k: _cell(row.get(k)) for k in columns})
  sweep_spec.atomic_write(path, out.getvalue())


def read_csv(path: str) -> List[Dict[str, str]]:
  try:
    with open(path, newline='') as f:
      return list(csv.DictReader(f))
  except FileNotFoundError:
    return []


def trial_columns(swept: Sequence[str]) -> List[str]:
  return ['trial_id'] + list(swept) + list(TRIAL_COLUMNS)


def summary_columns(swept: Sequence[str]) -> List[str]:
  return list(swept) + list(SUMMARY_COLUMNS)


def number(value: Any) -> float:
  try:
    return float(value)
  except (TypeError, ValueError):
    return math.nan


# --- summary.csv ----------------------------------------------------------------------


def summarize(points: Sequence[Tuple[Dict[str, str], List[Dict[str, Any]]]],
              ) -> List[Dict[str, Any]]:
  """One summary row per point from its trial rows (statistics over done trials)."""
  rows = []
  for point, trials in points:
    done = [t for t in trials if t.get('status') == 'done']
    finals = [number(t.get('final_return')) for t in done]
    bests = [number(t.get('best_policy_return')) for t in done]
    trains = [number(t.get('train_return_last100')) for t in done]
    finite = [f for f in finals if math.isfinite(f)]
    iqm, low, high = iqm_ci(finals)
    best_iqm, best_low, best_high = iqm_ci(bests)
    train_iqm, train_low, train_high = iqm_ci(trains)
    rows.append({**point, 'n_seeds': len(finite), 'iqm': iqm, 'ci_low': low, 'ci_high': high,
                 'mean': float(np.mean(finite)) if finite else math.nan,
                 'median': float(np.median(finite)) if finite else math.nan,
                 'best_iqm': best_iqm, 'best_ci_low': best_low, 'best_ci_high': best_high,
                 'train_iqm': train_iqm, 'train_ci_low': train_low, 'train_ci_high': train_high})
  return rows


def group_rows(rows: Iterable[Dict[str, Any]], key: Callable[[Dict[str, Any]], Hashable],
               point: Callable[[Dict[str, Any]], Any]) -> List[Tuple[Any, List[Dict[str, Any]]]]:
  """(point, its rows) in first-seen order: rows of one `key` share a group,
  whose point is `point` of its first row."""
  groups: Dict[Hashable, Tuple[Any, List[Dict[str, Any]]]] = {}
  for row in rows:
    groups.setdefault(key(row), (point(row), []))[1].append(row)
  return list(groups.values())


def group_by_point(rows: Sequence[Dict[str, Any]], swept: Sequence[str],
                   ) -> List[Tuple[Dict[str, str], List[Dict[str, Any]]]]:
  """Trial rows grouped by their swept values, in first-seen order."""
  return group_rows(rows, key=lambda row: tuple(str(row.get(name, '')) for name in swept),
                    point=lambda row: {name: row.get(name, '') for name in swept})


def format_table(rows: Sequence[Dict[str, Any]], swept: Sequence[str]) -> str:
  """The summary as an aligned text table (stdout and README)."""
  shorts = sweep_spec.short_names(list(swept))
  header = [shorts[n] for n in swept] + ['n_seeds', 'IQM final [95% CI]', 'mean', 'median',
                                          'IQM best_policy [95% CI]', 'IQM train last 100 [95% CI]']
  lines = [header]
  for row in rows:
    lines.append([str(row.get(n, '')) for n in swept] + [
        str(row['n_seeds']), _estimate(row['iqm'], row['ci_low'], row['ci_high']),
        _num(row['mean']), _num(row['median']),
        _estimate(row['best_iqm'], row['best_ci_low'], row['best_ci_high']),
        _estimate(row['train_iqm'], row['train_ci_low'], row['train_ci_high'])])
  widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
  return '\n'.join('  '.join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip()
                   for line in lines)


def format_markdown(rows: Sequence[Dict[str, Any]], swept: Sequence[str]) -> str:
  shorts = sweep_spec.short_names(list(swept))
  header = [f'`{shorts[n]}`' for n in swept] + ['seeds', 'IQM final return [95% CI]', 'mean',
                                                'median', 'IQM best_policy [95% CI]',
                                                'IQM train last 100 [95% CI]']
  lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
  for row in rows:
    cells = [str(row.get(n, '')) for n in swept] + [
        str(row['n_seeds']), _estimate(row['iqm'], row['ci_low'], row['ci_high']),
        _num(row['mean']), _num(row['median']),
        _estimate(row['best_iqm'], row['best_ci_low'], row['best_ci_high']),
        _estimate(row['train_iqm'], row['train_ci_low'], row['train_ci_high'])]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def _num(value: float) -> str:
  return '-' if not math.isfinite(value) else f'{value:.1f}'


def _estimate(point: float, low: float, high: float) -> str:
  if not math.isfinite(point):
    return '-'
  return f'{point:.1f} [{low:.1f}, {high:.1f}]'


# --- summary.png ----------------------------------------------------------------------


def read_eval_curve(run_dir: str) -> Tuple[np.ndarray, np.ndarray]:
  """(env_steps, avg_return) of a run's eval.csv rows (empty arrays when none)."""
  xs, ys = [], []
  for row in read_csv(os.path.join(run_dir, 'eval.csv')):
    x, y = number(row.get('env_steps')), number(row.get('avg_return'))
    if math.isfinite(x) and math.isfinite(y):
      xs.append(x)
      ys.append(y)
  return np.asarray(xs), np.asarray(ys)


def point_curve(run_dirs: Sequence[str]) -> Optional[Tuple[np.ndarray, ...]]:
  """IQM eval curve across runs: (env_steps, iqm, low, high), or None without data.

  The k-th evaluations of the runs are aggregated together (batched envs may
  overshoot an interval by a few steps); x is their median env step. Curves are
  cut to the shortest run.
  """
  curves = [read_eval_curve(d) for d in run_dirs]
  curves = [c for c in curves if c[0].size]
  if not curves:
    return None
  length = min(c[0].size for c in curves)
  steps = np.median(np.stack([c[0][:length] for c in curves]), axis=0)
  scores = np.stack([c[1][:length] for c in curves])
  iqm, low, high = iqm_curve(scores)
  return steps, iqm, low, high


def plot_summary(curves: Sequence[Tuple[str, Tuple[np.ndarray, ...], int]], out: str,
                 title: str = '') -> None:
  """Writes the IQM eval-return curves (one per point, CI band) to `out` (PNG)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(9, 5.5))
  colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
  for i, (label, (steps, iqm, low, high), n) in enumerate(curves):
    color = colors[i % len(colors)]
    ax.plot(steps, iqm, color=color, linewidth=1.8, label=f'{label} ({n} seeds)')
    ax.fill_between(steps, low, high, color=color, alpha=0.18, linewidth=0)
  if not curves:
    ax.text(0.5, 0.5, 'no finished trials yet', ha='center', va='center',
            transform=ax.transAxes)
  ax.set_xlabel('env steps')
  ax.set_ylabel('eval return: IQM across seeds, 95% CI')
  ax.grid(alpha=0.3)
  if curves:
    ax.legend(loc='best', fontsize='small')
  ax.set_title(title or 'greedy eval return (IQM across seeds, stratified bootstrap 95% CI)')
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  fig.savefig(out, dpi=80)
  plt.close(fig)


def plot_sweep(root: str, out: str, title: str = '') -> int:
  """summary.png of a sweep directory from its trials.csv (done trials); returns curves drawn."""
  stored = sweep_spec.read_spec(root)
  if stored is None:
    raise FileNotFoundError(sweep_spec.spec_path(root))
  spec = sweep_spec.spec_from_json(stored)
  swept = [s.name for s in spec.sweeps]
  rows = read_csv(os.path.join(root, TRIALS_FILE))
  curves = []
  for point, trials in group_by_point(rows, swept):
    dirs = [sweep_spec.trial_dir(root, t['trial_id']) for t in trials if t['status'] == 'done']
    curve = point_curve(dirs)
    if curve is not None:
      label = sweep_spec.describe_point(spec.sweeps, point) or 'all seeds'
      curves.append((label, curve, len(dirs)))
  plot_summary(curves, out, title)
  return len(curves)
