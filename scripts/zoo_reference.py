"""The reference beside our benchmarks: Stable-Baselines3 DQN with RL Baselines3 Zoo's settings.

Trains SB3's DQN with the hyperparameters of the Zoo's hyperparams/dqn.yml for a
classic-control task, then evaluates the *final* policy the way results.json
does (20 greedy episodes, seeds of their own), and prints one JSON line:
task, seed, final_return, final_return_std, wall_seconds.

For a wall-time comparison with the harness, the protocol is the harness's:
`--eval_interval` and `--eval_episodes` (default: the task's gin file, e.g. 10
greedy episodes every 5,000 env steps) evaluate periodically with SB3's own
`EvalCallback`, and wall_seconds counts training and those evaluations, not the
final evaluation, as results.json counts a run's. `--eval_interval=0` gives
training only.

Needs Stable-Baselines3 and PyTorch, which the harness does not depend on;
use a virtual environment of their own:

  python3 -m venv /tmp/sb3 && /tmp/sb3/bin/pip install torch stable-baselines3 \
      'gymnasium[classic-control]' box2d==2.3.10
  /tmp/sb3/bin/python scripts/zoo_reference.py --task=CartPole-v1 --seed=0
"""

import argparse
import json
import time

import gymnasium as gym
import numpy as np

# hyperparams/dqn.yml of RL Baselines3 Zoo (shared/REFERENCES.md). SB3 counts
# target_update_interval in env steps; exploration_fraction is of n_timesteps.
ZOO = {
    'CartPole-v1': dict(n_timesteps=50_000, learning_rate=2.3e-3, batch_size=64,
                        buffer_size=100_000, learning_starts=1000, gamma=0.99,
                        target_update_interval=10, train_freq=256, gradient_steps=128,
                        exploration_fraction=0.16, exploration_final_eps=0.04,
                        net_arch=[256, 256]),
    'Acrobot-v1': dict(n_timesteps=100_000, learning_rate=6.3e-4, batch_size=128,
                       buffer_size=50_000, learning_starts=0, gamma=0.99,
                       target_update_interval=250, train_freq=4, gradient_steps=-1,
                       exploration_fraction=0.12, exploration_final_eps=0.1,
                       net_arch=[256, 256]),
    'LunarLander-v3': dict(n_timesteps=100_000, learning_rate=6.3e-4, batch_size=128,
                           buffer_size=50_000, learning_starts=0, gamma=0.99,
                           target_update_interval=250, train_freq=4, gradient_steps=-1,
                           exploration_fraction=0.12, exploration_final_eps=0.1,
                           net_arch=[256, 256]),
    'MountainCar-v0': dict(n_timesteps=120_000, learning_rate=4e-3, batch_size=128,
                           buffer_size=10_000, learning_starts=1000, gamma=0.98,
                           target_update_interval=600, train_freq=16, gradient_steps=8,
                           exploration_fraction=0.2, exploration_final_eps=0.07,
                           net_arch=[256, 256]),
}


# The harness's gin files: env steps between evaluations, episodes per evaluation.
EVAL_PROTOCOL = {'CartPole-v1': (2500, 10), 'Acrobot-v1': (5000, 10),
                 'LunarLander-v3': (5000, 10), 'MountainCar-v0': (5000, 10)}


def learning_phase_clock(learning_starts: int):
  """An SB3 callback that notes (wall time, env steps) at the first step after
  `learning_starts` and at every step after it; `.rate()` is the env steps per
  second of the learning phase (random steps, model building and the final
  evaluation left out, as the harness's rate from its metrics rows)."""
  from stable_baselines3.common.callbacks import BaseCallback  # pylint: disable=g-import-not-at-top

  class LearningPhaseClock(BaseCallback):

    def __init__(self):
      super().__init__()
      self.first = None
      self.last = None

    def _on_step(self) -> bool:
      if self.num_timesteps > learning_starts:
        now = (time.perf_counter(), self.num_timesteps)
        self.first = self.first or now
        self.last = now
      return True

    def rate(self) -> float:
      return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])

  return LearningPhaseClock()


def evaluate(model, task: str, episodes: int, seed: int, env=None) -> np.ndarray:
  """Returns of `episodes` greedy episodes of `model` on `env` (default: gym.make(task)),
  episode i reset with seed + i."""
  env = env if env is not None else gym.make(task)
  returns = []
  for episode in range(episodes):
    obs, _ = env.reset(seed=seed + episode)
    done, total = False, 0.0
    while not done:
      action, _ = model.predict(obs, deterministic=True)
      obs, reward, terminated, truncated, _ = env.step(int(action))
      total += float(reward)
      done = terminated or truncated
    returns.append(total)
  return np.asarray(returns)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--task', choices=sorted(ZOO), required=True)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--episodes', type=int, default=20, help='final evaluation episodes')
  parser.add_argument('--eval_interval', type=int, default=None,
                      help="env steps between evaluations (default: the harness's gin file)")
  parser.add_argument('--eval_episodes', type=int, default=None)
  args = parser.parse_args()
  from stable_baselines3 import DQN  # pylint: disable=g-import-not-at-top
  from stable_baselines3.common.callbacks import EvalCallback  # pylint: disable=g-import-not-at-top
  interval, episodes = EVAL_PROTOCOL[args.task]
  interval = interval if args.eval_interval is None else args.eval_interval
  episodes = episodes if args.eval_episodes is None else args.eval_episodes
  settings = dict(ZOO[args.task])
  steps = settings.pop('n_timesteps')
  net_arch = settings.pop('net_arch')
  model = DQN('MlpPolicy', gym.make(args.task), policy_kwargs=dict(net_arch=net_arch),
              seed=args.seed, verbose=0, device='cpu', **settings)
  callback = (EvalCallback(gym.make(args.task), n_eval_episodes=episodes, eval_freq=interval,
                           deterministic=True, verbose=0) if interval > 0 else None)
  start = time.time()
  model.learn(total_timesteps=steps, callback=callback)
  wall = time.time() - start
  returns = evaluate(model, args.task, args.episodes, seed=20_000 + args.seed)
  print(json.dumps({'task': args.task, 'seed': args.seed, 'final_return': float(returns.mean()),
                    'final_return_std': float(returns.std()), 'wall_seconds': round(wall, 1),
                    'env_steps': steps, 'eval_interval': interval, 'eval_episodes': episodes}))


if __name__ == '__main__':
  main()
