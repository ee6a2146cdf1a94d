"""Learning-phase agent steps/s of Atari runs with and without train_eval.overlap_training.

The two settings alternate (off, on, off, on, ...) for `--pairs` pairs, one run at a
time on an otherwise idle machine; the rate of a run is read from its metrics.csv rows
after the initial random collect (first such row to the last), so start-up and the
random steps are left out. Prints each run and the median of each setting.

  python scripts/bench_overlap.py --pairs=3 --steps=8000
  python scripts/bench_overlap.py --gin_bindings="make_env.env_id='ALE/Pong-v5'"
"""

from __future__ import annotations

import csv
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Callable, Dict, List, Optional, Sequence

from absl import app
from absl import flags

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PAIRS = flags.DEFINE_integer('pairs', 3, 'Runs of each setting, alternating.')
STEPS = flags.DEFINE_integer('steps', 8000, 'Agent steps of each run.')
INITIAL = flags.DEFINE_integer('initial_collect_steps', 2000, 'Random steps first.')
CAPACITY = flags.DEFINE_integer('replay_capacity', 20_000, 'Replay table size.')
_GIN_FILE = flags.DEFINE_string('gin_file', os.path.join(REPO, 'gin', 'ddqn_atari.gin'),
                                'The gin file of the runs.')
_GIN_BINDINGS = flags.DEFINE_multi_string('gin_bindings', [], 'Extra bindings of every run.')
_SETTINGS = {'serial': 'train_eval.overlap_training=False',
             'overlap': 'train_eval.overlap_training=True'}


def _rate(rows: Sequence[Dict[str, str]], initial: int) -> float:
  """Agent steps per second between the first row after the random steps and the last."""
  learning = [r for r in rows if int(r['env_steps']) > initial]
  first, last = learning[0], learning[-1]
  return ((int(last['env_steps']) - int(first['env_steps']))
          / (float(last['wall_time']) - float(first['wall_time'])))


def run_harness(name: str, out_dir: str, bindings: Sequence[str],
                environment: Optional[Dict[str, str]] = None) -> float:
  """One short run of --gin_file in `out_dir/name` with these extra bindings (and
  environment variables); returns its learning-phase agent steps/s."""
  root = os.path.join(out_dir, name)
  shutil.rmtree(root, ignore_errors=True)
  bindings = [f'train_eval.num_env_steps={STEPS.value}',
              f'train_eval.initial_collect_steps={INITIAL.value}',
              f'train_eval.replay_capacity={CAPACITY.value}',
              'train_eval.log_interval=500', 'train_eval.eval_interval=1000000',
              'train_eval.checkpoint_interval=1000000', 'train_eval.final_eval_episodes=1',
              *bindings, *_GIN_BINDINGS.value]
  cmd = [sys.executable, '-m', 'harness.train', f'--root_dir={root}',
         f'--gin_file={_GIN_FILE.value}'] + [f'--gin_bindings={b}' for b in bindings]
  subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL,
                 env={**os.environ, **(environment or {})})
  with open(os.path.join(root, 'metrics.csv'), newline='') as f:
    return _rate(list(csv.DictReader(f)), INITIAL.value)


def run_once(setting: str, out_dir: str) -> float:
  return run_harness(setting, out_dir, [_SETTINGS[setting]])


def alternate(runners: Dict[str, Callable[[str], float]], label: str = '') -> Dict[str, float]:
  """Runs each runner in turn (one run at a time) for --pairs pairs, printing every
  run's agent steps/s and each runner's median; returns the medians.

  A runner gets a scratch directory and returns the agent steps/s of its run.
  """
  out_dir = tempfile.mkdtemp(prefix='bench-')
  rates: Dict[str, List[float]] = {name: [] for name in runners}
  try:
    for pair in range(PAIRS.value):
      for name, runner in runners.items():
        rates[name].append(runner(out_dir))
        print(f'pair {pair + 1} {name}: {rates[name][-1]:.1f} agent steps/s', flush=True)
  finally:
    shutil.rmtree(out_dir, ignore_errors=True)
  medians = {name: statistics.median(values) for name, values in rates.items()}
  for name, median in medians.items():
    print(f'{label}{name}: median {median:.1f} agent steps/s over {len(rates[name])} runs '
          f'({", ".join(f"{v:.1f}" for v in rates[name])})')
  return medians


def main(argv: List[str]) -> None:
  del argv
  medians = alternate({name: functools.partial(run_once, name) for name in _SETTINGS})
  print(f"overlap / serial: {medians['overlap'] / medians['serial']:.2f}x")


if __name__ == '__main__':
  app.run(main)
