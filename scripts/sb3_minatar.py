"""The reference beside our MinAtar rows: Stable-Baselines3 DQN with gin/ddqn_minatar.gin's settings.

Trains SB3's DQN on a MinAtar game with the same network (one 3x3 conv of 16
filters, stride 1, no padding -> 128 ReLU units -> Q-values; SB3's NatureCNN
cannot run on a 10x10 grid), replay, batch, cadence, optimizer, target period
and epsilon schedule as `gin/ddqn_minatar.gin`, then prints one JSON line with
the fields results.json has: `train_return_last100` (the mean return of the
last 100 training episodes, the published curves' protocol), the final greedy
policy's `final_return` over `--episodes` episodes, `env_steps`, `wall_seconds`
(training only) and `env_steps_per_sec`, and `learning_phase_env_steps_per_sec`
(from the first step after the random frames to the last: what the harness's
metrics rows give, model building and the final evaluation left out on both sides).

What cannot be the same: SB3's DQN has no Double-DQN target (the harness's
agent is Double DQN), and it steps one env where the gin file steps four as a
batch. Gradient clipping is off on both sides (SB3's default clips at 10).

Needs Stable-Baselines3, PyTorch and minatar, which the harness's venv must not
get; use a venv of their own:

  python3 -m venv /tmp/sb3 && /tmp/sb3/bin/pip install torch stable-baselines3 \
      minatar==1.0.15 'numpy<2'
  /tmp/sb3/bin/python scripts/sb3_minatar.py --game=Breakout --seed=0
  /tmp/sb3/bin/python scripts/sb3_minatar.py --game=Breakout --frames=100000 --threads=2
"""

import argparse
import collections
import json
import os
import sys
import time

import gymnasium as gym
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import zoo_reference  # pylint: disable=wrong-import-position  (the same greedy evaluation)

GAMES = ('Asterix', 'Breakout', 'Freeway', 'Seaquest', 'SpaceInvaders')

# gin/ddqn_minatar.gin in SB3's terms. SB3 counts target_update_interval in env
# steps (1,000 frames = 250 updates at one update per 4 frames) and
# exploration_fraction as a share of the frames (set in main()).
SETTINGS = dict(learning_rate=2.5e-4, buffer_size=100_000, learning_starts=5_000,
                batch_size=32, gamma=0.99, train_freq=4, gradient_steps=1,
                target_update_interval=1_000, exploration_initial_eps=1.0,
                exploration_final_eps=0.1, max_grad_norm=1e10)
EPSILON_DECAY_FRAMES = 100_000
ADAM_EPSILON = 3.125e-4


class ChannelsFirstFloat(gym.ObservationWrapper):
  """MinAtar's (10, 10, C) booleans as (C, 10, 10) float32 0/1, the layout torch convs take."""

  def __init__(self, env: gym.Env):
    super().__init__(env)
    h, w, c = env.observation_space.shape
    self.observation_space = gym.spaces.Box(0.0, 1.0, (c, h, w), np.float32)

  def observation(self, observation):
    return np.moveaxis(np.asarray(observation, np.float32), -1, 0)


def make_env(game: str, version: int, seed: int) -> gym.Env:
  import minatar.gym  # pylint: disable=g-import-not-at-top
  if f'MinAtar/{game}-v{version}' not in gym.registry:
    minatar.gym.register_envs()
  env = ChannelsFirstFloat(gym.make(f'MinAtar/{game}-v{version}'))
  env.reset(seed=seed)
  return env


def minatar_extractor():
  """The MinAtar paper's conv feature extractor as an SB3 BaseFeaturesExtractor class."""
  import torch  # pylint: disable=g-import-not-at-top
  from stable_baselines3.common.torch_layers import BaseFeaturesExtractor  # pylint: disable=g-import-not-at-top

  class MinAtarCNN(BaseFeaturesExtractor):

    def __init__(self, observation_space: gym.spaces.Box, features_dim: int = 128):
      super().__init__(observation_space, features_dim)
      channels, height, width = observation_space.shape
      self.net = torch.nn.Sequential(
          torch.nn.Conv2d(channels, 16, kernel_size=3, stride=1), torch.nn.ReLU(),
          torch.nn.Flatten(),
          torch.nn.Linear(16 * (height - 2) * (width - 2), features_dim), torch.nn.ReLU())

    def forward(self, observations):
      return self.net(observations)

  return MinAtarCNN


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--game', choices=GAMES, required=True)
  parser.add_argument('--version', type=int, choices=(0, 1), default=0,
                      help='0: all six actions (as gin/ddqn_minatar.gin), 1: minimal set')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--frames', type=int, default=1_000_000)
  parser.add_argument('--train_freq', type=int, default=4, help='frames per gradient step')
  parser.add_argument('--episodes', type=int, default=20, help='final evaluation episodes')
  parser.add_argument('--threads', type=int, default=2, help='torch intra-op threads')
  args = parser.parse_args()
  import torch  # pylint: disable=g-import-not-at-top
  from stable_baselines3 import DQN  # pylint: disable=g-import-not-at-top
  from stable_baselines3.common.monitor import Monitor  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(args.threads)
  env = Monitor(make_env(args.game, args.version, args.seed))
  settings = dict(SETTINGS, train_freq=args.train_freq,
                  exploration_fraction=EPSILON_DECAY_FRAMES / args.frames)
  model = DQN('CnnPolicy', env, seed=args.seed, verbose=0, device='cpu',
              policy_kwargs=dict(features_extractor_class=minatar_extractor(),
                                 features_extractor_kwargs=dict(features_dim=128),
                                 net_arch=[], normalize_images=False,
                                 optimizer_kwargs=dict(eps=ADAM_EPSILON)),
              **settings)
  clock = zoo_reference.learning_phase_clock(SETTINGS['learning_starts'])
  start = time.time()
  model.learn(total_timesteps=args.frames, callback=clock)
  wall = time.time() - start
  last100 = collections.deque(env.get_episode_rewards(), maxlen=100)
  returns = zoo_reference.evaluate(model, None, args.episodes, seed=20_000 + args.seed,
                                   env=make_env(args.game, args.version, 20_000 + args.seed))
  print(json.dumps({
      'system': 'sb3', 'env_id': f'MinAtar/{args.game}-v{args.version}', 'seed': args.seed,
      'train_return_last100': float(np.mean(last100)) if last100 else None,
      'final_return': float(returns.mean()), 'final_return_std': float(returns.std()),
      'episodes': len(env.get_episode_rewards()), 'env_steps': args.frames,
      'train_freq': args.train_freq, 'wall_seconds': round(wall, 1),
      'env_steps_per_sec': round(args.frames / wall, 1),
      'learning_phase_env_steps_per_sec': round(clock.rate(), 1), 'threads': args.threads}))


if __name__ == '__main__':
  main()
