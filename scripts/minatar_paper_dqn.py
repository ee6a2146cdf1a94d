"""The published curves' own code on this machine: MinAtar's examples/dqn.py, run unchanged.

The MinAtar rows of docs/benchmarks.md are compared with the DQN curves of
MinAtar's README (Young & Tian 2019), read by eye at 1M frames. This script
runs the program that drew those curves, `examples/dqn.py` of a MinAtar
checkout (it is not in the PyPI package), so that the published figure can be
told apart from what that code scores today on this machine and this minatar
version. Nothing of dqn.py is copied or changed: the file is imported, its
frame budget constant is set to `--frames`, Python's, numpy's and torch's
generators and the environment are seeded (dqn.py seeds nothing), and its own
`dqn()` trains. Its results file holds every training episode's return; this
script prints one JSON line with results.json's protocol field,
`train_return_last100` (the mean return of the last 100 training episodes at
the end of the budget, and at each quarter of it), beside the frames per second
of the whole run.

dqn.py's settings, which this script does not touch: one gradient step per
frame, batch 32, centred RMSProp (step size 2.5e-4 unless `--step_size`
passes another to dqn()'s own `step_size` argument, as dqn.py's `--alpha`
does; squared-gradient decay 0.95, epsilon 0.01 outside the square root, no
momentum: the GRAD_MOMENTUM constant was never passed to the optimizer and
was deleted upstream in December 2024), replay 100,000, 5,000 random frames, target copy every 1,000
updates, epsilon 1.0 -> 0.1 over the 100,000 frames after the random ones,
a plain DQN target, sticky actions 0.1 and difficulty ramping (minatar's
defaults), all six actions.

Needs PyTorch and minatar, which the harness's venv must not get; the SB3
venv of scripts/sb3_minatar.py has both:

  git clone https://github.com/kenjyoung/MinAtar /tmp/MinAtar
  OMP_NUM_THREADS=1 /tmp/sb3/bin/python scripts/minatar_paper_dqn.py \
      --dqn_py=/tmp/MinAtar/examples/dqn.py --game=breakout --seed=0 --out=/tmp/paper_dqn
"""

import argparse
import importlib.util
import json
import os
import random
import time

import numpy as np

GAMES = ('asterix', 'breakout', 'freeway', 'seaquest', 'space_invaders')


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--dqn_py', required=True, help='examples/dqn.py of a MinAtar checkout')
  parser.add_argument('--game', required=True, choices=GAMES)
  parser.add_argument('--frames', type=int, default=1_000_000)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--step_size', type=float, default=None,
                      help="dqn()'s own step_size argument (its --alpha flag); default: "
                      "dqn.py's STEP_SIZE, 2.5e-4. The README's curves look drawn at each "
                      "game's best step size of the paper's sweep (docs/benchmarks.md)")
  parser.add_argument('--out', required=True, help='folder for dqn.py\'s results file')
  args = parser.parse_args()
  if not os.path.isfile(args.dqn_py):
    parser.error(f'--dqn_py={args.dqn_py} is not a file; point it at examples/dqn.py '
                 'of a MinAtar checkout')

  import torch  # pylint: disable=import-outside-toplevel  (only the reference's venv has it)
  from minatar import Environment  # pylint: disable=import-outside-toplevel

  spec = importlib.util.spec_from_file_location('minatar_dqn', args.dqn_py)
  dqn = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(dqn)
  dqn.NUM_FRAMES = args.frames  # read by dqn() at call time; the one setting changed

  torch.set_num_threads(1)
  random.seed(args.seed)
  np.random.seed(args.seed)
  torch.manual_seed(args.seed)
  env = Environment(args.game)
  env.seed(args.seed)

  os.makedirs(args.out, exist_ok=True)
  step_size = dqn.STEP_SIZE if args.step_size is None else args.step_size
  tag = '' if args.step_size is None else f'-alpha{args.step_size:g}'
  prefix = os.path.join(args.out, f'{args.game}-{args.frames}{tag}-{args.seed}')
  start = time.time()
  dqn.dqn(env, False, False, prefix, step_size=step_size)
  wall = time.time() - start

  # dqn() returns nothing: its results file is the only record of the episodes.
  results = torch.load(prefix + '_data_and_weights')
  returns = np.asarray(results['returns'])
  ends = np.asarray(results['frame_stamps'])  # the frame at which each episode ended

  def last100_at(frame: int) -> float:
    return round(float(np.mean(returns[ends <= frame][-100:])), 2)

  print(json.dumps({
      'system': 'minatar_examples_dqn', 'game': args.game, 'seed': args.seed,
      'step_size': step_size,
      'env_steps': args.frames, 'episodes': len(returns),
      'train_return_last100': last100_at(args.frames),
      # The same statistic at each quarter of the budget, as compare_cadence.py's columns.
      'train_return_last100_at': {q * args.frames // 4: last100_at(q * args.frames // 4)
                                  for q in (1, 2, 3)},
      'wall_seconds': round(wall, 1), 'env_steps_per_sec': round(args.frames / wall, 1)}))


if __name__ == '__main__':
  main()
