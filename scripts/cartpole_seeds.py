"""Env steps and wall seconds to an eval return of 475 on CartPole-v1, per seed.

Usage:
  python scripts/cartpole_seeds.py --seeds 0 1 2 3 4 [--gin_file gin/ddqn_cartpole.gin]
      [--gin_bindings ...] [--out_dir runs/seeds]

Each seed is a real `harness-train` subprocess; it is stopped as soon as an
evaluation reaches the threshold (or at the gin file's num_env_steps). Wall
seconds count from the launch of the process, start-up included.
"""

import argparse
import csv
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _first_success(eval_csv: str, threshold: float):
  if not os.path.exists(eval_csv):
    return None
  with open(eval_csv, newline='') as f:
    for row in csv.DictReader(f):
      if float(row['avg_return']) >= threshold:
        return row
  return None


def run_seed(seed: int, args) -> tuple:
  root = os.path.join(args.out_dir, f'seed{seed}')
  shutil.rmtree(root, ignore_errors=True)
  cmd = [sys.executable, '-m', 'harness.train', f'--root_dir={root}']
  cmd += [f'--gin_file={f}' for f in args.gin_file]
  cmd += [f'--gin_bindings={b}' for b in args.gin_bindings + [f'train_eval.seed={seed}']]
  start = time.time()
  with open(os.path.join(args.out_dir, f'seed{seed}.log'), 'w') as log:
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    success = None
    while proc.poll() is None:
      time.sleep(1.0)
      success = _first_success(os.path.join(root, 'eval.csv'), args.threshold)
      if success:
        proc.terminate()
        proc.wait()
    success = success or _first_success(os.path.join(root, 'eval.csv'), args.threshold)
  if not success:
    return seed, None, None
  return seed, int(success['env_steps']), float(success['wall_time']) - start


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--seeds', type=int, nargs='+', default=[0, 1, 2, 3, 4])
  parser.add_argument('--gin_file', nargs='+', default=[os.path.join(REPO, 'gin', 'ddqn_cartpole.gin')])
  parser.add_argument('--gin_bindings', nargs='*', default=[])
  parser.add_argument('--threshold', type=float, default=475.0)
  parser.add_argument('--out_dir', default=os.path.join(REPO, 'runs', 'seeds'))
  args = parser.parse_args()
  os.makedirs(args.out_dir, exist_ok=True)
  print('| seed | env steps to %g | wall seconds |' % args.threshold)
  print('|---|---|---|')
  for seed in args.seeds:
    seed, steps, wall = run_seed(seed, args)
    print(f'| {seed} | {steps if steps else "not reached"} | '
          f'{f"{wall:.0f}" if wall else "-"} |', flush=True)


if __name__ == '__main__':
  main()
