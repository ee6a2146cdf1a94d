"""The agent options a gin file can turn on: dueling head, learning-rate schedule, n-step."""

import csv
import os

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.train.utils import train_utils

from harness.rl import agents
from harness.rl import envs
from harness.rundir import checkpoints
from tests.cli import TINY_BINDINGS, harness_train, tail


def _built(**kwargs):
  env = envs.make_env('CartPole-v1', seed=0)
  run_state = checkpoints.RunState()
  built = agents.make_agent(tensor_spec.from_spec(env.time_step_spec()),
                            tensor_spec.from_spec(env.action_spec()),
                            train_utils.create_train_step(), run_state.env_steps,
                            fc_layer_params=(8,), **kwargs)
  return built, run_state


def test_dueling_head_is_value_plus_centred_advantage():
  head = agents.DuelingHead(3)
  features = tf.constant(np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32))
  q_values = head(features).numpy()
  value = head._value(features).numpy()  # pylint: disable=protected-access
  advantage = head._advantage(features).numpy()  # pylint: disable=protected-access
  np.testing.assert_allclose(q_values, value + advantage - advantage.mean(-1, keepdims=True),
                             rtol=1e-5, atol=1e-6)
  # The mean over actions of Q is the state value.
  np.testing.assert_allclose(q_values.mean(-1), value[:, 0], rtol=1e-5, atol=1e-6)


def test_learning_rate_follows_its_schedule_over_env_steps():
  built, run_state = _built(learning_rate=1e-3, learning_rate_final=1e-4,
                            learning_rate_decay_steps=1000)
  for env_steps, expected in ((0, 1e-3), (500, 5.5e-4), (1000, 1e-4), (5000, 1e-4)):
    run_state.env_steps.assign(env_steps)
    built.update_learning_rate()
    assert float(built.learning_rate.numpy()) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize('schedule', [{}, {'learning_rate_final': 0.0}])
def test_constant_learning_rate_without_decay_steps(schedule):
  """No decay steps means constant, even with a final rate bound (as a gin file
  that decays may be overridden with make_agent.learning_rate_decay_steps=0)."""
  built, run_state = _built(learning_rate=2e-3, **schedule)
  run_state.env_steps.assign(10**6)
  built.update_learning_rate()
  assert float(built.learning_rate.numpy()) == pytest.approx(2e-3)


def test_resume_reports_only_the_learning_rate_bindings_that_changed():
  constant = (1e-3, 1e-3, 0)
  assert agents.schedule_changes('learning_rate', constant, (1e-4, 1e-4, 0)) == [
      ('make_agent.learning_rate', 1e-3, 1e-4)]
  assert agents.schedule_changes('learning_rate', constant, (0.0, 1e-3, 500)) == [
      ('make_agent.learning_rate_final', 1e-3, 0.0),
      ('make_agent.learning_rate_decay_steps', 0, 500)]


@pytest.mark.slow
def test_dueling_n_step_and_schedule_through_the_cli(tmp_path):
  """A real run with all three on, batched envs: it trains, exports, and the
  learning rate in metrics.csv falls linearly to its final value."""
  root = str(tmp_path / 'run')
  result = harness_train(root, TINY_BINDINGS + [
      'make_agent.dueling=True', 'make_agent.n_step_update=3',
      'train_eval.num_envs=2', 'train_eval.collect_steps_per_iteration=2',
      'train_eval.train_steps_per_iteration=2',
      'make_agent.learning_rate=1e-3', 'make_agent.learning_rate_final=0.0',
      'make_agent.learning_rate_decay_steps=600', 'train_eval.final_eval_episodes=2'])
  assert result.returncode == 0, tail(result)
  with open(os.path.join(root, 'metrics.csv'), newline='') as f:
    rows = list(csv.DictReader(f))
  for row in rows:
    # The rate the last gradient step used: at most one iteration (2 env steps) behind.
    expected = 1e-3 * (1 - int(row['env_steps']) / 600)
    assert float(row['learning_rate']) == pytest.approx(expected, abs=1e-3 * 4 / 600)
  assert {r['train_traces'] for r in rows} == {'1'}
  assert os.path.isfile(os.path.join(root, 'policies', 'greedy_policy', 'saved_model.pb'))
  assert os.path.isfile(os.path.join(root, 'results.json'))


def test_rmsprop_is_centred_and_takes_the_scheduled_learning_rate():
  built, _ = _built(optimizer='rmsprop', learning_rate=2.5e-4, rmsprop_rho=0.95,
                    rmsprop_epsilon=1e-4)
  assert isinstance(built.optimizer, tf.keras.optimizers.RMSprop)
  config = built.optimizer.get_config()
  assert config['centered'] and config['rho'] == pytest.approx(0.95)
  assert config['epsilon'] == pytest.approx(1e-4)
  assert config['momentum'] == 0.0
  built.update_learning_rate()
  assert float(built.learning_rate.numpy()) == pytest.approx(2.5e-4)


def test_rmsprop_takes_the_papers_momentum():
  built, _ = _built(optimizer='rmsprop', learning_rate=2.5e-4, rmsprop_momentum=0.95)
  assert built.optimizer.get_config()['momentum'] == pytest.approx(0.95)


@pytest.mark.parametrize('binding', [{'optimizer': 'sgd'}, {'rmsprop_rho': 1.0},
                                     {'rmsprop_epsilon': 0.0}, {'rmsprop_momentum': 1.0},
                                     {'rmsprop_momentum': -0.1}])
def test_bad_optimizer_settings_are_refused(binding):
  from harness.base.errors import UsageError  # pylint: disable=g-import-not-at-top
  with pytest.raises(UsageError, match=f'make_agent.{next(iter(binding))}='):
    agents.check_settings(**binding)
