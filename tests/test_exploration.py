"""ez-greedy: random actions held for zeta-distributed durations, per env, around the greedy policy."""

import numpy as np
import pytest
from tf_agents.specs import tensor_spec
from tf_agents.train.utils import train_utils
from tf_agents.trajectories import time_step as ts

from harness.base.errors import UsageError
from harness.rl import agents
from harness.rl import collect
from harness.rl import envs
from harness.rl import exploration
from harness.rundir import checkpoints
from tests.cli import TINY_BINDINGS, harness_train, tail

NUM_ENVS = 4


def _policy(settings=exploration.Exploration(temporally_extended=True), seed=0):
  env = envs.batched_py_environment.BatchedPyEnvironment(
      [envs.make_env('MountainCar-v0', seed=i) for i in range(NUM_ENVS)], multithreading=False)
  built = agents.make_agent(tensor_spec.from_spec(env.time_step_spec()),
                            tensor_spec.from_spec(env.action_spec()),
                            train_utils.create_train_step(), checkpoints.RunState().env_steps,
                            fc_layer_params=(16,))
  greedy = collect.py_policy_for(built.agent.policy, env)
  policy = exploration.TemporallyExtendedPolicy(greedy, built.epsilon, env, settings, seed)
  return env, built, greedy, policy


def _set_epsilon(built, policy, epsilon):
  built.epsilon.assign(end=epsilon, start=epsilon, decay_steps=0)
  policy.refresh()
  assert policy.epsilon == pytest.approx(epsilon)


def _mid(time_step, rng):
  """A MID step with observations spread over the state space (greedy actions vary)."""
  observation = np.stack([rng.uniform(-1.2, 0.6, NUM_ENVS), rng.uniform(-0.07, 0.07, NUM_ENVS)],
                         axis=1).astype(np.float32)
  return time_step._replace(step_type=np.full(NUM_ENVS, ts.StepType.MID, np.int32),
                            observation=observation)


def test_without_exploration_it_acts_greedily():
  env, built, greedy, policy = _policy()
  _set_epsilon(built, policy, 0.0)
  rng = np.random.default_rng(0)
  time_step = env.reset()
  for _ in range(100):
    time_step = _mid(time_step, rng)
    np.testing.assert_array_equal(policy.action(time_step).action,
                                  greedy.action(time_step).action)


def test_random_actions_are_held_for_runs_in_each_env():
  env, built, _, policy = _policy()
  _set_epsilon(built, policy, 1.0)
  rng = np.random.default_rng(0)
  time_step = env.reset()
  actions = np.stack([policy.action(_mid(time_step, rng)).action for _ in range(3000)])
  assert actions.shape == (3000, NUM_ENVS)
  assert set(np.unique(actions)) == {0, 1, 2}
  # Uniform draws at every step would switch action 2/3 of the time; holds of
  # zeta(2) durations (mean ~5.6 steps with the cap) switch far less often.
  switch_rate = np.mean(actions[1:] != actions[:-1], axis=0)
  assert np.all(switch_rate < 0.4), switch_rate
  # Each env holds its own action for its own time: the envs do not move together.
  assert np.mean(np.all(actions == actions[:, :1], axis=1)) < 0.5


def test_a_new_episode_ends_a_hold():
  # Near-endless holds (exponent close to 1), started with epsilon 1, then epsilon 0.
  settings = exploration.Exploration(temporally_extended=True, duration_exponent=1.01,
                                     max_duration=100_000)
  env, built, greedy, policy = _policy(settings)
  _set_epsilon(built, policy, 1.0)
  rng = np.random.default_rng(1)
  time_step = _mid(env.reset(), rng)
  policy.action(time_step)
  _set_epsilon(built, policy, 0.0)
  policy.action(time_step)
  assert policy.holding().sum() >= 2  # most holds outlast two steps at this exponent
  first = time_step._replace(step_type=np.full(NUM_ENVS, ts.StepType.FIRST, np.int32))
  np.testing.assert_array_equal(policy.action(first).action, greedy.action(first).action)
  assert not policy.holding().any()


def test_the_same_seed_explores_the_same_way():
  env, built, greedy, first_policy = _policy()
  _set_epsilon(built, first_policy, 0.5)
  runs = []
  for _ in range(2):
    policy = exploration.TemporallyExtendedPolicy(
        greedy, built.epsilon, env, exploration.Exploration(temporally_extended=True), seed=5)
    rng = np.random.default_rng(2)
    time_step = env.reset()
    runs.append(np.stack([policy.action(_mid(time_step, rng)).action for _ in range(200)]))
  np.testing.assert_array_equal(runs[0], runs[1])


@pytest.mark.parametrize('kwargs, message', [
    (dict(duration_exponent=1.0), 'duration_exponent=1.0 must be a number above 1'),
    (dict(max_duration=0), 'max_duration=0 must be an integer of at least 1'),
])
def test_bad_settings_are_refused(kwargs, message):
  with pytest.raises(UsageError, match=message):
    exploration.Exploration(**kwargs)


@pytest.mark.slow
def test_harness_train_collects_with_it(tmp_path):
  root = str(tmp_path / 'run')
  result = harness_train(root, TINY_BINDINGS + ['Exploration.temporally_extended=True',
                                                'train_eval.num_envs=2'])
  assert result.returncode == 0, tail(result)
  with open(f'{root}/config/operative_config-0.gin') as f:
    assert 'Exploration.temporally_extended = True' in f.read()
  bad = harness_train(str(tmp_path / 'bad'), TINY_BINDINGS + ['Exploration.max_duration=0'])
  assert bad.returncode == 2 and 'Exploration.max_duration=0' in bad.stderr, tail(bad)
  assert not (tmp_path / 'bad').exists() or not list((tmp_path / 'bad').iterdir())
