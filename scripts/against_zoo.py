"""Wall time against RL Baselines3 Zoo's DQN, side by side: one run at a time, in one script.

For each task and seed, `scripts/zoo_reference.py` (SB3 DQN with the Zoo's settings and the
harness's evaluation protocol) runs first, then `harness-train` with the task's shipped gin
file; both count wall seconds the same way (training and periodic evaluations, without the
final evaluation: the script's `wall_seconds`, and `results.json`'s). Prints one markdown row
per run pair and writes them to OUT/against_zoo.csv.

    python scripts/against_zoo.py --sb3_python=/tmp/sb3/bin/python \
        [--tasks=CartPole-v1,Acrobot-v1,MountainCar-v0,LunarLander-v3] [--seeds=0] \
        [--out=runs/against_zoo] [--gin_bindings=B ...] [--zoo_from=OLD/against_zoo.csv]

`--zoo_from` takes the Zoo's rows from an earlier run's CSV instead of running SB3 again (the
Zoo's code did not change; only the harness's did): half the time, but the two sides were then
measured at different times, which the printed rows do not hide (see docs/benchmarks.md).

SB3 and PyTorch live in a virtual environment of their own (see scripts/zoo_reference.py).
Run it on an otherwise idle machine: two programs side by side slow each other many-fold.
"""

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIN_FILES = {'CartPole-v1': 'gin/ddqn_cartpole.gin', 'Acrobot-v1': 'gin/ddqn_acrobot.gin',
             'MountainCar-v0': 'gin/ddqn_mountaincar.gin',
             'LunarLander-v3': 'gin/ddqn_lunarlander.gin'}


def _timed(cmd, log_path: str) -> tuple:
  start = time.time()
  with open(log_path, 'w') as log:
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, cwd=REPO, text=True,
                            check=True)
  return result.stdout, time.time() - start


def zoo(sb3_python: str, task: str, seed: int, out: str) -> dict:
  stdout, process = _timed([sb3_python, 'scripts/zoo_reference.py', f'--task={task}',
                            f'--seed={seed}'], os.path.join(out, f'zoo-{task}-{seed}.log'))
  result = json.loads(stdout.strip().splitlines()[-1])
  return {'wall': result['wall_seconds'], 'process': process,
          'final_return': result['final_return']}


def harness(task: str, seed: int, out: str, bindings) -> dict:
  root = os.path.join(out, f'harness-{task}-{seed}')
  shutil.rmtree(root, ignore_errors=True)
  cmd = [sys.executable, '-m', 'harness.train', f'--root_dir={root}',
         f'--gin_file={GIN_FILES[task]}', f'--gin_bindings=train_eval.seed={seed}']
  cmd += [f'--gin_bindings={b}' for b in bindings]
  _, process = _timed(cmd, os.path.join(out, f'harness-{task}-{seed}.log'))
  with open(os.path.join(root, 'results.json')) as f:
    result = json.load(f)
  return {'wall': result['wall_seconds'], 'process': process,
          'final_return': result['final_return']}


def _zoo_rows(path: str) -> dict:
  """(task, seed) -> the Zoo's figures of an earlier run's CSV."""
  with open(path, newline='') as f:
    return {(row['task'], int(row['seed'])): {
        'wall': float(row['zoo_wall']), 'process': float(row['zoo_process']),
        'final_return': float(row['zoo_final_return'])} for row in csv.DictReader(f)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--sb3_python', default=None, help='python of the SB3 environment')
  parser.add_argument('--tasks', default='CartPole-v1,Acrobot-v1,MountainCar-v0,LunarLander-v3')
  parser.add_argument('--seeds', default='0')
  parser.add_argument('--out', default='runs/against_zoo')
  parser.add_argument('--gin_bindings', action='append', default=[])
  parser.add_argument('--zoo_from', default=None,
                      help="an earlier run's against_zoo.csv: its Zoo rows, SB3 not run again")
  args = parser.parse_args()
  if not (args.sb3_python or args.zoo_from):
    parser.error('give --sb3_python (run the Zoo) or --zoo_from (reuse its earlier rows)')
  out = os.path.abspath(args.out)
  os.makedirs(out, exist_ok=True)
  print('| task | seed | Zoo wall s (process) | Zoo final_return | harness wall s (process) '
        '| harness final_return | harness / Zoo |\n|---|---|---|---|---|---|---|', flush=True)
  rows = []
  earlier = _zoo_rows(args.zoo_from) if args.zoo_from else None
  for task in args.tasks.split(','):
    for seed in (int(s) for s in args.seeds.split(',')):
      theirs = earlier[(task, seed)] if earlier else zoo(args.sb3_python, task, seed, out)
      ours = harness(task, seed, out, args.gin_bindings)
      ratio = ours['wall'] / theirs['wall']
      rows.append({'task': task, 'seed': seed, 'zoo_wall': theirs['wall'],
                   'zoo_process': round(theirs['process'], 1),
                   'zoo_final_return': theirs['final_return'],
                   'harness_wall': round(ours['wall'], 1),
                   'harness_process': round(ours['process'], 1),
                   'harness_final_return': ours['final_return'], 'ratio': round(ratio, 3)})
      print(f"| {task} | {seed} | {theirs['wall']:.1f} ({theirs['process']:.1f}) | "
            f"{theirs['final_return']:.1f} | {ours['wall']:.1f} ({ours['process']:.1f}) | "
            f"{ours['final_return']:.1f} | {ratio:.2f}x |", flush=True)
  with open(os.path.join(out, 'against_zoo.csv'), 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)


if __name__ == '__main__':
  main()
