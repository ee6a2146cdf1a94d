"""The gymnasium adapter: specs, seeding, termination vs truncation discounts."""

import gin
import gymnasium as gym
import numpy as np
import pytest
from tf_agents.trajectories import time_step as ts

from harness.base.errors import UsageError
from harness.rl import envs
from harness.run import evaluation


def _run_until_last(env, action):
  time_step = env.reset()
  steps = 0
  while not time_step.is_last():
    time_step = env.step(np.array(action, np.int64))
    steps += 1
  return time_step, steps


def test_specs_come_from_the_gymnasium_spaces():
  env = envs.make_env('CartPole-v1', seed=0)
  assert env.observation_spec().shape == (4,)
  assert env.observation_spec().dtype == np.float32
  assert env.action_spec().dtype == np.int64
  assert (env.action_spec().minimum, env.action_spec().maximum) == (0, 1)


def test_termination_has_discount_zero():
  # Always pushing left makes the pole fall long before the 500-step limit.
  env = envs.make_env('CartPole-v1', seed=0)
  last, steps = _run_until_last(env, 0)
  assert steps < 100
  assert last.step_type == ts.StepType.LAST
  assert last.discount == 0.0


def test_truncation_has_discount_one_so_the_target_bootstraps():
  # A 3-step limit truncates before the pole can fall: discount stays 1.
  env = envs.GymnasiumPyEnvironment(gym.make('CartPole-v1', max_episode_steps=3), seed=0)
  last, steps = _run_until_last(env, 0)
  assert steps == 3
  assert last.step_type == ts.StepType.LAST
  assert last.discount == 1.0


def test_mid_episode_steps_have_discount_one_and_auto_reset_follows_last():
  env = envs.GymnasiumPyEnvironment(gym.make('CartPole-v1', max_episode_steps=2), seed=0)
  env.reset()
  mid = env.step(np.int64(1))
  assert mid.step_type == ts.StepType.MID and mid.discount == 1.0
  assert env.step(np.int64(1)).is_last()
  assert env.step(np.int64(1)).is_first()


def test_seed_goes_through_reset():
  first = envs.make_env('CartPole-v1', seed=7).reset().observation
  again = envs.make_env('CartPole-v1', seed=7).reset().observation
  other = envs.make_env('CartPole-v1', seed=8).reset().observation
  np.testing.assert_array_equal(first, again)
  assert not np.array_equal(first, other)


def test_continuous_action_space_is_refused():
  with pytest.raises(UsageError, match='Discrete action space'):
    envs.make_env('Pendulum-v1')


def test_unknown_env_id_suggests_close_ids():
  with pytest.raises(UsageError, match="CartPole-v1"):
    envs.make_env('CartPole-v7')


def test_batched_env_steps_several_envs_as_one_batch():
  env = envs.make_batched_env(3, seed=0)
  time_step = env.reset()
  assert time_step.observation.shape == (3, 4)
  next_step = env.step(np.zeros(3, np.int64))
  assert next_step.reward.shape == (3,)


def _episode_ends(env, num_envs, steps):
  """(batched step, discount) of every LAST step of each env over `steps` steps."""
  env.reset()
  ends = {i: [] for i in range(num_envs)}
  for t in range(1, steps + 1):
    time_step = env.step(np.zeros(num_envs, np.int64))
    for i in np.flatnonzero(time_step.step_type == ts.StepType.LAST):
      ends[i].append((t, float(time_step.discount[i])))
  return ends


def test_collect_envs_start_their_episodes_at_different_times():
  # MountainCar pushed left never reaches the goal: every episode runs to the
  # 200-step limit, so unstaggered envs would end theirs together for good.
  with gin.unlock_config():
    gin.bind_parameter('make_env.env_id', 'MountainCar-v0')
    gin.bind_parameter('make_batched_env.stagger_first_episodes', True)
  try:
    ends = _episode_ends(envs.make_batched_env(4, seed=0), 4, 460)
  finally:
    gin.clear_config()
  # Env i's first episode is cut at i/4 of the limit as a truncation (discount 1,
  # bootstrapped); every later one is whole (the step after LAST is the reset).
  assert ends == {0: [(200, 1.0), (401, 1.0)], 1: [(50, 1.0), (251, 1.0), (452, 1.0)],
                  2: [(100, 1.0), (301, 1.0)], 3: [(150, 1.0), (351, 1.0)]}


def test_evaluation_envs_play_whole_episodes_in_step():
  with gin.unlock_config():
    gin.bind_parameter('make_env.env_id', 'MountainCar-v0')
    gin.bind_parameter('make_batched_env.stagger_first_episodes', True)  # collect only
  try:
    ends = _episode_ends(evaluation.make_eval_env(3, seed=0), 3, 210)
  finally:
    gin.clear_config()
  assert ends == {i: [(200, 1.0)] for i in range(3)}


def test_unstaggered_envs_run_their_episodes_in_lockstep():
  with gin.unlock_config():
    gin.bind_parameter('make_env.env_id', 'MountainCar-v0')
  try:
    ends = _episode_ends(envs.make_batched_env(2, seed=0), 2, 210)
  finally:
    gin.clear_config()
  assert ends == {0: [(200, 1.0)], 1: [(200, 1.0)]}
