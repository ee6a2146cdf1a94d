"""Soak test: a real `harness-train` run, then its memory slope and trace counts.

Runs the configuration (default: Breakout from gin/ddqn_atari.gin with a small
replay table) for `--steps` agent steps in a subprocess, then reads its
metrics.csv: the least-squares slope of process RSS over env steps once the
table is full (MB per 10,000 steps; target under 1) and the trace counts of the
train and policy functions (target: constant).

  python scripts/soak.py --steps=40000
  python scripts/soak.py --gin_bindings="make_env.env_id='ALE/Pong-v5'"
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, List

from absl import app
from absl import flags
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_STEPS = flags.DEFINE_integer('steps', 40_000, 'Agent steps of the run.')
_CAPACITY = flags.DEFINE_integer('replay_capacity', 10_000, 'Replay table size (transitions).')
_INITIAL = flags.DEFINE_integer('initial_collect_steps', 2_000, 'Random steps before training.')
_LOG_INTERVAL = flags.DEFINE_integer('log_interval', 1_000, 'Steps between metrics rows.')
# Evaluations and checkpoints (with policy exports) run far more often than in
# gin/ddqn_atari.gin, and the first of each falls before the table is full: the
# first SavedModel export, Reverb checkpoint and evaluation cost a one-time
# ~10 MB (functions traced and buffers sized once), while what repeats must
# show in the slope.
_EVAL_INTERVAL = flags.DEFINE_integer('eval_interval', 5_000, 'Steps between evaluations '
                                      '(one episode each).')
_CHECKPOINT_INTERVAL = flags.DEFINE_integer('checkpoint_interval', 5_000,
                                            'Steps between checkpoints and policy exports.')
_GIN_FILE = flags.DEFINE_multi_string('gin_file', [os.path.join(REPO, 'gin', 'ddqn_atari.gin')],
                                      'Gin files of the run.')
_GIN_BINDINGS = flags.DEFINE_multi_string('gin_bindings', [], 'Extra bindings (they win).')
_ROOT_DIR = flags.DEFINE_string('root_dir', None, 'Run directory (default: a temporary one, '
                                'deleted afterwards).')
_MAX_SLOPE = flags.DEFINE_float('max_slope_mb', 1.0, 'Target: MB of RSS per 10,000 steps.')


def _run(root_dir: str) -> None:
  bindings = [
      f'train_eval.num_env_steps={_STEPS.value}',
      f'train_eval.replay_capacity={_CAPACITY.value}',
      f'train_eval.initial_collect_steps={_INITIAL.value}',
      f'train_eval.log_interval={_LOG_INTERVAL.value}',
      f'train_eval.eval_interval={_EVAL_INTERVAL.value}',
      'train_eval.eval_episodes=1',
      f'train_eval.checkpoint_interval={_CHECKPOINT_INTERVAL.value}',
  ] + list(_GIN_BINDINGS.value)
  cmd = [sys.executable, '-m', 'harness.train', f'--root_dir={root_dir}']
  cmd += [f'--gin_file={f}' for f in _GIN_FILE.value]
  cmd += [f'--gin_bindings={b}' for b in bindings]
  print(' '.join(cmd), flush=True)
  subprocess.run(cmd, check=True, cwd=REPO)


def _rows(path: str) -> List[Dict[str, str]]:
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def report(metrics_csv: str, capacity: int, max_slope: float) -> bool:
  """Prints the RSS slope after the table is full and the trace counts; True if on target."""
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
  return ok and slope < max_slope


def main(argv) -> None:
  del argv
  root_dir = _ROOT_DIR.value or tempfile.mkdtemp(prefix='soak-')
  try:
    _run(root_dir)
    ok = report(os.path.join(root_dir, 'metrics.csv'), _CAPACITY.value, _MAX_SLOPE.value)
  finally:
    if not _ROOT_DIR.value:
      shutil.rmtree(root_dir, ignore_errors=True)
  sys.exit(0 if ok else 1)


if __name__ == '__main__':
  app.run(main)
