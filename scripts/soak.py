"""Soak test: a real `harness-train` run, then its memory slope and trace counts.

Runs the configuration (default: Breakout from gin/ddqn_atari.gin with a small
replay table) for `--steps` agent steps in a subprocess, then reads its
metrics.csv: the least-squares slope of process RSS over env steps once the
table is full (MB per 10,000 steps; target under 1) and the trace counts of the
train and policy functions (target: constant). With --eval_interval or
--checkpoint_interval set, also the mean RSS change across those events.

  python scripts/soak.py --steps=100000
  python scripts/soak.py --steps=120000 --eval_interval=10000 --checkpoint_interval=10000
  python scripts/soak.py --steps=300000 --last_steps=200000 --eval_interval=10000 \
      --checkpoint_interval=10000 --gin_bindings=train_eval.prioritized_replay=True
  python scripts/soak.py --gin_bindings="make_env.env_id='ALE/Pong-v5'"
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Sequence, Tuple

from absl import app
from absl import flags
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Single RSS readings scatter by a few MiB, so a slope near 1 MB per 10,000
# steps needs about 90,000 steps after the table fills (about 20 minutes).
_STEPS = flags.DEFINE_integer('steps', 100_000, 'Agent steps of the run.')
_CAPACITY = flags.DEFINE_integer('replay_capacity', 10_000, 'Replay table size (transitions).')
_INITIAL = flags.DEFINE_integer('initial_collect_steps', 2_000, 'Random steps before training.')
_LOG_INTERVAL = flags.DEFINE_integer('log_interval', 1_000, 'Steps between metrics rows.')
# Evaluations and checkpoints follow the gin file (every 250,000 steps in
# gin/ddqn_atari.gin) unless these are set. Each evaluation + checkpoint (with
# policy exports) leaves about 0.5 to 1.5 MB behind, so with short intervals the slope
# measures their frequency more than the run; the report then also prints the
# mean RSS change across them.
_EVAL_INTERVAL = flags.DEFINE_integer('eval_interval', None, 'Steps between evaluations '
                                      '(one episode each); default: the gin file\'s.')
_CHECKPOINT_INTERVAL = flags.DEFINE_integer('checkpoint_interval', None,
                                            'Steps between checkpoints and policy exports; '
                                            'default: the gin file\'s.')
_GIN_FILE = flags.DEFINE_multi_string('gin_file', [os.path.join(REPO, 'gin', 'ddqn_atari.gin')],
                                      'Gin files of the run.')
_GIN_BINDINGS = flags.DEFINE_multi_string('gin_bindings', [], 'Extra bindings (they win).')
_ROOT_DIR = flags.DEFINE_string('root_dir', None, 'Run directory (default: a temporary one, '
                                'deleted afterwards).')
_MAX_SLOPE = flags.DEFINE_float('max_slope_mb', 1.0, 'Target: MB of RSS per 10,000 steps.')
_LAST_STEPS = flags.DEFINE_integer('last_steps', None, 'Also report the slopes over the last '
                                   'this many env steps (the 300,000-step run: 200,000).')
_SAMPLE_INTERVAL = flags.DEFINE_float('sample_interval', 0.5, 'Seconds between RSS samples '
                                      'of the run read from outside (/proc).')


def _sample_rss(process: subprocess.Popen, interval_s: float) -> List[Tuple[float, float]]:
  """(wall time, RSS MiB) of the child every `interval_s` seconds until it exits,
  read from outside: what the operating system charges the run, allocator and all."""
  import psutil  # pylint: disable=g-import-not-at-top
  samples = []
  child = psutil.Process(process.pid)
  while process.poll() is None:
    try:
      samples.append((time.time(), child.memory_info().rss / 2**20))
    except psutil.NoSuchProcess:
      break
    time.sleep(interval_s)
  return samples


def _run(root_dir: str) -> List[Tuple[float, float]]:
  bindings = [
      f'train_eval.num_env_steps={_STEPS.value}',
      f'train_eval.replay_capacity={_CAPACITY.value}',
      f'train_eval.initial_collect_steps={_INITIAL.value}',
      f'train_eval.log_interval={_LOG_INTERVAL.value}',
      'train_eval.eval_episodes=1',
  ]
  if _EVAL_INTERVAL.value:
    bindings.append(f'train_eval.eval_interval={_EVAL_INTERVAL.value}')
  if _CHECKPOINT_INTERVAL.value:
    bindings.append(f'train_eval.checkpoint_interval={_CHECKPOINT_INTERVAL.value}')
  bindings += list(_GIN_BINDINGS.value)
  cmd = [sys.executable, '-m', 'harness.train', f'--root_dir={root_dir}']
  cmd += [f'--gin_file={f}' for f in _GIN_FILE.value]
  cmd += [f'--gin_bindings={b}' for b in bindings]
  print(' '.join(cmd), flush=True)
  process = subprocess.Popen(cmd, cwd=REPO)
  samples = _sample_rss(process, _SAMPLE_INTERVAL.value)
  if process.wait() != 0:
    raise SystemExit(f'the run failed with exit status {process.returncode}')
  return samples


def _sample_steps(samples: Sequence[Tuple[float, float]],
                  rows: List[Dict[str, str]]) -> np.ndarray:
  """Each sample's env step, interpolated from the metrics rows' wall times."""
  times = np.array([float(r['wall_time']) for r in rows])
  steps = np.array([float(r['env_steps']) for r in rows])
  return np.interp([t for t, _ in samples], times, steps)


def outside_slope(samples: Sequence[Tuple[float, float]], rows: List[Dict[str, str]],
                  from_env_step: float) -> Tuple[float, float, float, int]:
  """Slope (MB per 10,000 env steps) of the sampled RSS after `from_env_step`.

  Each sample's env step is interpolated from the metrics rows' wall times.
  Returns (slope, first MiB, last MiB, samples used).
  """
  start, end = float(rows[0]['wall_time']), float(rows[-1]['wall_time'])
  kept = [(s, rss) for (t, rss), s in zip(samples, _sample_steps(samples, rows))
          if start <= t <= end and s >= from_env_step]
  if len(kept) < 3:
    return float('nan'), float('nan'), float('nan'), len(kept)
  x, y = np.array(kept).T
  return np.polyfit(x, y, 1)[0] * 10_000, y[0], y[-1], len(kept)


def _write_samples(path: str, samples: Sequence[Tuple[float, float]],
                   rows: List[Dict[str, str]]) -> None:
  """Keeps the outside readings beside metrics.csv, each with its interpolated env step,
  so a slope can be looked at again (where it grows, whether spikes or a ramp)."""
  with open(path, 'w', newline='') as f:
    writer = csv.writer(f)
    writer.writerow(['wall_time', 'env_steps', 'rss_mb'])
    for (t, rss), step in zip(samples, _sample_steps(samples, rows)):
      writer.writerow([f'{t:.2f}', f'{step:.0f}', f'{rss:.2f}'])
  print(f'outside readings: {path}')


def _rows(path: str) -> List[Dict[str, str]]:
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def event_cost(rows: List[Dict[str, str]], intervals: Sequence[int]) -> List[float]:
  """RSS change (MiB) across each evaluation/checkpoint in `rows`.

  The run evaluates and checkpoints right after logging the row that crosses an
  interval, so the change from that row to the next one holds the event.
  """
  changes = []
  for before, row, after in zip(rows, rows[1:], rows[2:]):
    previous, steps = int(before['env_steps']), int(row['env_steps'])
    if any(steps // n > previous // n for n in intervals):
      changes.append(float(after['rss_mb']) - float(row['rss_mb']))
  return changes


def report(metrics_csv: str, capacity: int, max_slope: float,
           event_intervals: Sequence[int] = (),
           samples: Sequence[Tuple[float, float]] = ()) -> bool:
  """Prints the RSS slope after the table is full and the trace counts; True if on target.

  With `event_intervals` (the evaluation and checkpoint intervals set on the
  command line) it also prints the mean RSS change across those events.
  """
  rows = _rows(metrics_csv)
  full = [r for r in rows if int(r['replay_size']) >= capacity]
  traces = {k: sorted({r[k] for r in rows}) for k in ('train_traces', 'policy_traces')}
  rate = np.median([float(r['steps_per_sec']) for r in rows[1:]] or [float('nan')])
  print(f'metrics rows: {len(rows)}, table full from env step '
        f"{full[0]['env_steps'] if full else '-'}; median {rate:.0f} agent steps/s")
  ok = all(len(v) == 1 for v in traces.values())
  print(f"trace counts over the run: train {traces['train_traces']}, "
        f"policy {traces['policy_traces']} ({'constant' if ok else 'NOT constant'})")
  if len(full) < 3:
    print('too few rows after the table filled up: run more --steps')
    return False
  steps = np.array([float(r['env_steps']) for r in full])
  rss = np.array([float(r['rss_mb']) for r in full])
  slope = np.polyfit(steps, rss, 1)[0] * 10_000
  half = len(full) // 2  # the allocator settles after the fill: the later half alone
  tail = np.polyfit(steps[half:], rss[half:], 1)[0] * 10_000
  print(f'RSS after the table is full: {rss[0]:.0f} -> {rss[-1]:.0f} MiB over env steps '
        f'{steps[0]:.0f}..{steps[-1]:.0f}; slope {slope:+.2f} MB per 10,000 steps, '
        f'{tail:+.2f} over the later half from step {steps[half]:.0f} (target < {max_slope})')
  last_from = steps[-1] - _LAST_STEPS.value if _LAST_STEPS.value else None
  if last_from is not None:
    last = steps >= last_from
    print(f'slope by rows over the last {_LAST_STEPS.value:,} steps (from step {last_from:.0f}): '
          f'{np.polyfit(steps[last], rss[last], 1)[0] * 10_000:+.2f} MB per 10,000 steps')
  changes = event_cost(full, event_intervals)
  if changes:
    print(f'RSS change across each evaluation + checkpoint: mean {np.mean(changes):+.2f} MiB '
          f'over {len(changes)} (single readings scatter by a few MiB)')
  if samples:
    _write_samples(os.path.join(os.path.dirname(metrics_csv), 'rss_samples.csv'), samples, rows)
    outside, first, last, used = outside_slope(samples, rows, steps[0])
    half_outside, *_ = outside_slope(samples, rows, steps[half])
    print(f'RSS sampled from outside every {_SAMPLE_INTERVAL.value:g} s after the table is full: '
          f'{first:.0f} -> {last:.0f} MiB over {used} samples; slope {outside:+.2f} MB per '
          f'10,000 steps, {half_outside:+.2f} over the later half')
    if last_from is not None:
      last_outside, *_ = outside_slope(samples, rows, last_from)
      print(f'slope from outside over the last {_LAST_STEPS.value:,} steps: '
            f'{last_outside:+.2f} MB per 10,000 steps')
    slope = max(slope, outside)
  return ok and slope < max_slope


def main(argv) -> None:
  del argv
  root_dir = _ROOT_DIR.value or tempfile.mkdtemp(prefix='soak-')
  try:
    samples = _run(root_dir)
    intervals = [n for n in (_EVAL_INTERVAL.value, _CHECKPOINT_INTERVAL.value) if n]
    ok = report(os.path.join(root_dir, 'metrics.csv'), _CAPACITY.value, _MAX_SLOPE.value,
                intervals, samples)
  finally:
    if not _ROOT_DIR.value:
      shutil.rmtree(root_dir, ignore_errors=True)
  sys.exit(0 if ok else 1)


if __name__ == '__main__':
  app.run(main)
