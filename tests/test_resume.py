"""Resuming with new bindings, refused changes, crash safety: real subprocesses."""

import glob
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from tests.cli import (assert_each_launch_ran_with_its_settings, harness_train, rows as _rows,
                       sigkill_after_first_checkpoint, snapshot as _snapshot, tail)

BASE = [
    'train_eval.initial_collect_steps=200',
    'train_eval.replay_capacity=5000',
    'train_eval.batch_size=32',
    'train_eval.log_interval=250',
    'train_eval.eval_interval=1000',
    'train_eval.eval_episodes=2',
    'train_eval.final_eval_episodes=2',
    'train_eval.checkpoint_interval=1000',
    'make_agent.fc_layer_params=(32,)',
    'make_agent.epsilon_decay_steps=0',
    'train_eval.num_envs=1',
    'train_eval.collect_steps_per_iteration=1',
    'train_eval.train_steps_per_iteration=1',
    'make_agent.learning_rate_decay_steps=0',  # constant, so each launch's rate is exact
]
FIRST = BASE + ['make_agent.epsilon_greedy=0.9', 'make_agent.learning_rate=1e-3',
                'train_eval.num_env_steps=2000']
SECOND = BASE + ['make_agent.epsilon_greedy=0.1', 'make_agent.learning_rate=1e-4',
                 'train_eval.num_env_steps=3000']


def _disagreement(collect_dir, greedy_dir, n=3000):
  """Fraction of random observations where the two saved policies disagree."""
  collect, greedy = tf.saved_model.load(collect_dir), tf.saved_model.load(greedy_dir)
  rng = np.random.default_rng(0)
  observations = tf.constant(rng.normal(0, 1, (n, 4)).astype(np.float32))
  time_step = ts.restart(observations, batch_size=n)
  a = collect.action(time_step).action.numpy()
  b = greedy.action(time_step).action.numpy()
  return float(np.mean(a != b))


@pytest.fixture(scope='module')
def resumed_run(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('resume') / 'run')
  first = harness_train(root, FIRST)
  assert first.returncode == 0, tail(first)
  before = str(tmp_path_factory.mktemp('policies_before'))
  for name in ('collect_policy', 'greedy_policy'):
    shutil.copytree(os.path.join(root, 'policies', name), os.path.join(before, name))
  rows_before = len(_rows(os.path.join(root, 'metrics.csv')))
  second = harness_train(root, SECOND)
  assert second.returncode == 0, tail(second)
  return root, before, rows_before, second


@pytest.mark.slow
def test_new_epsilon_and_learning_rate_take_effect_after_resume(resumed_run):
  root, _, rows_before, _ = resumed_run
  rows = assert_each_launch_ran_with_its_settings(os.path.join(root, 'metrics.csv'), rows_before,
                                                  (0.9, 1e-3), (0.1, 1e-4))
  new = rows[rows_before:]
  assert int(new[0]['replay_size']) > 0
  # train_step and env_steps continue (each train_step once: checked above).
  assert int(new[-1]['env_steps']) == 3000


@pytest.mark.slow
def test_resume_report_names_each_change(resumed_run):
  root, _, _, second = resumed_run
  reports = glob.glob(os.path.join(root, 'config', 'resume-*.txt'))
  assert len(reports) == 1
  text = open(reports[0]).read()
  assert 'make_agent.epsilon_greedy: 0.9 -> 0.1 [applied]' in text
  assert 'make_agent.learning_rate: 0.001 -> 0.0001 [applied]' in text
  assert 'make_agent.learning_rate: 0.001 -> 0.0001\n' in text  # re-applied after restore
  assert 'make_agent.epsilon_greedy: 0.9 -> 0.1\n' in text
  assert 'Resume re-applied make_agent.epsilon_greedy: 0.9 -> 0.1' in second.stdout + second.stderr
  assert len(glob.glob(os.path.join(root, 'config', 'operative_config-*.gin'))) == 2


@pytest.mark.slow
def test_saved_collect_policies_explore_with_their_own_epsilon(resumed_run):
  root, before, _, _ = resumed_run
  # Two actions: a random action differs from the greedy one half the time.
  old = _disagreement(os.path.join(before, 'collect_policy'),
                      os.path.join(before, 'greedy_policy'))
  new = _disagreement(os.path.join(root, 'policies', 'collect_policy'),
                      os.path.join(root, 'policies', 'greedy_policy'))
  assert old == pytest.approx(0.9 * 0.5, abs=0.04)
  assert new == pytest.approx(0.1 * 0.5, abs=0.03)


@pytest.mark.slow
def test_changed_network_is_refused_and_nothing_changes(resumed_run):
  root = resumed_run[0]
  before = _snapshot(root)
  result = harness_train(root, SECOND[:-1] + ['make_agent.fc_layer_params=(64, 64)',
                                              'train_eval.num_env_steps=4000'])
  assert result.returncode == 2
  last = result.stderr.strip().splitlines()[-1]
  assert 'make_agent.fc_layer_params' in last and 'new --root_dir' in last
  assert _snapshot(root) == before


@pytest.mark.slow
def test_changed_replay_capacity_is_refused(resumed_run):
  root = resumed_run[0]
  before = _snapshot(root)
  result = harness_train(root, SECOND + ['train_eval.replay_capacity=9000'])
  assert result.returncode == 2
  assert 'replay_capacity' in result.stderr.strip().splitlines()[-1]
  assert _snapshot(root) == before


@pytest.mark.slow
def test_sigkill_after_first_checkpoint_then_same_command_completes(tmp_path):
  root = str(tmp_path / 'run')
  bindings = BASE + ['train_eval.num_env_steps=2500', 'train_eval.checkpoint_interval=500']
  sigkill_after_first_checkpoint(root, bindings)  # somewhere mid-run
  result = harness_train(root, bindings)
  assert result.returncode == 0, tail(result)
  rows = _rows(os.path.join(root, 'metrics.csv'))
  steps = [int(r['train_step']) for r in rows]
  assert steps == sorted(set(steps)), 'a train_step appears twice in metrics.csv'
  assert int(rows[-1]['env_steps']) == 2500
  eval_steps = [int(r['train_step']) for r in _rows(os.path.join(root, 'eval.csv'))]
  assert eval_steps == sorted(set(eval_steps))
