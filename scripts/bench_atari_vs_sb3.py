"""Learning-phase agent steps/s on Atari: the harness and SB3 DQN alternating, in one run.

Per pair: a `harness-train` run of gin/ddqn_atari.gin as shipped (overlap on) with a
small table and few random steps (scripts/bench_overlap.py's run, its flags), then
scripts/sb3_atari.py in SB3's own venv with the same table size, random steps and
agent steps (RL Zoo's Atari settings otherwise). One run at a time; run it on an
otherwise idle machine. Prints each run, the median of each side and their ratio.

  python scripts/bench_atari_vs_sb3.py --sb3_python=/work/sb3venv/bin/python --pairs=3
  python scripts/bench_atari_vs_sb3.py --sb3_python=/work/sb3venv/bin/python --game=Pong
  python scripts/bench_atari_vs_sb3.py --sb3_python=/work/sb3venv/bin/python \
      --harness=pool_pin128 --harness=pin128 --harness=jemalloc+bfloat16 \
      --harness='pool_pin128;configure_threads.intra_op_threads=1'

Each --harness is a setting of the harness side: an allocator of
scripts/bench_allocators.py (pool_pin128 is what the file ships), optionally with
`+float32` or `+bfloat16` for make_agent.compute_dtype (without it, the file's own
'auto': bfloat16 where the hardware has bfloat16 units), then optionally gin
bindings of that setting alone, each after a `;`. Every setting takes its turn in
each pair, and each gets its ratio to SB3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import List

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_allocators  # pylint: disable=wrong-import-position  (the allocator settings)
import bench_overlap  # pylint: disable=wrong-import-position  (--pairs, --steps, the harness run)

_SB3_PYTHON = flags.DEFINE_string('sb3_python', None, 'Python of a venv with '
                                  'stable-baselines3, torch and ale-py.', required=True)
_GAME = flags.DEFINE_string('game', 'Breakout', 'ALE game: ALE/<game>-v5 for the harness, '
                            '<game>NoFrameskip-v4 (wrapped as the Zoo does) for SB3.')
_HARNESS = flags.DEFINE_multi_string(
    'harness', ['pool_pin128'], 'Harness settings: ALLOCATOR or ALLOCATOR+DTYPE (float32 or '
    f'bfloat16), with ALLOCATOR one of {", ".join(bench_allocators.ALLOCATORS)} (pool_pin128 '
    'alone: as shipped).')


def harness_runner(setting: str):
  """A runner of one harness setting ('jemalloc+bfloat16;binding'): returns agent steps/s."""
  setting_bindings = setting.split(';')
  allocator, _, dtype = setting_bindings.pop(0).partition('+')
  if allocator not in bench_allocators.ALLOCATORS or dtype not in ('', 'float32', 'bfloat16'):
    raise app.UsageError(f'--harness={setting}: use ALLOCATOR or ALLOCATOR+DTYPE (float32 or '
                         f'bfloat16), with ALLOCATOR one of '
                         f'{", ".join(bench_allocators.ALLOCATORS)}')
  environment, bindings, _ = bench_allocators.ALLOCATORS[allocator]
  bindings = [*bindings, 'train_eval.overlap_training=True', *setting_bindings]
  if dtype:
    bindings.append(f"make_agent.compute_dtype='{dtype}'")
  name = setting.replace(';', '_').replace('=', '-').replace("'", '')  # a folder name
  return lambda out_dir: bench_overlap.run_harness(name, out_dir, bindings, environment)


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
  runners = {f'harness {s}': harness_runner(s) for s in _HARNESS.value}
  runners['sb3'] = lambda _: sb3_rate(_SB3_PYTHON.value)
  medians = bench_overlap.alternate(runners, label=f'{_GAME.value} ')
  for setting in _HARNESS.value:
    print(f"{_GAME.value} harness {setting} / SB3: "
          f"{medians[f'harness {setting}'] / medians['sb3']:.2f}x (target >= 1.75x)")


if __name__ == '__main__':
  app.run(main)
