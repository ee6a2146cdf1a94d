"""What the single-process loop's compiled calls cost, and whether the loop waits on them.

Runs `harness-train` (MinAtar Freeway by default, no evaluation or checkpoint
before the end) with every `harness.base.host_calls.HostCall` timed per name:
the trainer's `train_steps`, the policy's `host_policy_weights` (its refresh)
and the run state's `set_env_steps`. Two settings alternate, one run at a time:

- `shipped`: the loop as it is.
- `frozen_env_steps`: `RunState.set_env_steps` does nothing once the env-step
  counter has passed `--decay_frames`, the end of the epsilon decay (both
  settings decay over `--decay_frames`, so both act with the same epsilon and
  the learning rate is constant): the main thread then makes one compiled call
  per iteration fewer, and nothing the run computes changes.

Per run it prints the learning-phase frames/s (from the metrics.csv rows after
the initial collect) and each call's count and mean wall time; then the medians.
If the trainer's call takes about as long as an iteration (16 frames / rate),
the loop waits on the gradient steps, not on the main thread's calls.

  python scripts/profile_host_calls.py --pairs=3 --frames=100000
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = ('shipped', 'frozen_env_steps')


def _parse_args(argv: List[str]) -> argparse.Namespace:
  # argparse, not absl flags: the child runs harness-train's absl app in this
  # process, whose flags (--gin_file, --root_dir, ...) would collide with ours.
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--pairs', type=int, default=3, help='runs of each setting, alternating')
  parser.add_argument('--frames', type=int, default=100_000, help='frames (env steps) a run')
  parser.add_argument('--initial_collect_steps', type=int, default=5_000,
                      help='random frames first (the learning phase starts after them)')
  parser.add_argument('--decay_frames', type=int, default=5_000,
                      help='make_agent.epsilon_decay_steps of both settings')
  parser.add_argument('--gin_file', default=os.path.join(REPO, 'gin', 'ddqn_minatar.gin'))
  parser.add_argument('--gin_bindings', action='append',
                      help="bindings of every run (default: MinAtar Freeway-v0)")
  # Internal: one run of one setting in this process (the parent starts one per run).
  parser.add_argument('--run_setting', choices=SETTINGS, help=argparse.SUPPRESS)
  parser.add_argument('--run_root', help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  args.gin_bindings = args.gin_bindings or ["make_env.env_id='MinAtar/Freeway-v0'"]
  return args


def _train_with_timed_calls(setting: str, root_dir: str, decay_frames: int,
                            train_argv: List[str]) -> None:
  """Runs harness-train here, every HostCall timed; prints the timings as JSON."""
  from harness import train  # pylint: disable=g-import-not-at-top
  from harness.base import host_calls  # pylint: disable=g-import-not-at-top
  from harness.rundir import checkpoints  # pylint: disable=g-import-not-at-top

  totals: Dict[str, List[float]] = collections.defaultdict(lambda: [0, 0.0])
  call = host_calls.HostCall.__call__

  def timed_call(self, *inputs):
    start = time.perf_counter()
    try:
      return call(self, *inputs)
    finally:
      entry = totals[self._name]  # pylint: disable=protected-access
      entry[0] += 1
      entry[1] += time.perf_counter() - start

  host_calls.HostCall.__call__ = timed_call
  if setting == 'frozen_env_steps':
    set_env_steps = checkpoints.RunState.set_env_steps

    def set_until_decayed(self, env_steps):
      if not getattr(self, '_decayed', False):
        set_env_steps(self, env_steps)
        self._decayed = env_steps >= decay_frames

    checkpoints.RunState.set_env_steps = set_until_decayed
  train_main = train.main

  def main_then_report(argv: List[str]) -> None:
    # Printed from inside harness-train's main: its entry point ends the process
    # with os._exit, past any finally or atexit of ours.
    try:
      train_main(argv)
    finally:
      print('HOST_CALLS ' + json.dumps({
          name: {'calls': n, 'mean_us': round(1e6 * t / max(n, 1))}
          for name, (n, t) in sorted(totals.items())}), flush=True)

  train.main = main_then_report  # train.run looks `main` up when it is called
  sys.argv = ['harness-train', f'--root_dir={root_dir}'] + train_argv
  train.run()


def _learning_phase_rate(root_dir: str, initial: int) -> float:
  """Frames/s from the first metrics.csv row at or past the initial collect to
  the last, as scripts/bench_minatar_vs_sb3.sh reads it (not bench_overlap's
  `_rate`: importing that script defines absl flags that collide with
  harness-train's in the child)."""
  with open(os.path.join(root_dir, 'metrics.csv')) as f:
    rows = [row for row in csv.DictReader(f) if int(row['env_steps']) >= initial]
  first, last = rows[0], rows[-1]
  return ((int(last['env_steps']) - int(first['env_steps']))
          / (float(last['wall_time']) - float(first['wall_time'])))


def _train_argv(args: argparse.Namespace) -> List[str]:
  """harness-train's flags for one run (less --root_dir)."""
  return [f'--gin_file={args.gin_file}'] + [
      f'--gin_bindings={b}' for b in args.gin_bindings + [
          f'train_eval.num_env_steps={args.frames}',
          f'train_eval.initial_collect_steps={args.initial_collect_steps}',
          f'make_agent.epsilon_decay_steps={args.decay_frames}',
          'train_eval.eval_interval=100000000', 'train_eval.checkpoint_interval=100000000',
          'train_eval.log_interval=5000']]


def main(argv: List[str]) -> None:
  args = _parse_args(argv)
  if args.run_setting:
    _train_with_timed_calls(args.run_setting, args.run_root, args.decay_frames,
                            _train_argv(args))
    return
  rates = collections.defaultdict(list)
  scratch = tempfile.mkdtemp(prefix='host_calls_')
  try:
    for pair in range(1, args.pairs + 1):
      for setting in SETTINGS:
        root = os.path.join(scratch, f'{setting}_{pair}')
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), f'--run_setting={setting}',
             f'--run_root={root}'] + argv, capture_output=True, text=True, check=True, cwd=REPO)
        calls = [line for line in done.stdout.splitlines() if line.startswith('HOST_CALLS ')]
        rate = _learning_phase_rate(root, args.initial_collect_steps)
        rates[setting].append(rate)
        print(f'pair {pair} {setting}: {rate:.1f} frames/s, {calls[-1][len("HOST_CALLS "):]}',
              flush=True)
  finally:
    shutil.rmtree(scratch, ignore_errors=True)
  for setting, values in rates.items():
    print(f'{setting}: median {statistics.median(values):.1f} frames/s over {len(values)} runs '
          f'({", ".join(f"{v:.1f}" for v in values)})')


if __name__ == '__main__':
  main(sys.argv[1:])
