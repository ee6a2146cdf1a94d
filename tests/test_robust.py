"""Runs that survive unattended: signals, one writer per run directory, a full disk.

The end-to-end cases run `harness-train` as real processes on small CartPole
runs; one run is carried through several launches (SIGTERM, SIGINT, SIGKILL,
a second launch on the held ROOT) so the file stays short. The fast cases test
the pieces in-process: the error translation, the lock, the signal watcher.
"""

import csv
import dataclasses
import errno
import fcntl
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time

import gin
import pytest
import tensorflow as tf

from harness.base import disk
from harness.base.errors import UsageError
from harness.run import experiment
from harness.rundir import lock as run_lock
from tests.cli import CARTPOLE_GIN, REPO, TINY_BINDINGS, harness_train, tail

# One env, one gradient step per env step; rows every 200 env steps. The random
# collect is long enough to be signalled in, short enough to be quick.
BINDINGS = TINY_BINDINGS + [
    'train_eval.num_env_steps=3000',
    'train_eval.initial_collect_steps=1000',
    'train_eval.log_interval=200',
    'train_eval.checkpoint_interval=1000',
    'train_eval.eval_interval=3000',
    'train_eval.final_eval_episodes=2',
]
STOP_LINE = re.compile(r'stopped by (SIGTERM|SIGINT) at env_steps (\d+): checkpoint written; '
                       r'run the same command to resume')
GRACE_EXCEEDED = 'took longer than train_eval.shutdown_grace_seconds'


# --- helpers --------------------------------------------------------------------

def _rows(path):
  if not os.path.exists(path):
    return []
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def _metrics(root):
  return _rows(os.path.join(root, 'metrics.csv'))


def _snapshot(root):
  """{relative path: bytes} of every file under root, and every directory."""
  tree = {}
  for folder, dirs, names in os.walk(root):
    for name in dirs:
      tree[os.path.relpath(os.path.join(folder, name), root) + '/'] = b''
    for name in names:
      path = os.path.join(folder, name)
      with open(path, 'rb') as f:
        tree[os.path.relpath(path, root)] = f.read()
  return tree


def _default_sigint():
  """preexec_fn: SIGINT back to its default in the child. A pytest started as a
  background job of a script inherits SIGINT ignored, and the harness keeps an
  ignored SIGINT ignored (test_a_signal_ignored_at_start_stays_ignored)."""
  signal.signal(signal.SIGINT, signal.SIG_DFL)


class Launch:
  """`python -m harness.train` in the background, its output in files."""

  def __init__(self, root, logs, name, bindings=BINDINGS):
    self.root = root
    self.out_path = os.path.join(logs, f'{name}.out')
    self.err_path = os.path.join(logs, f'{name}.err')
    cmd = [sys.executable, '-m', 'harness.train', f'--root_dir={root}',
           f'--gin_file={CARTPOLE_GIN}'] + [f'--gin_bindings={b}' for b in bindings]
    with open(self.out_path, 'w') as out, open(self.err_path, 'w') as err:
      self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=err,
                                   preexec_fn=_default_sigint)

  @property
  def pid(self):
    return self.proc.pid

  def wait_for(self, predicate, what, timeout=600):
    deadline = time.time() + timeout
    while not predicate():
      assert self.proc.poll() is None, f'the run ended before {what}:\n{self.output()}'
      assert time.time() < deadline, f'timed out waiting for {what}:\n{self.output()}'
      time.sleep(0.2)

  def wait_for_rows(self, count):
    self.wait_for(lambda: len(_metrics(self.root)) >= count, f'{count} metrics rows')

  def finish(self, timeout=600):
    self.proc.wait(timeout)
    return self.proc.returncode

  @property
  def stdout(self):
    with open(self.out_path) as f:
      return f.read()

  @property
  def stderr(self):
    with open(self.err_path) as f:
      return f.read()

  def output(self, chars=3000):
    return self.stdout[-chars:] + '\n--- stderr ---\n' + self.stderr[-chars:]


def _error_lines(stderr):
  return [line for line in stderr.splitlines() if line.startswith('harness-train:')]


def _latest_checkpoint_step(root):
  path = tf.train.latest_checkpoint(os.path.join(root, 'train'))
  return int(path.rsplit('-', 1)[1]) if path else None


def _checkpoint_is_loadable(root):
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(os.path.join(root, 'train')))
  for name in reader.get_variable_to_shape_map():
    reader.get_tensor(name)
  return True


def _assert_completed(root, target):
  rows = _metrics(root)
  steps = [int(r['train_step']) for r in rows]
  assert steps == sorted(set(steps)), f'a train_step repeats or goes back: {steps}'
  assert int(rows[-1]['env_steps']) == target
  assert all(None not in r.values() for r in rows), 'a torn row in metrics.csv'
  with open(os.path.join(root, 'results.json')) as f:
    assert json.load(f)['env_steps'] == target


# --- signals, the lock, SIGKILL: one run through several launches ---------------

@pytest.fixture(scope='module')
def interrupted_run(tmp_path_factory):
  """Launches 0-3 of one run, each stopped another way; returns what each showed."""
  base = tmp_path_factory.mktemp('interrupted')
  root, logs = str(base / 'run'), str(base)
  seen = {'root': root, 'logs': logs}

  # 0: SIGTERM during start-up / the initial random collect: nothing to write.
  launch = Launch(root, logs, 'startup')
  launch.wait_for(lambda: glob.glob(os.path.join(root, 'config', 'operative_config-*.gin')),
                  'the launch files')
  launch.proc.send_signal(signal.SIGTERM)
  seen['startup'] = (launch.finish(), launch.stdout, launch.stderr,
                     os.path.exists(os.path.join(root, 'train', 'checkpoint')),
                     len(_metrics(root)))

  # 1: SIGTERM mid-run, 2: SIGINT mid-run (the same command each time).
  for name, signum in (('sigterm', signal.SIGTERM), ('sigint', signal.SIGINT)):
    launch = Launch(root, logs, name)
    launch.wait_for_rows(len(_metrics(root)) + 2)
    launch.proc.send_signal(signum)
    code = launch.finish()
    rows = _metrics(root)
    seen[name] = (code, launch.stdout, launch.stderr, rows[-1], _latest_checkpoint_step(root))

  # 3: SIGKILL mid-run: the process dies holding the lock.
  launch = Launch(root, logs, 'sigkill')
  launch.wait_for_rows(len(_metrics(root)) + 2)
  launch.proc.send_signal(signal.SIGKILL)
  seen['sigkill'] = (launch.finish(), launch.pid)
  with open(run_lock.lock_path(root)) as f:
    seen['lock_after_sigkill'] = json.load(f)
  return seen


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the fixture's launches count here
def test_sigterm_or_sigint_during_start_up_exits_without_writing(interrupted_run):
  code, stdout, stderr, checkpoint_exists, rows = interrupted_run['startup']
  assert code == 143, stdout[-3000:] + stderr[-3000:]
  assert 'stopped by SIGTERM' in stdout and 'nothing new to checkpoint' in stdout
  assert not checkpoint_exists and rows == 0
  assert GRACE_EXCEEDED not in stderr


@pytest.mark.slow
@pytest.mark.parametrize('name,signame,code', [('sigterm', 'SIGTERM', 143),
                                               ('sigint', 'SIGINT', 130)])
def test_signal_mid_run_writes_a_checkpoint_and_exits_with_its_status(interrupted_run, name,
                                                                      signame, code):
  exit_code, stdout, stderr, last_row, checkpoint_step = interrupted_run[name]
  assert exit_code == code, stdout[-3000:] + stderr[-3000:]
  stops = STOP_LINE.findall(stdout)
  assert len(stops) == 1 and stops[0][0] == signame, stdout[-3000:]
  assert int(stops[0][1]) >= int(last_row['env_steps'])
  # The checkpoint the stop wrote covers every metrics row.
  assert checkpoint_step >= int(last_row['train_step'])
  # Stopped through the graceful path, not by the grace timer; no traceback.
  assert GRACE_EXCEEDED not in stderr and 'Traceback' not in stderr
  assert _error_lines(stderr) == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigkill_leaves_no_stale_lock_and_a_second_launch_is_refused(interrupted_run):
  root, logs = interrupted_run['root'], interrupted_run['logs']
  code, killed_pid = interrupted_run['sigkill']
  assert code == -signal.SIGKILL
  assert interrupted_run['lock_after_sigkill']['pid'] == killed_pid  # stale info, no stale lock

  holder = Launch(root, logs, 'final')  # the same command again: it must get the lock
  holder.wait_for_rows(len(_metrics(root)) + 1)
  # Freeze the holder so ROOT cannot change while a second launch tries it.
  holder.proc.send_signal(signal.SIGSTOP)
  try:
    before = _snapshot(root)
    second = harness_train(root, BINDINGS)
    after = _snapshot(root)
  finally:
    holder.proc.send_signal(signal.SIGCONT)
  assert second.returncode == 2, tail(second)
  lines = _error_lines(second.stderr)
  assert len(lines) == 1 and lines == second.stderr.strip().splitlines()[-1:], second.stderr
  assert f'is in use by pid {holder.pid} on host {socket.gethostname()}' in lines[0]
  assert run_lock.lock_path(root) in lines[0]
  assert 'Traceback' not in second.stderr
  assert after == before, 'the refused launch changed ROOT'

  assert holder.finish() == 0, holder.output()
  _assert_completed(root, 3000)


# --- a full disk ------------------------------------------------------------------

def _mount_tmpfs(path, size):
  if os.geteuid() != 0:
    pytest.skip('mounting a tmpfs needs root')
  os.makedirs(path)
  result = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}', 'tmpfs', path],
                          capture_output=True, text=True)
  if result.returncode != 0:
    pytest.skip(f'cannot mount a tmpfs here: {result.stderr.strip()}')


def _bytes_under(paths):
  return sum(os.path.getsize(os.path.join(folder, name))
             for path in paths for folder, _, names in os.walk(path) for name in names) + sum(
                 os.path.getsize(p) for p in paths if os.path.isfile(p))


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_full_disk_stops_with_one_line_then_the_same_command_resumes(tmp_path):
  mount = str(tmp_path / 'disk')
  _mount_tmpfs(mount, '32m')
  root, filler = os.path.join(mount, 'run'), os.path.join(mount, 'filler')
  bindings = TINY_BINDINGS + ['train_eval.num_env_steps=2000', 'train_eval.log_interval=200',
                              'train_eval.checkpoint_interval=500',
                              'train_eval.eval_interval=2000', 'train_eval.final_eval_episodes=2']
  launch = None
  try:
    launch = Launch(root, str(tmp_path), 'full_disk', bindings)
    launch.wait_for(lambda: os.path.isfile(
        os.path.join(root, 'policies', 'collect_policy', 'saved_model.pb')), 'a checkpoint')
    # Fill the disk but for half a checkpoint: the small appends (CSV rows,
    # events) still fit, the next checkpoint does not.
    checkpoint = (glob.glob(os.path.join(root, 'train', 'ckpt-*')) +
                  glob.glob(os.path.join(root, 'replay', '*')) +
                  [os.path.join(root, 'policies', name)
                   for name in ('greedy_policy', 'collect_policy')])
    stat = os.statvfs(mount)
    try:
      with open(filler, 'wb') as f:
        f.write(b'\0' * max(0, stat.f_bavail * stat.f_frsize - _bytes_under(checkpoint) // 2))
    except OSError as e:
      assert e.errno == errno.ENOSPC  # the run took some of it meanwhile: full all the same

    assert launch.finish() == 1, launch.output()
    lines = _error_lines(launch.stderr)
    assert len(lines) == 1, launch.stderr[-3000:]
    match = re.fullmatch(r'harness-train: error: no space left on device writing (\S+): free '
                         r'space and run the same command to resume', lines[0])
    assert match, lines[0]
    failed = os.path.relpath(match.group(1), root)
    assert failed.split(os.sep)[0] in ('train', 'replay', 'policies'), failed  # a checkpoint write
    assert 'Traceback' not in launch.stdout + launch.stderr
    assert _checkpoint_is_loadable(root)
    rows = _metrics(root)
    assert rows and all(None not in r.values() for r in rows[:-1])

    os.remove(filler)  # space freed: the same command resumes and completes
    result = harness_train(root, bindings, timeout=900)
    assert result.returncode == 0, tail(result)
    _assert_completed(root, 2000)
  finally:
    if launch is not None and launch.proc.poll() is None:
      launch.proc.kill()
      launch.proc.wait()
    subprocess.run(['umount', '-l', mount], check=False)


@pytest.mark.slow
def test_a_resume_whose_replay_checkpoint_is_gone_refills_the_table_and_completes(tmp_path):
  """An empty restored table (its Reverb checkpoint unreadable or deleted) once
  hung the resumed launch for good: sampling an empty table blocks."""
  root = str(tmp_path / 'run')
  first = harness_train(root, TINY_BINDINGS + ['train_eval.num_env_steps=300'])
  assert first.returncode == 0, tail(first)
  replay_dir = os.path.join(root, 'replay')
  for name in os.listdir(replay_dir):
    shutil.rmtree(os.path.join(replay_dir, name))

  result = harness_train(root, TINY_BINDINGS, timeout=300)
  assert result.returncode == 0, tail(result)
  assert 'the resumed replay table is empty: collecting 100 items' in result.stdout + result.stderr
  _assert_completed(root, 600)
  # The gradient steps the refill's env steps were due are trained: the schedule holds.
  assert int(_metrics(root)[-1]['train_step']) == 500


# --- the pieces, in-process -------------------------------------------------------

def test_shutdown_grace_is_validated():
  gin.clear_config()
  defaults = experiment.settings_from_gin(root_dir='/tmp/unused')
  assert defaults.validate().shutdown_grace_seconds == 60
  for bad in (0, -1, 'soon', True, float('nan')):
    with pytest.raises(UsageError, match='train_eval.shutdown_grace_seconds'):
      dataclasses.replace(defaults, shutdown_grace_seconds=bad).validate()


@pytest.mark.parametrize('error,words', [
    (OSError(errno.ENOSPC, 'No space left on device'),
     'no space left on device writing ROOT/metrics.csv: free space and run the same command'),
    (OSError(errno.EDQUOT, 'Disk quota exceeded', 'ROOT/eval.csv'),
     'disk quota exceeded writing ROOT/eval.csv: free space'),
    (OSError(errno.EACCES, 'Permission denied', 'ROOT/x'),
     'could not write ROOT/x (Permission denied): fix that'),
    # What TF's SaveV2 (checkpoints, PolicySaver), tf.summary and gfile raise on a full disk.
    (tf.errors.ResourceExhaustedError(
        None, None, '{{function_node __wrapped__SaveV2_dtypes_4_device_/job:localhost/replica:0/'
        'task:0/device:CPU:0}} ROOT/train/ckpt-2_temp/part-00000-of-00001.data-00000-of-00001'
        '.tempstate1308; No space left on device [Op:SaveV2]'),
     'no space left on device writing ROOT/train/ckpt-2_temp/part-00000-of-00001.data-00000-of-'
     '00001.tempstate1308: free space'),
    # What Reverb's Client.checkpoint() raises on a full disk.
    (IndexError('ROOT/replay/2026-11-30T09:10:37.853399684+00:00/chunks.tfrecord; No space left '
                'on device'),
     'no space left on device writing ROOT/replay/2026-11-30T09:10:37.853399684+00:00/'
     'chunks.tfrecord: free space'),
])
def test_failed_writes_become_one_line(error, words):
  translated = disk.translate(error, 'ROOT/metrics.csv')
  assert isinstance(translated, disk.WriteError) and translated.exit_code == 1
  assert words in str(translated) and '\n' not in str(translated)


@pytest.mark.parametrize('error', [
    IndexError('list index out of range'),
    tf.errors.ResourceExhaustedError(None, None, 'OOM when allocating tensor'),
    ValueError('No space left on device'),  # not a type that a write raises
])
def test_other_errors_pass_through(error):
  assert disk.translate(error, 'ROOT') is None
  with pytest.raises(type(error)):
    with disk.writing('ROOT'):
      raise error


def test_writing_cleans_up_after_a_failed_write(tmp_path):
  partial = tmp_path / 'partial'
  partial.write_text('half')
  with pytest.raises(disk.WriteError, match='no space left on device writing'):
    with disk.writing(str(partial), cleanup=partial.unlink):
      raise OSError(errno.ENOSPC, 'No space left on device')
  assert not partial.exists()


def _hold_as_another_process(path, pid=4242, host='elsewhere'):
  """A lock held on another open file description, as another process would."""
  with open(path, 'w') as f:
    f.write(json.dumps({'pid': pid, 'host': host}) + '\n')
  fd = os.open(path, os.O_RDWR)
  fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  return fd


def test_a_held_root_is_refused_and_left_alone(tmp_path):
  root = str(tmp_path / 'run')
  os.makedirs(root)
  fd = _hold_as_another_process(run_lock.lock_path(root))
  try:
    before = _snapshot(root)
    with pytest.raises(UsageError) as raised:
      run_lock.RunLock.acquire(root, 'all')
    assert str(raised.value) == (
        f'{root} is in use by pid 4242 on host elsewhere ({root}/.lock): wait for that run to '
        'end or stop it; a run directory takes one writer')
    assert _snapshot(root) == before
  finally:
    os.close(fd)


def test_the_holder_records_itself_and_a_refused_launch_restores_root(tmp_path):
  fresh = str(tmp_path / 'new' / 'run')
  with pytest.raises(UsageError):
    with run_lock.hold(fresh, 'all'):
      with open(run_lock.lock_path(fresh)) as f:
        info = json.load(f)
      assert info['pid'] == os.getpid() and info['host'] == socket.gethostname()
      raise UsageError('refused')
  assert not os.path.exists(tmp_path / 'new')  # created by the refused launch: removed

  existing = str(tmp_path / 'old')
  os.makedirs(existing)
  with open(run_lock.lock_path(existing), 'wb') as f:
    f.write(b'{"pid": 1, "host": "before"}\n')
  before = _snapshot(existing)
  with pytest.raises(UsageError):
    with run_lock.hold(existing, 'all'):
      raise UsageError('refused')
  assert _snapshot(existing) == before

  lock = run_lock.RunLock.acquire(existing, 'learn')  # accepted: held until released
  try:
    with open(run_lock.lock_path(existing)) as f:
      assert json.load(f)['job'] == 'learn'
  finally:
    lock.release()


# The signal watcher in a small process of its own (no TensorFlow): it loops
# until asked to stop, or ignores the request to let the grace timer act.
_WATCHED = textwrap.dedent("""
    import sys, time
    from harness.base import shutdown
    shutdown.install_signal_handlers(float(sys.argv[1]), 'harness-train')
    print('ready', flush=True)
    stop = shutdown.current()
    while sys.argv[2] == 'stuck' or not stop.requested:
      time.sleep(0.05)
    raise SystemExit(stop.exit_code)
    """)


_WATCHED_PROCS = []


@pytest.fixture(autouse=True)
def _no_watched_process_left():
  """A failed signal test must not leave its watched process looping forever."""
  yield
  while _WATCHED_PROCS:
    proc = _WATCHED_PROCS.pop()
    if proc.poll() is None:
      proc.kill()
      proc.wait()


def _watched(grace, mode, preexec_fn=_default_sigint):
  proc = subprocess.Popen([sys.executable, '-c', _WATCHED, str(grace), mode], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=preexec_fn)
  _WATCHED_PROCS.append(proc)
  assert proc.stdout.readline().strip() == 'ready'
  return proc


def test_first_signal_requests_a_stop_with_its_status():
  proc = _watched(60, 'polite')
  proc.send_signal(signal.SIGINT)
  _, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 130
  assert 'SIGINT received' in stderr and _error_lines(stderr) == []


def test_second_signal_exits_at_once():
  proc = _watched(600, 'stuck')
  proc.send_signal(signal.SIGTERM)
  time.sleep(0.5)
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 143
  assert 'second signal (SIGTERM): exiting at once' in stderr


def test_a_stop_that_outlasts_the_grace_ends_the_process_with_the_same_status():
  proc = _watched(0.5, 'stuck')
  proc.send_signal(signal.SIGINT)
  _, stderr = proc.communicate(timeout=60)
  assert proc.returncode == 130
  lines = _error_lines(stderr)
  assert len(lines) == 1 and GRACE_EXCEEDED + '=0.5' in lines[0]


def test_a_signal_ignored_at_start_stays_ignored():
  # A background job of a shell script starts with SIGINT ignored.
  proc = _watched(60, 'polite', preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
  proc.send_signal(signal.SIGINT)
  time.sleep(1.0)
  assert proc.poll() is None
  proc.send_signal(signal.SIGTERM)
  proc.communicate(timeout=60)
  assert proc.returncode == 143
