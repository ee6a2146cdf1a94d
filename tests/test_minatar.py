"""MinAtar through the real `minatar` package: ids, specs, 0/1 inputs, storage, a CLI run."""

import collections
import csv
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.train.utils import train_utils

from harness.rl import agents
from harness.rl import collect
from harness.rl import envs
from harness.rl import minatar
from harness.rl import replay
from harness.rl.agents import networks
from harness.rundir import checkpoints
from tests import cli

MINATAR_GIN = os.path.join(cli.REPO, 'gin', 'ddqn_minatar.gin')
# Grid channels, and the minimal action sets of -v1 (-v0 has all six actions).
CHANNELS = {'Asterix': 4, 'Breakout': 4, 'Freeway': 7, 'Seaquest': 10, 'SpaceInvaders': 6}
MINIMAL_ACTIONS = {'Asterix': 5, 'Breakout': 3, 'Freeway': 3, 'Seaquest': 6, 'SpaceInvaders': 4}


@pytest.mark.parametrize('env_id', minatar.ENV_IDS)
def test_every_game_makes_and_steps_with_binary_uint8_observations(env_id):
  game, version = env_id.split('/')[1].split('-v')
  env = envs.make_env(env_id, seed=0)
  spec = env.observation_spec()
  assert spec.shape == (10, 10, CHANNELS[game])
  assert spec.dtype == np.uint8
  assert (spec.minimum, spec.maximum) == (0, 1)
  actions = env.action_spec()
  assert actions.maximum - actions.minimum + 1 == (6 if version == '0' else MINIMAL_ACTIONS[game])
  time_step = env.reset()
  rng = np.random.default_rng(0)
  seen = set()
  for _ in range(50):
    assert time_step.observation.dtype == np.uint8
    seen |= set(np.unique(time_step.observation).tolist())
    time_step = env.step(np.int64(rng.integers(actions.minimum, actions.maximum + 1)))
  assert seen == {0, 1}
  env.close()


def test_binary_inputs_reach_the_network_as_zero_one_floats_and_pixels_are_scaled():
  env = envs.make_env('MinAtar/Breakout-v1', seed=0)
  spec = tensor_spec.from_spec(env.observation_spec())
  net = networks.q_network(spec, tensor_spec.from_spec(env.action_spec()), (8,), ((4, 3, 1),))
  observation = env.reset().observation[None]
  net(tf.constant(observation))
  first = net.layers[0]
  np.testing.assert_array_equal(first(tf.constant(observation)).numpy(),
                                observation.astype(np.float32))
  pixels = tensor_spec.BoundedTensorSpec((4, 4, 1), tf.uint8, 0, 255)
  pixel_net = networks.q_network(pixels, tensor_spec.from_spec(env.action_spec()), (8,), None)
  frame = np.full((1, 4, 4, 1), 255, np.uint8)
  pixel_net(tf.constant(frame))
  np.testing.assert_allclose(pixel_net.layers[0](tf.constant(frame)).numpy(), 1.0)


def test_a_stored_item_comes_back_as_collected():
  env = envs.make_env('MinAtar/Seaquest-v1', seed=0)
  agent = agents.make_agent(tensor_spec.from_spec(env.time_step_spec()),
                            tensor_spec.from_spec(env.action_spec()),
                            train_utils.create_train_step(), checkpoints.RunState().env_steps,
                            fc_layer_params=(8,), conv_layer_params=((4, 3, 1),)).agent
  layout = replay.StepReplay(agent.collect_data_spec, 2, 1)
  # One float32 row per step (float32 holds 0/1 exactly; Reverb compresses the chunks).
  assert set(layout.signature()) == {'step'}
  server = replay.start_server([layout.make_table(1000)], checkpoint_dir=None)
  try:
    observer = layout.make_observer(server.localhost_client(), 1)
    steps = []
    collect.Collector(env, agent.collect_policy, [observer, steps.append], 4).collect_random(200)
    observer.flush()
    windows = collections.defaultdict(list)
    for first, second in zip(steps, steps[1:]):
      windows[np.asarray(first.observation).tobytes()].append((first, second))
    experience, _ = next(iter(layout.make_dataset(f'localhost:{server.port}', batch_size=16)))
    assert experience.observation.dtype == tf.uint8
    for row in range(16):
      candidates = windows[experience.observation[row, 0].numpy().tobytes()]

      def same(window, row=row):
        return all(np.array_equal(getattr(experience, field)[row, t].numpy(),
                                  np.asarray(getattr(window[t], field)))
                   for t in range(2) for field in ('observation', 'action', 'reward',
                                                   'discount', 'step_type', 'next_step_type'))
      assert any(same(w) for w in candidates), f'sampled row {row} was never collected'
  finally:
    server.stop()


def test_a_misspelt_game_gets_one_line_and_exit_2(tmp_path):
  root = tmp_path / 'run'
  result = cli.harness_train(str(root), ["make_env.env_id='MinAtar/Breakot-v1'"],
                             gin_files=[MINATAR_GIN])
  assert result.returncode == 2, cli.tail(result)
  lines = [line for line in result.stderr.splitlines() if line.strip()]
  assert len(lines) == 1, result.stderr
  assert "did you mean 'MinAtar/Breakout-v1'" in lines[0]
  assert not root.exists()


def _rows(path):
  with open(path) as f:
    return list(csv.DictReader(f))


@pytest.mark.slow
def test_short_minatar_run_through_the_cli_then_a_resume(tmp_path):
  root = str(tmp_path / 'minatar')
  bindings = [
      'train_eval.num_env_steps=1200', 'train_eval.initial_collect_steps=200',
      'train_eval.replay_capacity=2000', 'train_eval.eval_interval=600',
      'train_eval.eval_episodes=2', 'train_eval.final_eval_episodes=2',
      'train_eval.log_interval=200', 'train_eval.checkpoint_interval=600',
      'make_agent.epsilon_decay_steps=1000']
  result = cli.harness_train(root, bindings, gin_files=[MINATAR_GIN])
  assert result.returncode == 0, cli.tail(result)
  rows = _rows(os.path.join(root, 'metrics.csv'))
  assert {r['train_traces'] for r in rows} == {'1'}
  with open(os.path.join(root, 'results.json')) as f:
    first = json.load(f)
  assert first['env_steps'] >= 1200
  # Breakout episodes under a random-ish policy are short: there are training episodes.
  assert first['train_return_last100'] is not None and first['train_return_last100'] >= 0

  bindings[0] = 'train_eval.num_env_steps=2000'
  result = cli.harness_train(root, bindings + ['make_agent.epsilon_greedy=0.02'],
                             gin_files=[MINATAR_GIN])
  assert result.returncode == 0, cli.tail(result)
  rows = _rows(os.path.join(root, 'metrics.csv'))
  assert int(rows[-1]['env_steps']) >= 2000
  assert float(rows[-1]['epsilon']) == pytest.approx(0.02)
  train_steps = [int(r['train_step']) for r in rows]
  assert train_steps == sorted(set(train_steps))  # unique and increasing across the resume
  with open(os.path.join(root, 'results.json')) as f:
    second = json.load(f)
  assert second['train_step'] > first['train_step']
  assert second['episodes'] > first['episodes']
