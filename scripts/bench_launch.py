"""Aggregate env steps per second of `harness-launch` with 1, 2, ... collectors.

Usage:
  python scripts/bench_launch.py [--collectors 1 2] [--steps 15000] [--out_dir runs/bench_launch]
      [--gin_file gin/ddqn_cartpole.gin]

Each run: `harness-launch --gin_file=GIN --num_collectors=N` on embedded Ray,
`train_eval.num_env_steps=STEPS`, evaluation off (an eval interval past the target, two final
episodes). Start-up is excluded: a collector's rate runs from its first row acting with the
learner's weights (`policy_train_step` > 0) to its last row, and the aggregate is the sum over
the collectors. The learner's train steps/s come from metrics.csv (first row to last row).

The old launcher's figures (388 and 403 env steps/s, README of commit e105547) were measured with
that commit's CartPole config (replay ratio 1, 16 env steps then 16 gradient steps, 1-step
targets, no dueling head); for a like-for-like comparison:

  git show e105547:gin/ddqn_cartpole.gin > /tmp/cartpole_e105547.gin
  python scripts/bench_launch.py --gin_file /tmp/cartpole_e105547.gin

Those figures were taken on another day; to measure the old launcher beside harness-launch on
the same machine in one run, alternating (`--repeats` rounds):

  git worktree add --detach /tmp/old_launcher e105547
  python scripts/bench_launch.py --gin_file /tmp/cartpole_e105547.gin \
      --old_launcher_tree /tmp/old_launcher --repeats 2
"""

import argparse
import csv
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _rate(rows, x, t='wall_time'):
  return (float(rows[-1][x]) - float(rows[0][x])) / (float(rows[-1][t]) - float(rows[0][t]))


def collector_rate(path):
  rows = [r for r in _rows(path) if int(r['policy_train_step']) > 0]
  return _rate(rows, 'env_steps') if len(rows) >= 2 else float('nan')


def _launch_command(layout: str, root: str, n: int, gin_file: str, steps: int):
  """(command, cwd, environment) of one launch: harness-launch, or the old launcher."""
  bindings = [f'--gin_bindings=train_eval.num_env_steps={steps}',
              f'--gin_bindings=train_eval.eval_interval={10 * steps}']
  env = dict(os.environ)
  if layout == 'harness-launch':
    cmd = [sys.executable, '-m', 'harness.launch', '--gin_bindings=train_eval.final_eval_episodes=2']
    cwd = REPO
  else:  # a checkout of the old launcher's commit, run from its own tree
    cmd = [sys.executable, os.path.join(layout, 'scripts', 'launch_local.py')]
    cwd = layout
    env['PYTHONPATH'] = layout
  cmd += [f'--root_dir={root}', f'--gin_file={os.path.abspath(gin_file)}',
          f'--num_collectors={n}'] + bindings
  return cmd, cwd, env


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--collectors', type=int, nargs='+', default=[1, 2])
  parser.add_argument('--steps', type=int, default=15_000)
  parser.add_argument('--out_dir', default=os.path.join(REPO, 'runs', 'bench_launch'))
  parser.add_argument('--gin_file', default=os.path.join(REPO, 'gin', 'ddqn_cartpole.gin'))
  parser.add_argument('--old_launcher_tree', default=None,
                      help='a checkout of commit e105547 (git worktree add DIR e105547): its '
                           'scripts/launch_local.py runs beside harness-launch, alternating')
  parser.add_argument('--repeats', type=int, default=1)
  args = parser.parse_args()
  layouts = ['harness-launch'] + ([os.path.abspath(args.old_launcher_tree)]
                                  if args.old_launcher_tree else [])
  print(f'load average before: {os.getloadavg()}', flush=True)
  for repeat in range(args.repeats):
    for n in args.collectors:
      for layout in layouts:
        name = 'harness-launch' if layout == 'harness-launch' else 'old launch_local.py'
        root = os.path.join(args.out_dir, f'{name.split()[-1]}-collectors-{n}-{repeat}')
        shutil.rmtree(root, ignore_errors=True)
        cmd, cwd, env = _launch_command(layout, root, n, args.gin_file, args.steps)
        start = time.time()
        os.makedirs(args.out_dir, exist_ok=True)
        with open(root + '.log', 'w') as log:
          subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env, check=True)
        wall = time.time() - start
        rates = [collector_rate(os.path.join(root, 'collectors', f'collector-{i}.csv'))
                 for i in range(n)]
        learner = _rate(_rows(os.path.join(root, 'metrics.csv')), 'train_step')
        print(f'{name}, collectors {n}: aggregate {sum(rates):.0f} env steps/s '
              f'({", ".join(f"{r:.0f}" for r in rates)}), learner {learner:.0f} train steps/s, '
              f'wall {wall:.0f} s, load average after {os.getloadavg()[0]:.1f}', flush=True)


if __name__ == '__main__':
  main()
