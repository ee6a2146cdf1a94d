"""`harness-train` end to end in a subprocess: every file of the run directory."""

import csv
import glob
import os
import textwrap

import pytest

from tests.cli import TINY_BINDINGS, harness_train, tail

METRICS_COLUMNS = {'train_step', 'env_steps', 'wall_time', 'steps_per_sec', 'loss', 'epsilon',
                   'learning_rate', 'replay_size', 'avg_return', 'rss_mb'}
EVAL_COLUMNS = {'train_step', 'env_steps', 'avg_return', 'avg_episode_length', 'episodes'}


def _rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('cli') / 'run')
  result = harness_train(root, TINY_BINDINGS + ['make_agent.epsilon_greedy=0.2',
                                                'make_agent.epsilon_decay_steps=0',
                                                'make_agent.learning_rate=5e-4'])
  assert result.returncode == 0, tail(result)
  return root


def test_run_directory_holds_every_file(tiny_run):
  root = tiny_run
  assert os.path.isfile(os.path.join(root, 'config', 'operative_config-0.gin'))
  assert glob.glob(os.path.join(root, 'train', 'ckpt-*.index'))
  assert glob.glob(os.path.join(root, 'train', 'events.out.tfevents.*'))
  assert glob.glob(os.path.join(root, 'eval', 'events.out.tfevents.*'))
  replay_checkpoints = [d for d in os.listdir(os.path.join(root, 'replay'))
                        if os.path.isdir(os.path.join(root, 'replay', d))]
  assert len(replay_checkpoints) == 1
  for name in ('greedy_policy', 'collect_policy', 'best_policy'):
    assert os.path.isfile(os.path.join(root, 'policies', name, 'saved_model.pb')), name
  assert not glob.glob(os.path.join(root, 'policies', '*.tmp'))


def test_operative_config_records_what_the_launch_used(tiny_run):
  text = open(os.path.join(tiny_run, 'config', 'operative_config-0.gin')).read()
  assert "make_env.env_id = 'CartPole-v1'" in text
  assert 'train_eval.num_env_steps = 600' in text


def test_metrics_csv_columns_and_live_values(tiny_run):
  rows = _rows(os.path.join(tiny_run, 'metrics.csv'))
  assert METRICS_COLUMNS <= set(rows[0])
  assert [int(r['env_steps']) for r in rows] == [200, 300, 400, 500, 600]
  for row in rows:
    assert float(row['epsilon']) == pytest.approx(0.2)
    assert float(row['learning_rate']) == pytest.approx(5e-4)
    assert int(row['replay_size']) > 0
    assert float(row['rss_mb']) > 0
  # Compiled once: trace counts never move from the first row to the last. The MLP's
  # collect policy runs in numpy (harness.rl.host_policy), so it has no trace at all.
  assert {r['train_traces'] for r in rows} == {'1'}
  assert {r['policy_traces'] for r in rows} == {'0'}
  assert int(rows[-1]['train_step']) == 500  # one gradient step per env step after collect


def test_eval_csv_rows(tiny_run):
  rows = _rows(os.path.join(tiny_run, 'eval.csv'))
  assert EVAL_COLUMNS <= set(rows[0])
  assert [int(r['env_steps']) for r in rows] == [300, 600]
  assert all(int(r['episodes']) == 2 for r in rows)


@pytest.mark.slow
def test_target_is_absolute_a_second_launch_does_nothing_new(tiny_run):
  before = _rows(os.path.join(tiny_run, 'metrics.csv'))
  result = harness_train(tiny_run, TINY_BINDINGS + ['make_agent.epsilon_greedy=0.2',
                                                    'make_agent.epsilon_decay_steps=0',
                                                    'make_agent.learning_rate=5e-4'])
  assert result.returncode == 0, tail(result)
  assert _rows(os.path.join(tiny_run, 'metrics.csv')) == before


@pytest.mark.slow
def test_env_registered_by_a_module_that_the_gin_file_imports(tmp_path):
  (tmp_path / 'my_envs.py').write_text(textwrap.dedent('''
      import gymnasium as gym
      import numpy as np

      class Corridor(gym.Env):
        """Walk right to the end of a 5-cell corridor."""
        observation_space = gym.spaces.Box(0.0, 1.0, (5,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def reset(self, seed=None, options=None):
          super().reset(seed=seed)
          self.pos = 0
          return self._obs(), {}

        def _obs(self):
          obs = np.zeros(5, np.float32)
          obs[self.pos] = 1.0
          return obs

        def step(self, action):
          self.pos = max(0, min(4, self.pos + (1 if action == 1 else -1)))
          done = self.pos == 4
          return self._obs(), float(done), done, False, {}

      gym.register('MyCorridor-v0', entry_point=Corridor, max_episode_steps=20)
      '''))
  (tmp_path / 'corridor.gin').write_text(textwrap.dedent('''
      import my_envs
      make_env.env_id = 'MyCorridor-v0'
      '''))
  root = str(tmp_path / 'run')
  result = harness_train(root, TINY_BINDINGS + ['train_eval.num_env_steps=300'],
                         gin_files=[os.path.join(os.path.dirname(__file__), '..', 'gin',
                                                 'ddqn_cartpole.gin'),
                                    str(tmp_path / 'corridor.gin')])
  assert result.returncode == 0, tail(result)
  assert "make_env.env_id = 'MyCorridor-v0'" in open(
      os.path.join(root, 'config', 'operative_config-0.gin')).read()
  assert int(_rows(os.path.join(root, 'metrics.csv'))[-1]['env_steps']) == 300


@pytest.mark.slow
def test_continuous_action_env_is_refused_with_exit_status_2(tmp_path):
  root = tmp_path / 'run'
  result = harness_train(str(root), TINY_BINDINGS + ["make_env.env_id='Pendulum-v1'"])
  assert result.returncode == 2
  assert 'Discrete action space' in result.stderr.strip().splitlines()[-1]
  assert not root.exists()
