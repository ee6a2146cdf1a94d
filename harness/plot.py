"""`harness-plot ROOT [ROOT ...] --out FILE.png`: learning curves of runs.

Reads `ROOT/eval.csv` and `ROOT/metrics.csv` of each run and draws four panels
against env steps: greedy eval return (mean +- std), collect return, loss and
epsilon. One colour per run; the legend names the run directories.

`harness-plot SWEEP --out FILE.png` (a directory with sweep.json) draws the
sweep's summary instead: the IQM of eval return across seeds against env steps,
with its 95% CI band, one curve per point (`aggregate.plot_sweep`).
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from typing import Dict, List, Sequence

from absl import flags
from absl import logging
import matplotlib

matplotlib.use('Agg')  # Files only: no display on servers and in tests.
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from harness.base import cli  # pylint: disable=wrong-import-position
from harness.base.errors import UsageError  # pylint: disable=wrong-import-position
from harness.sweeps import aggregate  # pylint: disable=wrong-import-position
from harness.sweeps import spec as sweep_spec  # pylint: disable=wrong-import-position

_OUT = flags.DEFINE_string('out', 'runs.png', 'PNG file to write.')
_TITLE = flags.DEFINE_string('title', None, 'Figure title (default: none).')

_PROGRAM = 'harness-plot'
Columns = Dict[str, List[float]]


@dataclasses.dataclass
class Run:
  """The curves of one run directory."""
  label: str
  metrics: Columns
  evals: Columns


def _read_csv(path: str) -> Columns:
  """Numeric columns of a CSV file; empty cells become NaN."""
  if not os.path.isfile(path):
    return {}
  columns: Columns = {}
  with open(path, newline='') as f:
    for row in csv.DictReader(f):
      for key, value in row.items():
        if key is None:  # A torn last line (crash mid-write) has extra cells.
          continue
        columns.setdefault(key, []).append(_number(value))
  return columns


def _number(value: str) -> float:
  try:
    return float(value)
  except (TypeError, ValueError):
    return math.nan


def labels_for(roots: Sequence[str]) -> List[str]:
  """Run directory names, with parent folders added until they are unique."""
  parts = [os.path.normpath(os.path.abspath(r)).split(os.sep) for r in roots]
  depth = 1
  while True:
    labels = [os.sep.join(p[-depth:]) for p in parts]
    if len(set(labels)) == len(labels) or depth >= max(len(p) for p in parts):
      return labels
    depth += 1


def load_runs(roots: Sequence[str]) -> List[Run]:
  """Reads every run; a directory without either CSV is a `UsageError`."""
  runs = []
  for root, label in zip(roots, labels_for(roots)):
    if not os.path.isdir(root):
      raise UsageError(f'run directory {root!r} does not exist: pass a --root_dir of harness-train')
    metrics = _read_csv(os.path.join(root, 'metrics.csv'))
    evals = _read_csv(os.path.join(root, 'eval.csv'))
    if not metrics and not evals:
      raise UsageError(f'{root!r} has no metrics.csv or eval.csv rows: is it a run directory '
                       'that has reached its first log interval?')
    runs.append(Run(label, metrics, evals))
  return runs


def _draw(ax, columns: Columns, y: str, color, label: str, std: str = '') -> bool:
  """Draws column `y` against env_steps; returns False if the run has no such data."""
  xs, ys = columns.get('env_steps', []), columns.get(y, [])
  points = [(x, v) for x, v in zip(xs, ys) if math.isfinite(x) and math.isfinite(v)]
  if not points:
    return False
  x, v = zip(*points)
  ax.plot(x, v, color=color, label=label, linewidth=1.5)
  if std and std in columns:
    spread = [(a, m, s) for a, m, s in zip(xs, ys, columns[std])
              if math.isfinite(a) and math.isfinite(m) and math.isfinite(s)]
    if spread:
      a, m, s = zip(*spread)
      ax.fill_between(a, [p - q for p, q in zip(m, s)], [p + q for p, q in zip(m, s)],
                      color=color, alpha=0.15, linewidth=0)
  return True


def plot_runs(runs: Sequence[Run], out: str, title: str = '') -> None:
  """Writes the four-panel figure of `runs` to `out` (PNG)."""
  fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
  panels = [
      (axes[0, 0], 'evals', 'avg_return', 'std_return', 'eval return (greedy, mean ± std)'),
      (axes[0, 1], 'metrics', 'avg_return', '', 'collect return (recent episodes)'),
      (axes[1, 0], 'metrics', 'loss', '', 'loss'),
      (axes[1, 1], 'metrics', 'epsilon', '', 'collect epsilon'),
  ]
  colors = plt.rcParams['axes.prop_cycle'].by_key()['color']
  for ax, source, column, std, panel_title in panels:
    drawn = [_draw(ax, getattr(run, source), column, colors[i % len(colors)], run.label, std)
             for i, run in enumerate(runs)]
    ax.set_title(panel_title)
    ax.grid(alpha=0.3)
    if not any(drawn):
      ax.text(0.5, 0.5, 'no data', ha='center', va='center', transform=ax.transAxes)
    elif column == 'loss' and _all_positive(runs, column):
      ax.set_yscale('log')  # Losses span decades; a linear axis hides the late curve.
  for ax in axes[1]:
    ax.set_xlabel('env steps')
  handles, labels = axes[0, 0].get_legend_handles_labels()
  if not handles:
    handles, labels = axes[0, 1].get_legend_handles_labels()
  fig.legend(handles, labels, loc='lower center', ncol=min(len(labels), 4) or 1, frameon=False)
  if title:
    fig.suptitle(title)
  fig.tight_layout(rect=(0, 0.06, 1, 1))
  folder = os.path.dirname(os.path.abspath(out))
  os.makedirs(folder, exist_ok=True)
  fig.savefig(out, dpi=80)
  plt.close(fig)


def _all_positive(runs: Sequence[Run], column: str) -> bool:
  values = [v for run in runs for v in run.metrics.get(column, []) if math.isfinite(v)]
  return bool(values) and min(values) > 0


def main(argv: List[str]) -> None:
  roots = argv[1:]
  if not roots:
    raise UsageError('no run directories given: harness-plot ROOT [ROOT ...] --out FILE.png')
  if not _OUT.value.lower().endswith('.png'):
    raise UsageError(f'--out={_OUT.value} must end in .png')
  if len(roots) == 1 and os.path.isfile(sweep_spec.spec_path(roots[0])):
    curves = aggregate.plot_sweep(roots[0], _OUT.value, _TITLE.value or '')
    logging.info('Wrote %s (sweep %s: %d curves)', _OUT.value, roots[0], curves)
    print(_OUT.value)
    return
  runs = load_runs(roots)
  plot_runs(runs, _OUT.value, _TITLE.value or '')
  logging.info('Wrote %s (%d runs)', _OUT.value, len(runs))
  print(_OUT.value)


def run() -> None:
  """Console-script entry point."""
  cli.run_app(_PROGRAM, main, cli.Command(
      program=_PROGRAM,
      summary='draws the learning curves of runs (or the IQM curves of a sweep) to a PNG.',
      usage='ROOT [ROOT ...] --out=FILE.png [--title=TITLE]',
      example='harness-plot runs/cartpole runs/cartpole_per --out=cartpole.png',
      module=__name__))


if __name__ == '__main__':
  run()
