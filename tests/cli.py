"""Helpers to run `harness-train` as a real subprocess in tests."""

import csv
import glob
import os
import signal
import subprocess
import sys
import time
from typing import List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARTPOLE_GIN = os.path.join(REPO, 'gin', 'ddqn_cartpole.gin')

# A CartPole run small enough for a test: a few hundred env steps, a tiny net.
TINY_BINDINGS = [
    'train_eval.num_env_steps=600',
    'train_eval.initial_collect_steps=100',
    'train_eval.replay_capacity=2000',
    'train_eval.batch_size=16',
    'train_eval.eval_interval=300',
    'train_eval.eval_episodes=2',
    'train_eval.final_eval_episodes=2',  # results.json's final evaluation: 2, not 20
    'train_eval.log_interval=100',
    'train_eval.checkpoint_interval=300',
    'make_agent.fc_layer_params=(16,)',
    # One env and one gradient step per env step, so row positions are exact.
    'train_eval.num_envs=1',
    'train_eval.collect_steps_per_iteration=1',
    'train_eval.train_steps_per_iteration=1',
    # A constant learning rate, so the metrics' learning_rate column is exact.
    'make_agent.learning_rate_decay_steps=0',
]


def harness_train(root_dir: Optional[str], bindings: Sequence[str] = (),
                  gin_files: Sequence[str] = (CARTPOLE_GIN,), extra_flags: Sequence[str] = (),
                  env=None, timeout: float = 300) -> subprocess.CompletedProcess:
  """Runs `python -m harness.train` and returns the finished process (no
  --root_dir when `root_dir` is None, e.g. with --check_only)."""
  cmd: List[str] = [sys.executable, '-m', 'harness.train']
  cmd += [f'--root_dir={root_dir}'] if root_dir is not None else []
  cmd += [f'--gin_file={f}' for f in gin_files]
  cmd += [f'--gin_bindings={b}' for b in bindings]
  cmd += list(extra_flags)
  return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                        env=env)


def sigkill_after_first_checkpoint(root_dir: str, bindings: Sequence[str],
                                   after_s: float = 1.5) -> None:
  """Starts a CartPole run and SIGKILLs it `after_s` seconds after its first TF
  checkpoint, mid-run (the run must not have ended by then)."""
  cmd = [sys.executable, '-m', 'harness.train', f'--root_dir={root_dir}',
         f'--gin_file={CARTPOLE_GIN}'] + [f'--gin_bindings={b}' for b in bindings]
  proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 240
  while not glob.glob(os.path.join(root_dir, 'train', 'ckpt-*.index')) and time.time() < deadline:
    assert proc.poll() is None, 'the run ended before its first checkpoint'
    time.sleep(0.2)
  time.sleep(after_s)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL


def tail(result: subprocess.CompletedProcess, chars: int = 3000) -> str:
  """The end of a finished run's log (stdout) and errors (stderr), for failure messages."""
  return (result.stdout[-chars:] + '\n--- stderr ---\n' + result.stderr[-chars:])


def rows(path: str) -> List[dict]:
  """The rows of a CSV file (metrics.csv, eval.csv) as dicts."""
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def snapshot(root: str) -> dict:
  """{relative path: bytes} of every file under root: a refused launch must leave it equal."""
  files = {}
  for folder, _, names in os.walk(root):
    for name in names:
      path = os.path.join(folder, name)
      with open(path, 'rb') as f:
        files[os.path.relpath(path, root)] = f.read()
  return files


def assert_each_launch_ran_with_its_settings(metrics_path: str, rows_before: int,
                                            first: tuple, second: tuple) -> List[dict]:
  """The metrics rows of a resumed run: (epsilon, learning rate) `first` in the first
  launch's rows, `second` in the resumed one's (read from the live variables), each
  train_step once. Returns the rows."""
  import pytest  # pylint: disable=g-import-not-at-top
  all_rows = rows(metrics_path)
  old, new = all_rows[:rows_before], all_rows[rows_before:]
  assert new, 'the resumed launch wrote no rows'
  for launch_rows, (epsilon, learning_rate) in ((old, first), (new, second)):
    assert all(float(r['epsilon']) == pytest.approx(epsilon) for r in launch_rows)
    assert all(float(r['learning_rate']) == pytest.approx(learning_rate) for r in launch_rows)
  steps = [int(r['train_step']) for r in all_rows]
  assert steps == sorted(set(steps))
  return all_rows
