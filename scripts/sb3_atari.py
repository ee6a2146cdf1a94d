"""The reference beside our Atari speed rows: Stable-Baselines3 DQN with RL Zoo's Atari settings.

Trains SB3's DQN on an ALE game as RL Baselines3 Zoo's `hyperparams/dqn.yml`
(`atari`: AtariWrapper, 4 stacked frames, Nature CNN, Adam 1e-4, batch 32, one
gradient step every 4 agent steps, target copy every 1,000 steps, one env), with
the replay size and random steps given on the command line so that it matches
the harness run it is compared with. Prints one JSON line: the agent steps per
second of the learning phase (from the first step after `--learning_starts` to
the last, as scripts/bench_overlap.py reads the harness's metrics.csv), the
wall time, and the number of training episodes.

Needs Stable-Baselines3, PyTorch and ale-py, which the harness's venv must not
get; use a venv of their own (README, "Benchmarks"):

  /work/sb3venv/bin/python scripts/sb3_atari.py --env_id=BreakoutNoFrameskip-v4 --steps=7000
"""

import argparse
import json
import os
import sys
import time

import gymnasium as gym
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_reference  # pylint: disable=wrong-import-position  (the learning-phase clock)

# The Zoo's `atari` block of hyperparams/dqn.yml (buffer_size and learning_starts
# come from the command line: the Zoo's 100,000 each are a 10M-step run's).
SETTINGS = dict(learning_rate=1e-4, batch_size=32, target_update_interval=1000, train_freq=4,
                gradient_steps=1, exploration_fraction=0.1, exploration_final_eps=0.01,
                optimize_memory_usage=False)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--env_id', default='BreakoutNoFrameskip-v4')
  parser.add_argument('--steps', type=int, default=7000, help='agent steps (4 frames each)')
  parser.add_argument('--learning_starts', type=int, default=2000)
  parser.add_argument('--buffer_size', type=int, default=20_000)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--threads', type=int, default=2, help='torch intra-op threads')
  args = parser.parse_args()
  import ale_py  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from stable_baselines3 import DQN  # pylint: disable=g-import-not-at-top
  from stable_baselines3.common.env_util import make_atari_env  # pylint: disable=g-import-not-at-top
  from stable_baselines3.common.vec_env import VecFrameStack  # pylint: disable=g-import-not-at-top

  gym.register_envs(ale_py)
  torch.set_num_threads(args.threads)

  env = VecFrameStack(make_atari_env(args.env_id, n_envs=1, seed=args.seed), n_stack=4)
  model = DQN('CnnPolicy', env, seed=args.seed, verbose=0, device='cpu',
              buffer_size=args.buffer_size, learning_starts=args.learning_starts, **SETTINGS)
  clock = zoo_reference.learning_phase_clock(args.learning_starts)
  start = time.time()
  model.learn(total_timesteps=args.steps, callback=clock)
  wall = time.time() - start
  rate = clock.rate()
  episodes = model.ep_info_buffer
  print(json.dumps({
      'system': 'sb3', 'env_id': args.env_id, 'seed': args.seed, 'agent_steps': args.steps,
      'learning_phase_agent_steps_per_sec': round(rate, 1), 'wall_seconds': round(wall, 1),
      'mean_episode_return': float(np.mean([e['r'] for e in episodes])) if episodes else None,
      'threads': args.threads}))


if __name__ == '__main__':
  main()
