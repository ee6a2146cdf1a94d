"""A distributed run on localhost with real processes: replay server, collectors, learner."""

import csv
import os
import signal
import subprocess
import sys
import time

import psutil

from tests.cli import CARTPOLE_GIN, REPO

BINDINGS = [
    'train_eval.num_env_steps=2500',
    'train_eval.initial_collect_steps=300',
    'train_eval.replay_capacity=5000',
    'train_eval.batch_size=32',
    'train_eval.log_interval=250',
    'train_eval.eval_interval=1250',
    'train_eval.eval_episodes=2',
    'train_eval.checkpoint_interval=500',
    'make_agent.fc_layer_params=(16,)',
    'Distributed.pull_interval_steps=100',
    'Distributed.push_interval_steps=100',
    'train_eval.num_envs=1',
    'train_eval.collect_steps_per_iteration=1',
    'train_eval.train_steps_per_iteration=1',
]


def _launch(root):
  cmd = [sys.executable, os.path.join(REPO, 'scripts', 'launch_local.py'), f'--root_dir={root}',
         f'--gin_file={CARTPOLE_GIN}', '--num_collectors=2']
  cmd += [f'--gin_bindings={b}' for b in BINDINGS]
  return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def _job(launcher, flag, timeout=240):
  """The child process of the launcher whose command line has `flag`."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    for child in psutil.Process(launcher.pid).children():
      try:
        if flag in child.cmdline():
          return child
      except psutil.NoSuchProcess:
        pass
    time.sleep(0.2)
  raise AssertionError(f'no job with {flag}')


def _rows(path):
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _wait_for(predicate, timeout=240):
  deadline = time.time() + timeout
  while not predicate():
    assert time.time() < deadline, 'timed out'
    time.sleep(0.5)


def _finish(launcher):
  output, _ = launcher.communicate(timeout=600)
  return launcher.returncode, output


def _metrics_rows(root):
  path = os.path.join(root, 'metrics.csv')
  return _rows(path) if os.path.exists(path) else []


def test_collectors_feed_the_learner_and_a_killed_collector_rejoins(tmp_path):
  root = str(tmp_path / 'run')
  launcher = _launch(root)
  _wait_for(lambda: len(_metrics_rows(root)) >= 2)  # the learner is training
  _job(launcher, '--collector_id=1').send_signal(signal.SIGKILL)
  code, output = _finish(launcher)
  assert code == 0, output[-3000:]
  assert 'collector-1 exited with -9; restart 1' in output
  assert int(_metrics_rows(root)[-1]['env_steps']) == 2500
  for i in (0, 1):
    rows = _rows(os.path.join(root, 'collectors', f'collector-{i}.csv'))
    env_steps = [int(r['env_steps']) for r in rows]
    policy_steps = [int(r['policy_train_step']) for r in rows]
    assert max(env_steps) > 0
    assert max(policy_steps) > 0 and len(set(policy_steps)) > 2, 'weights never moved'
  for name in ('replay', 'learner', 'collector-0', 'collector-1'):
    assert os.path.getsize(os.path.join(root, 'logs', f'{name}.log')) > 0


def test_replay_server_restarted_mid_run_and_the_run_completes(tmp_path):
  root = str(tmp_path / 'run')
  launcher = _launch(root)
  # After the first paired checkpoint the restarted server resumes from it.
  _wait_for(lambda: os.path.isdir(os.path.join(root, 'replay')) and any(
      os.path.exists(os.path.join(root, 'replay', d, 'DONE'))
      for d in os.listdir(os.path.join(root, 'replay'))))
  _job(launcher, '--job=replay').send_signal(signal.SIGKILL)
  killed_at = time.time()
  code, output = _finish(launcher)
  assert code == 0, output[-3000:]
  assert 'replay exited with -9; restart 1' in output
  rows = _metrics_rows(root)
  assert int(rows[-1]['env_steps']) == 2500
  # The learner kept training through the restart (Reverb's client retries, ours backs off).
  assert sum(float(r['wall_time']) > killed_at for r in rows) >= 2


def test_collector_that_cannot_reach_the_server_exits_2(tmp_path):
  import portpicker  # pylint: disable=g-import-not-at-top
  from tests.cli import harness_train  # pylint: disable=g-import-not-at-top
  root = tmp_path / 'run'
  result = harness_train(str(root), ['Distributed.max_unreachable_seconds=2'], extra_flags=[
      '--job=collect', f'--replay_address=localhost:{portpicker.pick_unused_port()}'])
  assert result.returncode == 2
  last = result.stderr.strip().splitlines()[-1]
  assert 'cannot reach the replay server' in last and '--job=replay' in last
