"""Learning-phase agent steps/s on Atari: the harness and SB3 DQN alternating, in one run.

Per pair: a `harness-train` run of gin/ddqn_atari.gin as shipped (overlap on) with a
small table and few random steps (scripts/bench_overlap.py's run, its flags), then
scripts/sb3_atari.py in SB3's own venv with the same table size, random steps and
agent steps (RL Zoo's Atari settings otherwise). One run at a time; run it on an
otherwise idle machine. Prints each run, the median of each side and their ratio.

  python scripts/bench_atari_vs_sb3.py --sb3_python=/work/sb3venv/bin/python --pairs=3
  python scripts/bench_atari_vs_sb3.py --sb3_python=/work/sb3venv/bin/python --game=Pong
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_overlap  # pylint: disable=wrong-import-position  (--pairs, --steps, the harness run)

_SB3_PYTHON = flags.DEFINE_string('sb3_python', None, 'Python of a venv with '
                                  'stable-baselines3, torch and ale-py.', required=True)
_GAME = flags.DEFINE_string('game', 'Breakout', 'ALE game: ALE/<game>-v5 for the harness, '
                            '<game>NoFrameskip-v4 (wrapped as the Zoo does) for SB3.')


def sb3_rate(python: str) -> float:
  out = subprocess.run(
      [python, os.path.join(bench_overlap.REPO, 'scripts', 'sb3_atari.py'),
       f'--env_id={_GAME.value}NoFrameskip-v4', f'--steps={bench_overlap.STEPS.value}',
       f'--learning_starts={bench_overlap.INITIAL.value}',
       f'--buffer_size={bench_overlap.CAPACITY.value}'],
      check=True, capture_output=True, text=True).stdout
  return json.loads(out.strip().splitlines()[-1])['learning_phase_agent_steps_per_sec']


def main(argv: List[str]) -> None:
  del argv
  flags.FLAGS.gin_bindings = [f"make_env.env_id='ALE/{_GAME.value}-v5'",
                              *flags.FLAGS.gin_bindings]
  out_dir = tempfile.mkdtemp(prefix='bench-atari-sb3-')
  rates: Dict[str, List[float]] = {'harness': [], 'sb3': []}
  try:
    for pair in range(bench_overlap.PAIRS.value):
      rates['harness'].append(bench_overlap.run_once('overlap', out_dir))
      print(f'pair {pair + 1} harness: {rates["harness"][-1]:.1f} agent steps/s', flush=True)
      rates['sb3'].append(sb3_rate(_SB3_PYTHON.value))
      print(f'pair {pair + 1} sb3: {rates["sb3"][-1]:.1f} agent steps/s', flush=True)
  finally:
    shutil.rmtree(out_dir, ignore_errors=True)
  medians = {name: statistics.median(values) for name, values in rates.items()}
  for name, median in medians.items():
    print(f'{_GAME.value} {name}: median {median:.1f} agent steps/s over {len(rates[name])} '
          f'runs ({", ".join(f"{v:.1f}" for v in rates[name])})')
  print(f"{_GAME.value} harness / SB3: {medians['harness'] / medians['sb3']:.2f}x "
        '(target >= 1.75x)')


if __name__ == '__main__':
  app.run(main)
