"""Atari through ale-py: preprocessing, life loss, the frame-once replay, a CLI run.

Real ALE games and a real Reverb server on localhost. Episodes are kept short
with ALE's `max_num_frames_per_episode` so that a few hundred agent steps cross
several episode boundaries.
"""

import collections
import csv
import os

import numpy as np
import pytest
import reverb
import tensorflow as tf
from tf_agents.drivers import py_driver
from tf_agents.environments import batched_py_environment
from tf_agents.policies import random_py_policy
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory as trajectory_lib

from harness.base.errors import UsageError
from harness.rl import atari
from harness.rl import envs
from harness.rl import frame_replay
from harness.rl import replay
from tests import cli

ATARI_GIN = os.path.join(cli.REPO, 'gin', 'ddqn_atari.gin')
_FIELDS = ('observation', 'step_type', 'action', 'reward', 'discount', 'next_step_type')


def _game(env_id='ALE/Breakout-v5', seed=0, life_loss=False, max_frames=None):
  kwargs = {'frameskip': 1, 'repeat_action_probability': 0.25}
  if max_frames:
    kwargs['max_num_frames_per_episode'] = max_frames
  return envs.make_env(env_id, seed=seed, make_kwargs=kwargs,
                       wrappers=[atari.atari_preprocessing], life_loss_as_terminal=life_loss)


def _collect_data_spec(env):
  step_spec = tensor_spec.from_spec(env.time_step_spec())
  return trajectory_lib.Trajectory(
      step_type=step_spec.step_type, observation=step_spec.observation,
      action=tensor_spec.from_spec(env.action_spec()), policy_info=(),
      next_step_type=step_spec.step_type, reward=step_spec.reward,
      discount=step_spec.discount)


def test_observations_are_stacked_uint8_frames_channels_last():
  for env_id, num_actions in (('ALE/Breakout-v5', 4), ('ALE/Pong-v5', 6)):
    env = _game(env_id)
    spec = env.observation_spec()
    assert spec.shape == (84, 84, 4) and spec.dtype == np.uint8
    assert env.action_spec().maximum - env.action_spec().minimum + 1 == num_actions
    observation = env.reset().observation
    assert observation.shape == (84, 84, 4) and observation.dtype == np.uint8


def test_stacks_restart_with_copies_of_the_first_frame():
  env = _game(max_frames=200)  # 50 agent steps per episode at most
  time_step = env.reset()
  previous = None
  starts = 0
  for _ in range(150):
    obs = time_step.observation
    if time_step.is_first():
      starts += 1
      # A new episode: four copies of its first frame, nothing of the last one.
      for k in range(4):
        np.testing.assert_array_equal(obs[..., k], obs[..., 3])
    else:
      np.testing.assert_array_equal(obs[..., :3], previous[..., 1:])
    previous = obs
    time_step = env.step(np.int64(1))  # FIRE: the ball moves, frames differ
  assert starts >= 3


def _play_until_game_over(env, seed=0):
  """Random play until the game ends: (life-loss steps, their time steps, episode return)."""
  rng = np.random.default_rng(seed)
  time_step = env.reset()
  lives = [env.get_info()['lives']]
  discounts, episode_return = [], 0.0
  while True:
    time_step = env.step(np.int64(rng.integers(4)))
    episode_return += float(time_step.reward)
    lives.append(env.get_info()['lives'])
    if lives[-1] < lives[-2] and not time_step.is_last():
      discounts.append((time_step.step_type, float(time_step.discount)))
    if time_step.is_last():
      return lives, discounts, episode_return


def test_life_loss_is_terminal_for_the_target_only():
  lives, discounts, _ = _play_until_game_over(_game(life_loss=True))
  assert lives[0] == 5 and lives[-1] == 0  # one episode is the whole game
  assert len(discounts) == 4  # four lives lost before the game-ending one
  for step_type, discount in discounts:
    assert step_type == ts.StepType.MID and discount == 0.0

  _, discounts_off, _ = _play_until_game_over(_game(life_loss=False))
  assert discounts_off and all(d == 1.0 for _, d in discounts_off)


def test_life_loss_binding_needs_a_game_with_lives():
  with pytest.raises(UsageError, match='life_loss_as_terminal'):
    envs.make_env('CartPole-v1', life_loss_as_terminal=True)


def test_preprocessing_refuses_a_base_env_that_skips_frames():
  with pytest.raises(UsageError, match='frameskip'):
    envs.make_env('ALE/Breakout-v5', wrappers=[atari.atari_preprocessing])


def _matches(sample, steps):
  return all(np.array_equal(sample[f], np.stack([getattr(t, f) for t in steps])) for f in _FIELDS)


def test_sampled_stacks_equal_what_the_agent_saw():
  """Stored items, rebuilt from single frames, equal the agent's trajectories.

  Two envs stepped as one batch, life loss on, short episodes: the items cover
  episode starts, life losses and LAST->FIRST boundaries. A queue table hands
  out every item exactly once for an exhaustive check of the rebuild; the
  training dataset samples a uniform table through the same rebuild.
  """
  num_envs, steps, queue = 2, 300, 'queue'
  env = batched_py_environment.BatchedPyEnvironment(
      [_game(seed=s, life_loss=True, max_frames=300) for s in range(num_envs)],
      multithreading=False)
  frames = frame_replay.FrameReplay(_collect_data_spec(env), sequence_length=2,
                                    chunk_length=16)
  server = reverb.Server([
      frames.make_table(10_000),
      reverb.Table.queue(queue, max_size=10_000, signature=frames.signature())])
  try:
    client = server.localhost_client()
    observers = [frames.make_observer(client, num_envs),
                 frames.make_observer(client, num_envs, table=queue)]
    recorded = [[] for _ in range(num_envs)]

    def record(traj):
      for i in range(num_envs):
        recorded[i].append(tf.nest.map_structure(lambda x, i=i: np.asarray(x[i]), traj))

    policy = random_py_policy.RandomPyPolicy(
        env.time_step_spec(), env.action_spec(), outer_dims=(num_envs,))
    driver = py_driver.PyDriver(env, policy, observers + [record], max_steps=steps)
    driver.run(env.reset())
    for observer in observers:
      observer.flush()

    # Each env's first step gets padding, so every step but the last starts an
    # item, except episode ends (LAST -> FIRST would mix two episodes).
    expected = {(e, i) for e in range(num_envs) for i in range(len(recorded[e]) - 1)
                if recorded[e][i].step_type != ts.StepType.LAST}
    assert replay.table_size(client) == len(expected)
    starts = sum(int(t.step_type == ts.StepType.FIRST) for r in recorded for t in r)
    life_losses = sum(int(t.discount == 0 and t.step_type == ts.StepType.MID)
                      for r in recorded for t in r)
    assert starts >= 4 and life_losses >= 1
    by_first_obs = collections.defaultdict(list)
    for e, i in expected:
      by_first_obs[recorded[e][i].observation.tobytes()].append((e, i))

    # Exhaustive: every item of the queue, rebuilt in one batch.
    items = [s.data for s in client.sample(queue, num_samples=len(expected),
                                               emit_timesteps=False,
                                               unpack_as_table_signature=True)]
    batch = tf.nest.map_structure(lambda *x: tf.constant(np.stack(x)), *items)
    rebuilt = frames.stacked_trajectory(batch)
    matched = set()
    for b in range(len(items)):
      sample = {f: getattr(rebuilt, f).numpy()[b] for f in _FIELDS}
      assert sample['observation'].shape == (2, 84, 84, 4)
      candidates = [(e, i) for e, i in by_first_obs[sample['observation'][0].tobytes()]
                    if (e, i) not in matched and _matches(sample, recorded[e][i:i + 2])]
      assert candidates, f'item {b} differs from everything the agent saw'
      matched.add(candidates[0])
    assert matched == expected

    # The training dataset: uniform samples, batched, rebuilt in the graph.
    dataset = frames.make_dataset(f'localhost:{server.port}', batch_size=32)
    for traj, _ in dataset.take(3):
      assert traj.observation.shape == (32, 2, 84, 84, 4)
      for b in range(32):
        sample = {f: getattr(traj, f).numpy()[b] for f in _FIELDS}
        assert any(_matches(sample, recorded[e][i:i + 2])
                   for e, i in by_first_obs[sample['observation'][0].tobytes()])
    for observer in observers:
      observer.close()
  finally:
    server.stop()


def test_clip_reward_clips_the_sampled_reward_only():
  spec = _collect_data_spec(_game())
  frames = frame_replay.FrameReplay(spec, sequence_length=2, clip_reward=1.0)
  meta = np.zeros((1, frames.window, 5), np.float32)
  meta[..., 0] = ts.StepType.MID
  meta[..., 2] = [0.0, 0.0, 0.0, 7.0, -3.0]
  traj = frames.stacked_trajectory({'frame': tf.zeros((1, frames.window, 84, 84), tf.uint8),
                                    'meta': tf.constant(meta)})
  np.testing.assert_array_equal(traj.reward.numpy(), [[1.0, -1.0]])


def test_observer_refuses_observations_it_could_not_rebuild():
  env = _game()
  frames = frame_replay.FrameReplay(_collect_data_spec(env), sequence_length=2)
  server = reverb.Server([frames.make_table(100)])
  try:
    observer = frames.make_observer(server.localhost_client(), num_envs=1)
    first = env.reset()
    zero_padded = first.observation.copy()
    zero_padded[..., :3] = 0  # FrameStackObservation(padding_type='zero')
    traj = trajectory_lib.Trajectory(
        step_type=first.step_type, observation=zero_padded, action=np.int64(0),
        policy_info=(), next_step_type=np.int32(1), reward=np.float32(0),
        discount=np.float32(1))
    if np.any(first.observation[..., 3]):
      with pytest.raises(ValueError, match='frame stack'):
        observer(traj)
  finally:
    server.stop()


def test_frame_replay_refuses_non_image_observations():
  env = envs.make_env('CartPole-v1')
  with pytest.raises(UsageError, match='frame_replay'):
    frame_replay.frame_replay(_collect_data_spec(env), 2, enabled=True)


def _rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


@pytest.mark.slow
def test_short_breakout_run_through_the_cli(tmp_path):
  root = str(tmp_path / 'breakout')
  bindings = [
      'train_eval.num_env_steps=400',
      'train_eval.initial_collect_steps=100',
      'train_eval.replay_capacity=1000',
      'train_eval.batch_size=8',
      'train_eval.eval_interval=400',
      'train_eval.eval_episodes=1',
      # results.json's final evaluation (20 games by default) would be most of the test.
      'train_eval.final_eval_episodes=1',
      'train_eval.log_interval=100',
      'train_eval.checkpoint_interval=400',
      'make_agent.fc_layer_params=(32,)',
      # Short games keep the evaluation episode short.
      "make_env.make_kwargs={'frameskip': 1, 'repeat_action_probability': 0.25, "
      "'max_num_frames_per_episode': 1000}",
  ]
  result = cli.harness_train(root, bindings, gin_files=[ATARI_GIN])
  assert result.returncode == 0, result.stderr[-3000:]
  rows = _rows(os.path.join(root, 'metrics.csv'))
  assert int(rows[-1]['env_steps']) >= 400
  assert int(rows[-1]['replay_size']) > 0
  assert {r['train_traces'] for r in rows} == {'1'}
  assert len(_rows(os.path.join(root, 'eval.csv'))) == 1
  assert os.path.isdir(os.path.join(root, 'policies', 'greedy_policy'))
  config = open(os.path.join(root, 'config', 'operative_config-0.gin')).read()
  assert 'frame_replay.enabled = True' in config
  assert "'ALE/Breakout-v5'" in config
  size = int(rows[-1]['replay_size'])

  # Resume: the frame table comes back from its Reverb checkpoint and grows on.
  bindings[0] = 'train_eval.num_env_steps=500'
  result = cli.harness_train(root, bindings, gin_files=[ATARI_GIN])
  assert result.returncode == 0, result.stderr[-3000:]
  rows = _rows(os.path.join(root, 'metrics.csv'))
  assert int(rows[-1]['env_steps']) >= 500
  assert int(rows[-1]['replay_size']) > size
