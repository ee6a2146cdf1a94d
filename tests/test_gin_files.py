"""The shipped gin files: each one passes harness-train's input checks; LunarLander trains."""

import glob
import json
import os

import pytest

from tests.cli import REPO, harness_train, tail

GIN_FILES = sorted(glob.glob(os.path.join(REPO, 'gin', '*.gin')))


def test_every_benchmark_task_has_a_gin_file():
  names = {os.path.basename(p) for p in GIN_FILES}
  assert {'ddqn_cartpole.gin', 'ddqn_acrobot.gin', 'ddqn_lunarlander.gin',
          'ddqn_mountaincar.gin', 'ddqn_atari.gin'} <= names


@pytest.mark.slow
@pytest.mark.parametrize('gin_file', GIN_FILES, ids=os.path.basename)
def test_gin_file_passes_the_input_checks(gin_file):
  result = harness_train(None, gin_files=[gin_file], extra_flags=['--check_only'])
  assert result.returncode == 0, tail(result)
  assert 'error' not in result.stderr.lower(), result.stderr


@pytest.mark.slow
def test_lunarlander_builds_and_runs_500_steps(tmp_path):
  root = str(tmp_path / 'lunar')
  result = harness_train(root, [
      'train_eval.num_env_steps=500', 'train_eval.initial_collect_steps=200',
      'train_eval.eval_interval=500', 'train_eval.eval_episodes=1',
      'train_eval.final_eval_episodes=1', 'train_eval.log_interval=100',
      'train_eval.checkpoint_interval=500'],
      gin_files=[os.path.join(REPO, 'gin', 'ddqn_lunarlander.gin')])
  assert result.returncode == 0, tail(result)
  with open(os.path.join(root, 'results.json')) as f:
    results = json.load(f)
  assert results['env_steps'] >= 500
  assert "make_env.env_id = 'LunarLander-v3'" in open(
      os.path.join(root, 'config', 'operative_config-0.gin')).read()
