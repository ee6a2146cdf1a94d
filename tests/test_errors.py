"""Bad input to `harness-train`: one line on stderr, exit status 2, ROOT untouched.

Every case runs the real program in a subprocess. A case fails fast (before
TensorFlow builds anything), so each takes about the time of the imports.
"""

import os
import shutil
import stat
from typing import Dict, Optional

import pytest

from tests.cli import TINY_BINDINGS, harness_train

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def snapshot(root: str) -> Optional[Dict[str, bytes]]:
  """Every file under `root` (or `root` itself if a file) with its bytes; None if absent."""
  if not os.path.exists(root):
    return None
  if os.path.isfile(root):
    with open(root, 'rb') as f:
      return {'': f.read()}
  tree = {}
  for folder, dirs, files in os.walk(root):
    for name in dirs:
      tree[os.path.relpath(os.path.join(folder, name), root) + '/'] = b''
    for name in files:
      path = os.path.join(folder, name)
      with open(path, 'rb') as f:
        tree[os.path.relpath(path, root)] = f.read()
  return tree


def assert_clean_error(result, *keywords: str) -> str:
  """Exit status 2 and exactly one stderr line holding every keyword."""
  lines = result.stderr.splitlines()
  assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
  assert len(lines) == 1, result.stderr[-3000:]
  line = lines[0]
  assert line.startswith('harness-train: error: '), line
  for keyword in keywords:
    assert keyword in line, (keyword, line)
  assert 'Traceback' not in result.stdout + result.stderr
  return line


# (case id, extra bindings, extra flags, keywords the error line must hold)
BINDING_CASES = [
    ('unknown_parameter', ['train_eval.num_env_step=600'], [],
     ["'train_eval.num_env_step'", "did you mean 'train_eval.num_env_steps'"]),
    ('unknown_configurable', ['trian_eval.batch_size=8'], [],
     ["'trian_eval.batch_size'", "did you mean 'train_eval.batch_size'"]),
    ('parameter_on_wrong_configurable', ['train_eval.epsilon_greedy=0.1'], [],
     ["'train_eval.epsilon_greedy'", "'make_agent.epsilon_greedy'"]),
    ('binding_syntax', ['train_eval.batch_size=(8'], [],
     ['syntax error', 'train_eval.batch_size=(8']),
    ('unknown_env_id', ["make_env.env_id='CartPol-v1'"], [],
     ["unknown environment id 'CartPol-v1'", "'CartPole-v1'"]),
    ('continuous_mountaincar', ["make_env.env_id='MountainCarContinuous-v0'"], [],
     ['MountainCarContinuous-v0', 'Box action space', 'Discrete']),
    ('continuous_pendulum', ["make_env.env_id='Pendulum-v1'"], [],
     ['Pendulum-v1', 'Discrete']),
    ('zero_num_env_steps', ['train_eval.num_env_steps=0'], [],
     ['train_eval.num_env_steps=0', 'positive']),
    ('negative_batch_size', ['train_eval.batch_size=-4'], [],
     ['train_eval.batch_size=-4', 'positive']),
    ('zero_replay_capacity', ['train_eval.replay_capacity=0'], [],
     ['train_eval.replay_capacity=0', 'positive']),
    ('epsilon_above_one', ['make_agent.epsilon_greedy=1.5'], [],
     ['make_agent.epsilon_greedy=1.5', '[0, 1]']),
    ('epsilon_start_below_zero', ['make_agent.epsilon_start=-0.1'], [],
     ['make_agent.epsilon_start=-0.1', '[0, 1]']),
    ('collect_without_replay_address', [], ['--job=collect'],
     ['--job=collect', '--replay_address']),
    ('bad_flag_value', [], ['--job=colect'],
     ['--job=colect', 'collect']),
]


@pytest.mark.slow
@pytest.mark.parametrize('bindings,flags,keywords',
                         [c[1:] for c in BINDING_CASES], ids=[c[0] for c in BINDING_CASES])
def test_bad_input_on_a_new_root_creates_nothing(tmp_path, bindings, flags, keywords):
  root = tmp_path / 'run'
  result = harness_train(str(root), TINY_BINDINGS + bindings, extra_flags=flags)
  assert_clean_error(result, *keywords)
  assert not root.exists()


EXISTING_RUN_CASES = [
    ('epsilon', ['make_agent.epsilon_greedy=2.0'], ['make_agent.epsilon_greedy=2.0']),
    ('unknown_env_id', ["make_env.env_id='Cartpole-v1'"], ["'CartPole-v1'"]),
    ('num_env_steps', ['train_eval.num_env_steps=-1'], ['train_eval.num_env_steps=-1']),
]


@pytest.mark.slow
@pytest.mark.parametrize('bindings,keywords', [c[1:] for c in EXISTING_RUN_CASES],
                         ids=[c[0] for c in EXISTING_RUN_CASES])
def test_bad_input_on_an_existing_run_changes_nothing(short_cartpole_run, tmp_path,
                                                      bindings, keywords):
  root = str(tmp_path / 'resumed')
  shutil.copytree(short_cartpole_run, root)
  before = snapshot(root)
  result = harness_train(root, TINY_BINDINGS + bindings)
  assert_clean_error(result, *keywords)
  assert snapshot(root) == before


@pytest.mark.slow
def test_gin_syntax_error_names_file_and_line(tmp_path):
  gin_file = tmp_path / 'broken.gin'
  gin_file.write_text("make_env.env_id = 'CartPole-v1'\n\ntrain_eval.batch_size = (8\n"
                      'train_eval.seed = 1\n')
  root = tmp_path / 'run'
  result = harness_train(str(root), TINY_BINDINGS,
                         gin_files=[os.path.join(REPO, 'gin', 'ddqn_cartpole.gin'), str(gin_file)])
  assert_clean_error(result, 'syntax error', str(gin_file), 'line 4')
  assert not root.exists()


@pytest.mark.slow
def test_unknown_binding_in_a_gin_file_names_file_and_line(tmp_path):
  gin_file = tmp_path / 'typo.gin'
  gin_file.write_text("make_env.env_id = 'CartPole-v1'\nmake_agent.learning_rat = 1e-3\n")
  root = tmp_path / 'run'
  result = harness_train(str(root), TINY_BINDINGS, gin_files=[str(gin_file)])
  assert_clean_error(result, "'make_agent.learning_rat'", f'{gin_file}, line 2',
                     "'make_agent.learning_rate'")
  assert not root.exists()


@pytest.mark.slow
def test_missing_gin_file(tmp_path):
  missing = str(tmp_path / 'nope.gin')
  root = tmp_path / 'run'
  result = harness_train(str(root), TINY_BINDINGS, gin_files=[missing])
  assert_clean_error(result, missing, 'does not exist')
  assert not root.exists()


@pytest.mark.slow
def test_root_dir_that_is_a_file(tmp_path):
  root = tmp_path / 'not_a_dir'
  root.write_text('precious\n')
  before = snapshot(str(root))
  result = harness_train(str(root), TINY_BINDINGS)
  assert_clean_error(result, str(root), 'is a file')
  assert snapshot(str(root)) == before


@pytest.mark.slow
def test_root_dir_that_is_not_writable(tmp_path):
  if os.geteuid() == 0:
    # root writes through permission bits; procfs refuses new entries to anyone.
    parent = '/proc/1'
  else:
    locked = tmp_path / 'locked'
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    parent = str(locked)
  root = os.path.join(parent, 'run')
  try:
    result = harness_train(root, TINY_BINDINGS)
  finally:
    if parent != '/proc/1':
      os.chmod(parent, stat.S_IRWXU)
  assert_clean_error(result, root, 'not writable')
  assert not os.path.exists(root)


@pytest.mark.slow
def test_verbosity_adds_the_traceback(tmp_path):
  root = tmp_path / 'run'
  result = harness_train(str(root), TINY_BINDINGS + ['make_agent.epsilon_greedy=1.5'],
                         extra_flags=['--verbosity=1'])
  assert result.returncode == 2
  assert 'Traceback' in result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith('harness-train: error: ')
  assert not root.exists()
