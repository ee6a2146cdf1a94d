"""`harness-plot` and `harness-eval` on a real short CartPole run, in subprocesses."""

import os
import shutil
import subprocess
import sys

from PIL import Image
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _command(name: str, module: str):
  """The installed console script, or `python -m module` from a bare checkout."""
  script = os.path.join(os.path.dirname(sys.executable), name)
  return [script] if os.path.exists(script) else [sys.executable, '-m', module]


def _run(cmd, timeout=180):
  return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def _assert_png(path: str):
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  with Image.open(path) as image:
    assert image.width >= 400 and image.height >= 300


@pytest.mark.slow
def test_plot_writes_a_png_of_two_runs(short_cartpole_run, tmp_path):
  # A second run of the same name elsewhere: the legend must still tell them apart.
  other = tmp_path / 'b' / os.path.basename(short_cartpole_run)
  shutil.copytree(short_cartpole_run, other)
  out = tmp_path / 'curves.png'
  result = _run(_command('harness-plot', 'harness.plot') +
                [short_cartpole_run, str(other), f'--out={out}'])
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stderr == ''
  _assert_png(str(out))


def test_plot_runs_script_is_the_same_program(short_cartpole_run, tmp_path):
  out = tmp_path / 'one.png'
  result = _run([sys.executable, os.path.join(REPO, 'scripts', 'plot_runs.py'),
                 short_cartpole_run, '--out', str(out)])
  assert result.returncode == 0, result.stderr[-3000:]
  _assert_png(str(out))


def test_plot_of_a_directory_that_is_not_a_run(tmp_path):
  result = _run(_command('harness-plot', 'harness.plot') +
                [str(tmp_path), f'--out={tmp_path / "x.png"}'])
  assert result.returncode == 2
  assert len(result.stderr.splitlines()) == 1
  assert 'no metrics.csv or eval.csv' in result.stderr
  assert not (tmp_path / 'x.png').exists()


@pytest.mark.slow
def test_eval_plays_the_saved_policy_and_writes_a_gif(short_cartpole_run, tmp_path):
  gif = tmp_path / 'episode.gif'
  policy_dir = os.path.join(short_cartpole_run, 'policies', 'greedy_policy')
  result = _run(_command('harness-eval', 'harness.evaluate') +
                [f'--policy_dir={policy_dir}', '--episodes=3', f'--video={gif}'])
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stderr == ''
  # The env id came from the run's operative config.
  assert 'CartPole-v1: return' in result.stdout
  assert 'over 3 episodes' in result.stdout
  with Image.open(gif) as image:
    assert image.format == 'GIF'
    assert image.n_frames > 5


@pytest.mark.slow
def test_eval_refuses_a_policy_for_another_env(short_cartpole_run):
  policy_dir = os.path.join(short_cartpole_run, 'policies', 'greedy_policy')
  result = _run(_command('harness-eval', 'harness.evaluate') +
                [f'--policy_dir={policy_dir}', '--episodes=1', '--env_id=Acrobot-v1'])
  assert result.returncode == 2
  assert len(result.stderr.splitlines()) == 1
  assert 'Acrobot-v1' in result.stderr and 'shape' in result.stderr


@pytest.mark.slow
def test_eval_of_a_missing_policy_dir(tmp_path):
  result = _run(_command('harness-eval', 'harness.evaluate') +
                [f'--policy_dir={tmp_path / "nope"}', '--episodes=1'])
  assert result.returncode == 2
  assert len(result.stderr.splitlines()) == 1
  assert '--policy_dir' in result.stderr
