"""The rows of docs/benchmarks.md from finished sweeps.

For each point of each sweep: the IQM of the seeds' final returns with its 95%
stratified bootstrap CI (rliable, as `SWEEP/summary.csv`), every seed's
final_return, how many seeds reach `--threshold`, and the median wall seconds
of a trial. Reads `SWEEP/trials.csv` only.

  python scripts/benchmark_rows.py /work/runs/sweep_acrobot --threshold=-88.4
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import List

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from harness.sweeps import aggregate  # pylint: disable=g-import-not-at-top,wrong-import-position

_THRESHOLD = flags.DEFINE_float('threshold', None, 'Count the seeds at or above this final return.')


def rows(sweep_dir: str) -> List[str]:
  trials = aggregate.read_csv(os.path.join(sweep_dir, aggregate.TRIALS_FILE))
  fixed = {'trial_id', 'error', 'attempts', 'failures'} | set(aggregate.TRIAL_COLUMNS)
  swept = [c for c in trials[0] if c not in fixed] if trials else []
  points = {}
  for trial in trials:
    points.setdefault(tuple(trial[c] for c in swept), []).append(trial)
  out = []
  for point, members in points.items():
    done = sorted((t for t in members if t['status'] == 'done'), key=lambda t: int(t['seed']))
    finals = [float(t['final_return']) for t in done]
    label = ', '.join(f'{name.split(".")[-1]}={value}' for name, value in zip(swept, point))
    if not finals:
      out.append(f'| {os.path.basename(sweep_dir)} {label} | no finished trial |')
      continue
    estimate, low, high = aggregate.iqm_ci(finals)
    wall = statistics.median(float(t['wall_seconds']) for t in done)
    reached = ''
    if _THRESHOLD.value is not None:
      reached = f' | {sum(f >= _THRESHOLD.value for f in finals)}/{len(finals)}'
    seeds = ', '.join(f'{f:.1f}' for f in finals)
    out.append(f'| {os.path.basename(sweep_dir)} {label} | {len(finals)} | {estimate:.1f} '
               f'[{low:.1f}, {high:.1f}] | {seeds} | {wall:.0f}{reached} |')
  return out


def main(argv: List[str]) -> None:
  if len(argv) < 2:
    raise app.UsageError('give one or more sweep directories')
  print('| sweep, point | seeds | IQM final_return [95% CI] | final_return per seed | '
        'median wall s' + (' | seeds >= threshold' if _THRESHOLD.value is not None else '') + ' |')
  for sweep_dir in argv[1:]:
    print('\n'.join(rows(sweep_dir)))


if __name__ == '__main__':
  app.run(main)
