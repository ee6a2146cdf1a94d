"""Training return against frames and against wall-clock seconds, for sweeps side by side.

Reads every trial's metrics.csv under each sweep root (harness-sweep's
`trials/*/metrics.csv`) and prints, per sweep, the mean over trials of the
training return (metrics.csv's `avg_return`, the last 10 training episodes,
averaged over the rows of the 100,000 frames before each point) at given frames
and at given seconds since the first row. That is the "return per wall-clock
hour" comparison of two training cadences (issue 30): run both sweeps on the
same machine, the same number of trials at a time.

  python scripts/compare_cadence.py runs/minatar_breakout runs/minatar_breakout_paper \
      --frames 250000 500000 1000000 --seconds 1000 2000 4000
"""

from __future__ import annotations

import argparse
import csv
import glob
import os
from typing import Dict, List, Optional, Sequence

import numpy as np

_SMOOTHING_FRAMES = 100_000


def read_trials(root: str) -> List[List[Dict[str, float]]]:
  """Each trial's metrics rows (env_steps, seconds since its first row, avg_return)."""
  trials = []
  for path in sorted(glob.glob(os.path.join(root, 'trials', '*', 'metrics.csv'))):
    with open(path, newline='') as f:
      rows = [r for r in csv.DictReader(f) if r.get('avg_return')]
    if not rows:
      continue
    start = float(rows[0]['wall_time'])
    trials.append([{'frames': float(r['env_steps']), 'seconds': float(r['wall_time']) - start,
                    'return': float(r['avg_return'])} for r in rows])
  return trials


def return_at(rows: Sequence[Dict[str, float]], key: str, point: float) -> Optional[float]:
  """Mean return over the rows of the 100,000 frames before the first row at `point`."""
  reached = [i for i, r in enumerate(rows) if r[key] >= point]
  if not reached:
    return None
  end = rows[reached[0]]['frames']
  window = [r['return'] for r in rows[:reached[0] + 1] if r['frames'] > end - _SMOOTHING_FRAMES]
  return float(np.mean(window))


def _cell(trials, key: str, point: float) -> str:
  values = [return_at(rows, key, point) for rows in trials]
  reached = [v for v in values if v is not None]
  if not reached:
    return 'not reached'
  suffix = '' if len(reached) == len(values) else f' ({len(reached)} of {len(values)} trials)'
  return f'{np.mean(reached):.2f}{suffix}'


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('roots', nargs='+', help='harness-sweep root directories')
  parser.add_argument('--frames', nargs='+', type=float, default=[250_000, 500_000, 1_000_000])
  parser.add_argument('--seconds', nargs='+', type=float, default=[1_000, 2_000, 4_000])
  args = parser.parse_args()
  points = [('frames', p) for p in args.frames] + [('seconds', p) for p in args.seconds]
  header = ['sweep (trials)'] + [f'at {p:,.0f} {k}' for k, p in points]
  print('| ' + ' | '.join(header) + ' |')
  print('|' + '---|' * len(header))
  for root in args.roots:
    trials = read_trials(root)
    cells = [_cell(trials, key, point) for key, point in points]
    print(f'| {root} ({len(trials)}) | ' + ' | '.join(cells) + ' |')


if __name__ == '__main__':
  main()
