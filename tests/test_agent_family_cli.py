"""C51, QR-DQN and Rainbow through `harness-train` and `harness-eval` (real subprocesses): a resume
with a new epsilon and learning rate applies them, a resume with another agent or network
setting is refused with ROOT untouched, the exported policies play, bad bindings exit 2."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from tests.cli import REPO, assert_each_launch_ran_with_its_settings, harness_train, rows as _rows, snapshot as _snapshot, tail

BASE = [
    'train_eval.initial_collect_steps=100',
    'train_eval.replay_capacity=2000',
    'train_eval.batch_size=16',
    'train_eval.log_interval=100',
    'train_eval.eval_interval=500',
    'train_eval.eval_episodes=1',
    'train_eval.final_eval_episodes=2',
    'train_eval.checkpoint_interval=500',
    'make_agent.fc_layer_params=(16,)',
    'train_eval.num_envs=1',
    'train_eval.collect_steps_per_iteration=1',
    'train_eval.train_steps_per_iteration=1',
    'make_agent.learning_rate_decay_steps=0',
    'make_agent.epsilon_decay_steps=0',
]
FIRST = BASE + ['make_agent.epsilon_greedy=0.9', 'make_agent.learning_rate=1e-3',
                'train_eval.num_env_steps=500']
SECOND = BASE + ['make_agent.epsilon_greedy=0.1', 'make_agent.learning_rate=1e-4',
                 'train_eval.num_env_steps=800']
# Per agent: its gin file, and one more network setting that a resume must refuse.
AGENTS = {
    'c51': ('c51_cartpole.gin', 'make_agent.num_atoms=21'),
    'qrdqn': ('qrdqn_cartpole.gin', 'make_agent.num_quantiles=5'),
    'rainbow': ('rainbow_cartpole.gin', 'make_agent.noisy=False'),
}


def _disagreement(root, n=3000):
  """Fraction of random observations where the exported collect and greedy policies differ."""
  collect = tf.saved_model.load(os.path.join(root, 'policies', 'collect_policy'))
  greedy = tf.saved_model.load(os.path.join(root, 'policies', 'greedy_policy'))
  observations = tf.constant(np.random.default_rng(0).normal(0, 1, (n, 4)).astype(np.float32))
  time_step = ts.restart(observations, batch_size=n)
  return float(np.mean(collect.action(time_step).action.numpy()
                       != greedy.action(time_step).action.numpy()))


@pytest.fixture(scope='module', params=sorted(AGENTS))
def resumed(request, tmp_path_factory):
  agent = request.param
  gin_file = os.path.join(REPO, 'gin', AGENTS[agent][0])
  root = str(tmp_path_factory.mktemp(agent) / 'run')
  first = harness_train(root, FIRST, gin_files=[gin_file])
  assert first.returncode == 0, tail(first)
  rows_before = len(_rows(os.path.join(root, 'metrics.csv')))
  share_before = _disagreement(root)
  second = harness_train(root, SECOND, gin_files=[gin_file])
  assert second.returncode == 0, tail(second)
  return agent, gin_file, root, rows_before, share_before


@pytest.mark.slow
def test_resume_applies_the_new_epsilon_and_learning_rate(resumed):
  agent, _, root, rows_before, share_before = resumed
  rows = assert_each_launch_ran_with_its_settings(os.path.join(root, 'metrics.csv'), rows_before,
                                                  (0.9, 1e-3), (0.1, 1e-4))
  assert int(rows[-1]['env_steps']) == 800
  # One trace of the train step and of the policy in each launch.
  assert {r['train_traces'] for r in rows} == {'1'} and {r['policy_traces'] for r in rows} == {'1'}
  if agent == 'rainbow':
    assert rows[0]['per_beta'] != ''  # prioritized replay, priorities from the per-sample loss
  # The exported collect policy explores with the epsilon of its launch (two actions: a
  # random action differs from the greedy one half the time); Rainbow's noise adds to it.
  share_after = _disagreement(root)
  if agent == 'rainbow':
    assert share_before >= 0.9 * 0.5 - 0.04 and share_after >= 0.1 * 0.5 - 0.03
  else:
    assert share_before == pytest.approx(0.9 * 0.5, abs=0.04)
    assert share_after == pytest.approx(0.1 * 0.5, abs=0.03)
  with open(os.path.join(root, 'results.json')) as f:
    assert '"final_return"' in f.read()


@pytest.mark.slow
def test_resume_with_another_agent_or_network_setting_is_refused(resumed):
  agent, gin_file, root, _, _ = resumed
  other = 'ddqn' if agent != 'ddqn' else 'c51'
  before = _snapshot(root)
  for binding in (f"make_agent.agent='{other}'", AGENTS[agent][1]):
    result = harness_train(root, SECOND[:-1] + [binding, 'train_eval.num_env_steps=900'],
                           gin_files=[gin_file])
    assert result.returncode == 2, tail(result)
    last = result.stderr.strip().splitlines()[-1]
    assert binding.split('=')[0] in last and 'new --root_dir' in last, last
  assert _snapshot(root) == before


@pytest.mark.slow
def test_harness_eval_plays_the_exported_greedy_policy(resumed):
  _, _, root, _, _ = resumed
  result = subprocess.run([sys.executable, '-m', 'harness.evaluate',
                           f'--policy_dir={os.path.join(root, "policies", "greedy_policy")}',
                           '--episodes=2'], capture_output=True, text=True, timeout=180, cwd=REPO)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'CartPole-v1: return' in result.stdout


@pytest.mark.slow
# Two subprocesses (the checks of every binding are unit tests in test_agent_family.py):
# (0,) aborted the process (SIGABRT) after creating ROOT's folders before the checks existed.
@pytest.mark.parametrize('binding', ['make_agent.fc_layer_params=(0,)', 'make_agent.num_atoms=1'])
def test_a_bad_make_agent_binding_exits_2_with_one_line_and_creates_nothing(binding, tmp_path):
  root = tmp_path / 'run'
  result = harness_train(str(root), [binding])
  assert result.returncode == 2, tail(result)
  assert len(result.stderr.strip().splitlines()) == 1, result.stderr
  assert binding.split('=')[0] in result.stderr
  assert not root.exists()
