"""The fast tier: pure functions tested in-process, in milliseconds.

Binding checks, the resume comparison, rate-limiter maths, the interval
triggers, results.json and the evaluation's episode counting; `exit_without_teardown`
in a small Python process of its own (no TensorFlow). The real-parts suite (subprocesses, Reverb, envs)
lives in the other files.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys

import gin
import numpy as np
import pytest
from tf_agents.environments import batched_py_environment
from tf_agents.environments import py_environment
from tf_agents.policies import random_py_policy
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from harness.base import errors
from harness.base.errors import UsageError
from harness.distributed import actors
from harness.distributed import jobs
from harness.rl import agents
from harness.run import evaluation
from harness.run import experiment
from harness.run import triggers
from harness.run.settings import Distributed, RunConfig
from harness.rundir import results
from harness.rundir import resume


def _config(**overrides) -> RunConfig:
  """train_eval's defaults (no gin bindings) with `overrides`."""
  gin.clear_config()
  return dataclasses.replace(experiment.settings_from_gin(root_dir='/tmp/unused'), **overrides)


# --- triggers -------------------------------------------------------------------

@pytest.mark.parametrize('before,after,interval,expected', [
    (0, 999, 1000, False), (999, 1000, 1000, True), (1000, 1999, 1000, False),
    (990, 2010, 1000, True), (1000, 1000, 1000, False)])
def test_crossed(before, after, interval, expected):
  assert triggers.crossed(before, after, interval) is expected


def test_iterate_fires_triggers_on_boundaries_and_at_the_end():
  steps = iter([16, 32, 48, 64, 70])
  fired = []
  trigger = triggers.IntervalTrigger(30, fired.append)
  end = triggers.iterate(lambda: next(steps), 0, 70, [trigger])
  assert end == 70
  assert fired == [32, 64, 70]  # 30 crossed at 32, 60 at 64, and the end


def test_iterate_stops_between_iterations_when_asked():
  calls = []

  def iteration():
    calls.append(1)
    return len(calls) * 10

  end = triggers.iterate(iteration, 0, 1000, [], should_stop=lambda: len(calls) >= 3)
  assert end == 30 and len(calls) == 3


# --- settings checks ------------------------------------------------------------

def test_default_settings_are_valid():
  assert _config().validate().replay_ratio == 1.0


@pytest.mark.parametrize('name,value,words', [
    ('num_env_steps', 0, 'must be a positive integer'),
    ('batch_size', 'big', 'must be a positive integer'),
    ('eval_epsilon', 1.5, 'outside [0, 1]'),
    ('initial_collect_steps', -1, '>= 0'),
    ('final_eval_episodes', 0, 'must be a positive integer'),
])
def test_bad_run_settings_name_the_binding(name, value, words):
  with pytest.raises(UsageError) as raised:
    _config(**{name: value}).validate()
  assert f'train_eval.{name}=' in str(raised.value) and words in str(raised.value)


def test_batch_must_split_over_envs():
  with pytest.raises(UsageError, match='multiple of train_eval.num_envs'):
    _config(num_envs=3, batch_size=64).validate()


@pytest.mark.parametrize('kwargs,words', [
    ({'epsilon_greedy': 1.5}, 'make_agent.epsilon_greedy=1.5 is outside [0, 1]'),
    ({'learning_rate': -1e-3}, 'make_agent.learning_rate=-0.001 must be a positive'),
    ({'n_step_update': 0}, 'make_agent.n_step_update=0'),
    ({'td_errors_loss_fn': 'l1'}, "td_errors_loss_fn='l1' is unknown"),
])
def test_bad_agent_settings_name_the_binding(kwargs, words):
  with pytest.raises(UsageError) as raised:
    agents.check_settings(**kwargs)
  assert words in str(raised.value)


# --- binding names --------------------------------------------------------------

def test_typo_in_a_binding_suggests_the_harness_name():
  assert errors.suggest_binding('train_eval.num_env_step')[0] == 'train_eval.num_env_steps'
  assert 'make_agent.epsilon_greedy' in errors.suggest_binding('train_eval.epsilon_greedy')


def test_gin_error_becomes_one_line():
  gin.clear_config()
  with pytest.raises(ValueError) as raised:
    gin.parse_config_files_and_bindings([], ['train_eval.num_env_step=5'])
  error = errors.gin_usage_error(raised.value, ['train_eval.num_env_step=5'])
  assert '\n' not in str(error)
  assert "unknown gin binding 'train_eval.num_env_step'" in str(error)
  assert "did you mean 'train_eval.num_env_steps'" in str(error)


# --- resume comparison ----------------------------------------------------------

def test_resume_comparison_applies_and_refuses():
  before = ("make_agent.learning_rate = 0.001\nmake_agent.fc_layer_params = (32,)\n"
            "train_eval.root_dir = '/a'\n")
  after = ("make_agent.learning_rate = 0.0001\nmake_agent.fc_layer_params = (64,)\n"
           "train_eval.root_dir = '/b'\n")
  changes = {c.binding: c for c in resume.compare(before, after)}
  assert set(changes) == {'make_agent.learning_rate', 'make_agent.fc_layer_params'}
  assert changes['make_agent.learning_rate'].refused_because is None
  assert 'Q-network shapes' in changes['make_agent.fc_layer_params'].refused_because


def test_a_resume_may_not_change_rmsprops_momentum():
  # Keras' RMSprop has momentum slots only when the momentum is above 0.
  changes = resume.compare('make_agent.rmsprop_momentum = 0.0\n',
                           'make_agent.rmsprop_momentum = 0.95\n')
  assert [c.binding for c in changes] == ['make_agent.rmsprop_momentum']
  assert 'momentum slots' in changes[0].refused_because


# --- rate limiter ---------------------------------------------------------------

@pytest.mark.parametrize('rows_per_item', [1, 4])
def test_rate_limiter_holds_the_replay_ratio_whatever_the_grouping(rows_per_item):
  samples_per_insert, min_items, error_buffer = jobs.rate_limiter_settings(
      batch_size=64, replay_ratio=0.5, initial_collect_steps=1000,
      rows_per_item=rows_per_item, tolerance_inserts=500)
  # Inserting k items brings k * rows_per_item env steps; training them at the
  # ratio takes k * rows_per_item * 0.5 gradient steps of 64 / rows_per_item items.
  items_sampled_per_item = rows_per_item * 0.5 * 64 / rows_per_item
  assert samples_per_insert == pytest.approx(items_sampled_per_item)
  assert min_items == 1000 // rows_per_item
  assert error_buffer == pytest.approx(500 * samples_per_insert)


# --- distributed launch ---------------------------------------------------------

def test_default_job_resources_fit_two_cores():
  need = actors.required_resources(Distributed(), num_collectors=2, eval_job=True)
  assert need['CPU'] <= 2 and need['GPU'] == 0


@pytest.mark.parametrize('field,value,words', [
    ('learner_cpus', -1, 'Distributed.learner_cpus=-1 must be a number >= 0'),
    ('learner_gpus', 'one', 'Distributed.learner_gpus'),
    ('max_restarts', -2, 'Distributed.max_restarts=-2'),
    ('replay_port', 70000, 'Distributed.replay_port=70000')])
def test_bad_launch_settings_name_the_binding(field, value, words):
  with pytest.raises(UsageError, match=re.escape(words)):
    dataclasses.replace(Distributed(), **{field: value}).validate()


def test_jobs_find_the_server_again_on_every_try_and_name_the_fix():
  tries = []

  def find():
    tries.append(1)
    raise ConnectionError('no replay actor')

  locator = jobs.ReplayLocator(find, 'the replay job did not come back')
  with pytest.raises(UsageError, match='the replay job did not come back, or raise '
                     'Distributed.max_unreachable_seconds'):
    jobs.wait_for_server(locator, limit_s=0.5)
  assert len(tries) >= 2


# --- results.json ---------------------------------------------------------------

def test_results_round_trip_and_torn_file(tmp_path):
  values = {key: 1.0 for key in results.KEYS}
  results.write_results(str(tmp_path), values)
  assert results.read_results(str(tmp_path)) == values
  (tmp_path / results.RESULTS_FILE).write_text('{"final_return": ')
  assert results.read_results(str(tmp_path)) is None
  (tmp_path / results.RESULTS_FILE).write_text(json.dumps({'final_return': 1.0}))
  assert results.read_results(str(tmp_path)) is None  # incomplete


# --- evaluation -------------------------------------------------------------------

class _FixedLengthEnv(py_environment.PyEnvironment):
  """Episodes of exactly `length` steps, reward 1 per step, whatever the action."""

  def __init__(self, length: int):
    super().__init__(handle_auto_reset=True)
    self._length = length
    self._t = 0
    self.actions = []

  def observation_spec(self):
    return array_spec.ArraySpec((1,), np.float32)

  def action_spec(self):
    return array_spec.BoundedArraySpec((), np.int64, 0, 1)

  def _reset(self):
    self._t = 0
    return ts.restart(np.zeros(1, np.float32))

  def _step(self, action):
    self.actions.append(int(action))
    self._t += 1
    observation = np.full(1, self._t, np.float32)
    if self._t == self._length:
      return ts.termination(observation, np.float32(1.0))
    return ts.transition(observation, np.float32(1.0))


@pytest.mark.parametrize('episodes,epsilon,expected', [
    (3, 0.0, [1, 2, 3]), (5, 0.0, [1, 2, 3, 1, 2]), (3, 1.0, [1, 2, 3])])
def test_evaluation_counts_one_episode_per_env_not_the_first_to_finish(episodes, epsilon,
                                                                       expected):
  # Three envs whose episodes last 1, 2 and 3 steps: the first three episodes to
  # finish would be 1, 1 and 2 steps long (short episodes favoured).
  env = batched_py_environment.BatchedPyEnvironment([_FixedLengthEnv(n) for n in (1, 2, 3)])
  policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), env.action_spec(),
                                           outer_dims=(3,))
  result = evaluation.Evaluation(env, policy, episodes, epsilon=epsilon, seed=0).run()
  assert result.lengths == expected
  assert result.returns == [float(n) for n in expected]
  assert result.episodes == episodes


@pytest.mark.parametrize('epsilon', [0.0, 0.5])
def test_evaluation_epsilon_replaces_some_actions_per_env(epsilon):
  # The policy always says 0; only the evaluation's epsilon can play a 1.
  envs_ = [_FixedLengthEnv(50) for _ in range(3)]
  env = batched_py_environment.BatchedPyEnvironment(envs_)
  always_zero = array_spec.BoundedArraySpec((), np.int64, 0, 0)
  policy = random_py_policy.RandomPyPolicy(env.time_step_spec(), always_zero, outer_dims=(3,))
  evaluation.Evaluation(env, policy, 3, epsilon=epsilon, seed=0).run()
  for one in envs_:
    played = one.actions[:50]  # its counted episode
    share = sum(played) / len(played)
    if epsilon == 0:
      assert share == 0
    else:  # random action with probability 0.5, a 1 half of those times
      assert 0.05 < share < 0.5


def test_eval_env_is_as_wide_as_the_episodes_up_to_the_cap():
  gin.clear_config()
  assert evaluation.make_eval_env(3, seed=0).batch_size == 3
  wide = evaluation.make_eval_env(evaluation.MAX_PARALLEL_EPISODES + 5, seed=0)
  assert wide.batch_size == evaluation.MAX_PARALLEL_EPISODES


# --- exit without teardown --------------------------------------------------------

@pytest.mark.parametrize('code,status,stderr', [(None, 0, ''), (143, 143, ''),
                                                ('bad thing', 1, 'bad thing')])
def test_exit_without_teardown_keeps_sys_exit_meaning_and_runs_atexit(code, status, stderr):
  program = ('import atexit, sys\n'
             'from harness.base import cli\n'
             'atexit.register(lambda: print("atexit ran", flush=True))\n'
             'print("before", end="")\n'  # unflushed: must still come out
             f'cli.exit_without_teardown({code!r})\n'
             'print("not reached")\n')
  result = subprocess.run([sys.executable, '-c', program], capture_output=True, text=True,
                          timeout=120, cwd=os.path.dirname(os.path.dirname(__file__)))
  assert result.returncode == status
  assert result.stdout == 'beforeatexit ran\n'
  assert result.stderr.strip() == stderr
