"""SB3's DQN over several seeds per MinAtar game, resumable, with the same statistics as our sweeps.

The harness's MinAtar rows are five seeds through `harness-sweep`; the question "are
its returns no worse than SB3's?" needs SB3's five seeds too, not seed 0 alone. This
runs `scripts/sb3_minatar.py` (in SB3's own venv) for each missing (game, seed) pair,
JOBS at a time, each writing `OUT/<game>-<frames>-<seed>.json` (the script's results
line); pairs already in OUT at that budget are skipped, so a stopped run resumes with the
same command, and another `--frames` never mixes with them.
Then it prints per game the IQM [95% bootstrap CI] of `train_return_last100` (the
published curves' protocol) and of `final_return`, computed by
`harness.sweeps.aggregate.iqm_ci` (rliable), the function behind harness-sweep's summary.

    python scripts/sb3_minatar_seeds.py --sb3_python=/tmp/sb3/bin/python \
        [--games=Breakout,Freeway,SpaceInvaders] [--seeds=0,1,2,3,4] [--jobs=2] \
        [--threads=1] [--out=runs/sb3_minatar_seeds] [--summary_only]

The runs' speeds are not figures when JOBS > 1 (they share the cores); only returns
are. SB3 seeds torch and the env, so a (game, seed) pair repeats its returns.
"""

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
from typing import List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from harness.sweeps import aggregate  # pylint: disable=wrong-import-position


def result_path(out: str, game: str, frames: int, seed: int) -> str:
  return os.path.join(out, f'{game}-{frames}-{seed}.json')


def run_one(sb3_python: str, out: str, game: str, seed: int, frames: int, threads: int) -> str:
  """Runs one SB3 seed; writes its results line only when it finished (so a kill resumes)."""
  path = result_path(out, game, frames, seed)
  with open(path + '.log', 'w') as log:
    result = subprocess.run(
        [sb3_python, 'scripts/sb3_minatar.py', f'--game={game}', f'--seed={seed}',
         f'--frames={frames}', f'--threads={threads}'],
        stdout=subprocess.PIPE, stderr=log, cwd=REPO, text=True, check=True)
  line = result.stdout.strip().splitlines()[-1]
  json.loads(line)  # a results line, or fail here rather than in the summary
  with open(path + '.tmp', 'w') as f:
    f.write(line + '\n')
  os.replace(path + '.tmp', path)
  return f'{game} seed {seed}: {line}'


def summary(out: str, games: List[str], frames: int, seeds: List[int]) -> List[str]:
  """One markdown row per game of the seeds finished at `frames`."""
  rows = ['| game | seeds | IQM train_return_last100 [95% CI] | per seed | '
          'IQM final_return [95% CI] | per seed |', '|---|---|---|---|---|---|']
  for game in games:
    results: List[dict] = []
    for seed in sorted(seeds):
      path = result_path(out, game, frames, seed)
      if os.path.exists(path):
        with open(path) as f:
          results.append(json.load(f))
    if not results:
      continue
    cells = [game, ','.join(str(r['seed']) for r in results)]
    for field in ('train_return_last100', 'final_return'):
      values = [r[field] for r in results]
      point, low, high = aggregate.iqm_ci(values)
      cells += [f'{point:.2f} [{low:.2f}, {high:.2f}]', ', '.join(f'{v:.2f}' for v in values)]
    rows.append('| ' + ' | '.join(cells) + ' |')
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--sb3_python', help='python of a venv with torch, SB3 and minatar')
  parser.add_argument('--games', default='Breakout,Freeway,SpaceInvaders')
  parser.add_argument('--seeds', default='0,1,2,3,4')
  parser.add_argument('--frames', type=int, default=1_000_000)
  parser.add_argument('--jobs', type=int, default=2, help='SB3 runs at a time')
  parser.add_argument('--threads', type=int, default=1, help='torch threads per run')
  parser.add_argument('--out', default=os.path.join(REPO, 'runs', 'sb3_minatar_seeds'))
  parser.add_argument('--summary_only', action='store_true')
  args = parser.parse_args()
  games = args.games.split(',')
  seeds = [int(s) for s in args.seeds.split(',')]
  os.makedirs(args.out, exist_ok=True)
  if not args.summary_only:
    if not args.sb3_python:
      parser.error('--sb3_python is required unless --summary_only')
    todo = [(g, s) for g in games for s in seeds
            if not os.path.exists(result_path(args.out, g, args.frames, s))]
    # A thread per running subprocess: the work is in the SB3 processes themselves.
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
      futures = [pool.submit(run_one, args.sb3_python, args.out, g, s, args.frames,
                             args.threads) for g, s in todo]
      for future in concurrent.futures.as_completed(futures):
        print(future.result(), flush=True)
  print('\n'.join(summary(args.out, games, args.frames, seeds)))


if __name__ == '__main__':
  main()
