"""harness-sweep: spec parsing and rliable statistics in-process; real sweeps in subprocesses.

The sweeps start real Ray (embedded, by the CLI) and real harness-train
children on tiny CartPole runs. Every process a sweep starts inherits a tag in
its environment (`HARNESS_SWEEP_TEST`), so each test can check that nothing it
started (driver, raylet, gcs_server, Ray workers, harness-train) is left alive,
without touching other people's processes on a shared machine.
"""

import glob
import hashlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from typing import Dict, List, Optional, Sequence

import psutil
import pytest

from harness.base.errors import UsageError
from harness.sweeps import aggregate
from harness.sweeps import spec as sweep_spec
from tests.cli import CARTPOLE_GIN, REPO

TAG = 'HARNESS_SWEEP_TEST'
# Sweeps share the machine with other work; setup.cfg's 600 s per test is too
# tight for a module fixture that runs a whole sweep on a busy machine.
pytestmark = pytest.mark.timeout(3600)
# A CartPole run of a few hundred env steps with a tiny net (as tests/cli.py).
TINY = [
    'train_eval.num_env_steps=400',
    'train_eval.initial_collect_steps=100',
    'train_eval.replay_capacity=1000',
    'train_eval.batch_size=16',
    'train_eval.eval_interval=200',
    'train_eval.eval_episodes=2',
    'train_eval.final_eval_episodes=2',
    'train_eval.log_interval=100',
    'train_eval.checkpoint_interval=200',
    'make_agent.fc_layer_params=(16,)',
    'train_eval.num_envs=1',
    'train_eval.collect_steps_per_iteration=1',
    'train_eval.train_steps_per_iteration=1',
]
LR_GRID = 'make_agent.learning_rate=[1e-3, 3e-3]'


# --- helpers --------------------------------------------------------------------------


def sweep_command(root: str, sweeps: Sequence[str] = (LR_GRID,), bindings: Sequence[str] = TINY,
                  extra: Sequence[str] = ('--seeds=2',)) -> List[str]:
  cmd = [sys.executable, '-m', 'harness.sweep', f'--root_dir={root}',
         f'--gin_file={CARTPOLE_GIN}', '--max_concurrent=2']
  cmd += [f'--gin_bindings={b}' for b in bindings]
  cmd += [f'--sweep={s}' for s in sweeps]
  return cmd + list(extra)


def tagged_env(tag: str) -> Dict[str, str]:
  env = dict(os.environ)
  env[TAG] = tag
  return env


def tagged_processes(tag: str) -> List[psutil.Process]:
  """Live processes (not zombies) whose environment carries `tag`."""
  found = []
  for proc in psutil.process_iter(['pid']):
    try:
      if proc.pid == os.getpid() or proc.status() == psutil.STATUS_ZOMBIE:
        continue
      if proc.environ().get(TAG) == tag:
        found.append(proc)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
      continue
  return found


def describe(procs: Sequence[psutil.Process]) -> List[str]:
  out = []
  for p in procs:
    try:
      out.append(f'{p.pid} {p.name()} {" ".join(p.cmdline())[:120]}')
    except psutil.Error:
      pass
  return out


def assert_nothing_left(tag: str, wait: float = 20.0,
                        after: Optional[subprocess.CompletedProcess] = None) -> None:
  """Nothing started under `tag` is alive (Ray's shutdown takes a moment); `after`:
  the command whose end this follows, named in the failure (did it crash?)."""
  deadline = time.time() + wait
  while True:
    left = tagged_processes(tag)
    if not left or time.time() > deadline:
      break
    time.sleep(0.5)
  assert not left, (f'left running: {describe(left)}' +
                    (f'\nafter exit status {after.returncode}:\n{tail(after)}' if after else ''))


# Only a guard against a hung sweep: on a busy shared machine a tiny sweep has
# taken over 6 minutes (load average 80 on 2 cores).
TIMEOUT = 1800


# Ray helpers that embedded Ray must not start (ray_runtime._no_idle_helpers).
IDLE_HELPERS = ('log_monitor.py', 'autoscaler/_private/monitor.py', 'dashboard/dashboard.py')


def run_sweep(cmd: List[str], tag: str, timeout: float = TIMEOUT,
              watch_for_ray: bool = False) -> subprocess.CompletedProcess:
  """Runs a sweep to its end; with `watch_for_ray`, returns `.ray_seen` (raylet or
  GCS seen) and `.idle_helpers_seen` (command lines of IDLE_HELPERS seen) too."""
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=REPO, env=tagged_env(tag), start_new_session=True)
  ray_seen, helpers_seen = False, set()
  try:
    if watch_for_ray:
      while proc.poll() is None:
        for p in tagged_processes(tag):
          try:
            name, line = p.name(), ' '.join(p.cmdline())
          except psutil.Error:
            continue
          ray_seen |= name in ('raylet', 'gcs_server')
          helpers_seen.update(line[:200] for h in IDLE_HELPERS if h in line)
        time.sleep(0.2)
    out, err = proc.communicate(timeout=timeout)
  except BaseException:
    _kill_group_and_leftovers(proc.pid, tag)
    raise
  result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
  result.ray_seen = ray_seen
  result.idle_helpers_seen = helpers_seen
  return result


def tail(result: subprocess.CompletedProcess) -> str:
  return result.stdout[-3000:] + '\n--- stderr ---\n' + result.stderr[-3000:]


def tree_digest(root: str) -> Dict[str, str]:
  """Path -> (sha1 of the bytes, mtime) of every file under root."""
  digest = {}
  for folder, _, files in os.walk(root):
    for name in files:
      path = os.path.join(folder, name)
      with open(path, 'rb') as f:
        digest[os.path.relpath(path, root)] = (hashlib.sha1(f.read()).hexdigest(),
                                               os.stat(path).st_mtime_ns)
  return digest


def read_rows(root: str, name: str) -> List[Dict[str, str]]:
  return aggregate.read_csv(os.path.join(root, name))


@pytest.fixture
def tag():
  """A fresh tag for the processes of one test; afterwards none of them may live."""
  value = uuid.uuid4().hex
  yield value
  assert_nothing_left(value)


# --- sweep_spec (in-process) ------------------------------------------------------------


def test_values_keep_strings_and_tuples_whole():
  sweep = sweep_spec.parse_sweep("make_env.env_id=['CartPole-v1', 'a,b', (1, 2)]")
  assert sweep.values == ("'CartPole-v1'", "'a,b'", '(1, 2)')
  sweep = sweep_spec.parse_sweep('make_agent.fc_layer_params=[(64, 64), (32,)]')
  assert sweep.values == ('(64, 64)', '(32,)')
  assert sweep_spec.point_bindings({'make_agent.fc_layer_params': '(32,)'}) == [
      'make_agent.fc_layer_params=(32,)']


def test_ranges():
  sweep = sweep_spec.parse_sweep('make_agent.learning_rate=loguniform(1e-4, 1e-2)')
  assert sweep.range == sweep_spec.Range('loguniform', 1e-4, 1e-2)
  sweep = sweep_spec.parse_sweep('make_agent.gamma=uniform(0.9, 0.999)')
  assert (sweep.range.kind, sweep.range.low, sweep.range.high) == ('uniform', 0.9, 0.999)
  sweep = sweep_spec.parse_sweep("make_agent.td_errors_loss_fn=choice(['huber', 'mse'])")
  assert sweep.range.choices == ("'huber'", "'mse'")


@pytest.mark.parametrize('flag', [
    'make_agent.learning_rate=[1e-3',            # unclosed bracket
    'make_agent.learning_rate=1e-3',             # not a list
    'make_agent.learning_rate=[]',               # empty
    'make_agent.learning_rate=[1e-3,,2e-3]',     # empty value
    'make_agent.learning_rate=[1e-3 2e-3]',      # missing comma
    'make_env.env_id=[CartPole-v1]',             # unquoted string
    'make_agent.learning_rate=[1e-3, 1e-3]',     # listed twice
    'learning_rate=[1e-3]',                      # not configurable.parameter
    'train_eval.seed=[0, 1]',                    # seeds have flags of their own
    'make_agent.learning_rate=loguniform(0, 1)',  # log of 0
    'make_agent.learning_rate=uniform(2, 1)',    # low above high
    'make_agent.learning_rate=normal(0, 1)',     # unknown range
])
def test_bad_sweep_syntax_is_a_usage_error(flag):
  with pytest.raises(UsageError) as error:
    sweep_spec.parse_sweeps([flag], 'optuna')
  assert '\n' not in str(error.value)


def test_ranges_need_optuna_and_seeds_one_flag():
  with pytest.raises(UsageError, match='--search=optuna'):
    sweep_spec.parse_sweeps(['make_agent.learning_rate=loguniform(1e-4, 1e-2)'], 'grid')
  with pytest.raises(UsageError, match='both'):
    sweep_spec.parse_seeds(3, '0,1')
  assert sweep_spec.parse_seeds(3, None) == [0, 1, 2]
  assert sweep_spec.parse_seeds(None, '4,7') == [4, 7]


def test_trial_ids_are_readable_stable_and_distinct():
  sweeps = sweep_spec.parse_sweeps(
      ['make_agent.learning_rate=[1e-3, -1e-3]',
       "make_env.env_id=['CartPole-v1', 'Acrobot-v1']",
       'make_agent.fc_layer_params=[(64, 64), (64,64), (32,)]'], 'grid')
  points = sweep_spec.grid_points(sweeps)
  assert len(points) == 12
  ids = [sweep_spec.trial_id(sweeps, p, 3) for p in points]
  assert len(set(ids)) == 12
  assert ids[0].startswith('learning_rate=1e-3,env_id=CartPole-v1,fc_layer_params=64-64-')
  assert ids[0].endswith(',seed=3')
  assert all(os.sep not in i and ' ' not in i and "'" not in i for i in ids)
  again = sweep_spec.parse_sweeps(
      ['make_agent.learning_rate=[1e-3, -1e-3]',
       "make_env.env_id=['CartPole-v1', 'Acrobot-v1']",
       'make_agent.fc_layer_params=[(64, 64), (64,64), (32,)]'], 'grid')
  assert [sweep_spec.trial_id(again, p, 3) for p in sweep_spec.grid_points(again)] == ids


def test_spec_difference_names_the_first_change():
  sweeps = sweep_spec.parse_sweeps([LR_GRID], 'grid')
  spec = sweep_spec.Spec(['/g/a.gin'], ['x.y = 1\n'], ['train_eval.num_env_steps=400'],
                         sweeps, [0, 1], 'grid', None)
  stored = spec.to_json()
  assert spec.first_difference(stored) is None
  edited = sweep_spec.Spec(['/g/a.gin'], ['x.y = 2\n'], spec.bindings, sweeps, [0, 1], 'grid',
                           None)
  assert 'has changed' in edited.first_difference(stored)
  more_seeds = sweep_spec.Spec(spec.gin_files, spec.gin_texts, spec.bindings, sweeps,
                               [0, 1, 2], 'grid', None)
  assert more_seeds.first_difference(stored).startswith('seeds')


# --- aggregate (in-process) -----------------------------------------------------------


def test_iqm_and_ci_on_known_numbers():
  # IQM of 1..8 is the mean of the middle half: (3 + 4 + 5 + 6) / 4.
  iqm, low, high = aggregate.iqm_ci([1, 2, 3, 4, 5, 6, 7, 8])
  assert iqm == pytest.approx(4.5)
  assert 1 <= low < iqm < high <= 8
  assert aggregate.iqm_ci([500.0, 500.0, 500.0]) == (500.0, 500.0, 500.0)
  # An outlier moves the mean, not the IQM.
  iqm, _, _ = aggregate.iqm_ci([10, 10, 10, 10, 1000])
  assert iqm == pytest.approx(10)
  assert all(math.isnan(v) for v in aggregate.iqm_ci([]))


def test_our_iqm_is_rliables_aggregate_iqm():
  from rliable import metrics
  import numpy as np
  rng = np.random.RandomState(0)
  for runs in range(1, 12):
    scores = rng.rand(runs, 6) * 500
    assert np.allclose(aggregate.iqm(scores, axis=0),
                       [metrics.aggregate_iqm(scores[:, i:i + 1]) for i in range(6)])
    assert np.isclose(aggregate.iqm(scores[:, 0]), metrics.aggregate_iqm(scores[:, :1]))
  # The trial workers' Optuna objective: the same IQM, of the finite values only.
  from harness.sweeps import trial as sweep_trial
  assert sweep_trial.iqm([3.0, None, 1.0, 2.0, 4.0, math.nan, 9.0]) == pytest.approx(
      metrics.aggregate_iqm(np.array([3.0, 1.0, 2.0, 4.0, 9.0])))
  assert sweep_trial.iqm([7.5]) == 7.5 and math.isnan(sweep_trial.iqm([None, math.nan]))


def test_an_unchanged_point_keeps_its_interval_and_one_run_is_its_own():
  assert aggregate.iqm_ci([42.0, None, math.nan]) == (42.0, 42.0, 42.0)
  first = aggregate.iqm_ci([1.0, 5.0, 3.0, 8.0])
  hits = aggregate._bootstrap_iqm_ci.cache_info().hits
  assert aggregate.iqm_ci([1.0, 5.0, 3.0, 8.0]) == first  # seeded: the same interval ...
  assert aggregate._bootstrap_iqm_ci.cache_info().hits == hits + 1  # ... not drawn again
  assert first[1] < first[0] < first[2]


def test_an_interval_depends_on_its_seed_not_on_numpys_global_generator():
  """rliable's StratifiedBootstrap draws from np.random, not its random_state:
  the same runs gave another interval after anything else had drawn."""
  import numpy as np
  values = (8.90, 11.70, 7.35, 13.05, 13.70)
  curve = np.array([[1.0, 4.0], [2.0, 9.0], [5.0, 3.0], [7.0, 8.0], [3.0, 6.0]])
  points, curves = set(), set()
  for global_seed in range(4):
    np.random.seed(global_seed)
    points.add(aggregate._bootstrap_iqm_ci.__wrapped__(values, 200, 0))
    curves.add(tuple(np.concatenate(aggregate.iqm_curve(curve, reps=200)).round(9)))
  assert len(points) == 1 and len(curves) == 1
  iqm, low, high = points.pop()
  assert low < iqm < high
  # ... and the seed it is given does choose the resamples.
  assert aggregate._bootstrap_iqm_ci.__wrapped__(values, 200, 1) != (iqm, low, high)


def test_summary_rows_use_done_trials_only():
  rows = [{'status': 'done', 'final_return': '100', 'best_policy_return': '200'},
          {'status': 'done', 'final_return': '300', 'best_policy_return': '400'},
          {'status': 'failed', 'final_return': '', 'best_policy_return': ''}]
  [row] = aggregate.summarize([({'make_agent.learning_rate': '1e-3'}, rows)])
  assert row['n_seeds'] == 2
  assert row['mean'] == 200 and row['median'] == 200
  assert row['ci_low'] <= row['iqm'] <= row['ci_high']
  assert row['best_iqm'] == pytest.approx(300)


def test_a_bootstrap_leaves_other_threads_log_lines_alone(monkeypatch):
  """The sweep's progress lines are logged while summaries bootstrap on another
  thread: a bootstrap logs no line of rliable's and drops no one else's."""
  import logging as std_logging
  from absl import logging
  seen = []

  class Keep(std_logging.Handler):
    def emit(self, record):
      seen.append(record.getMessage())

  iqm = aggregate.iqm

  def iqm_that_logs(*args, **kwargs):  # runs inside the bootstrap
    logging.info('a progress line')
    return iqm(*args, **kwargs)

  monkeypatch.setattr(aggregate, 'iqm', iqm_that_logs)
  handler, verbosity = Keep(), logging.get_verbosity()
  logging.get_absl_logger().addHandler(handler)
  logging.set_verbosity(logging.INFO)
  try:
    aggregate.iqm_ci([1.0, 2.0, 3.0], reps=5)
  finally:
    logging.get_absl_logger().removeHandler(handler)
    logging.set_verbosity(verbosity)
  assert 'a progress line' in seen
  assert not [m for m in seen if m.startswith('Calculating estimates')]


def test_table_writes_the_summary_off_the_callers_thread(tmp_path):
  from harness.sweeps.table import TrialTable
  sweeps = sweep_spec.parse_sweeps([LR_GRID], 'grid')
  spec = sweep_spec.Spec(['/g/a.gin'], ['x.y = 1\n'], [], sweeps, [0, 1], 'grid', None)
  table = TrialTable(str(tmp_path), spec)
  rows = [r for r in table.rows.values() if r['_point']['make_agent.learning_rate'] == '1e-3']
  for row, final in zip(rows, (100.0, 300.0)):
    row.update(status='done', final_return=final, best_policy_return=final)
  table.write()
  for row in rows:  # a later change must not reach the summary of that write
    row.update(final_return=0.0)
  table.flush()
  summary = {r['make_agent.learning_rate']: r
             for r in aggregate.read_csv(str(tmp_path / aggregate.SUMMARY_FILE))}
  assert float(summary['1e-3']['iqm']) == pytest.approx(200.0)
  assert summary['3e-3']['n_seeds'] == '0'
  assert {r['status'] for r in aggregate.read_csv(str(tmp_path / aggregate.TRIALS_FILE))} == {
      'done', 'pending'}


def test_error_line_of_a_failed_child():
  from harness.sweeps.trial import error_line
  assert error_line(['noise', 'harness-train: error: make_agent.learning_rate=-1 must be '
                     'positive', ''], 2) == 'make_agent.learning_rate=-1 must be positive'
  assert error_line(['Traceback ...', 'ValueError: boom'], 1) == 'ValueError: boom'
  assert error_line([], 1) == 'exit status 1'
  assert error_line([], -9) == 'killed by SIGKILL'


# --- bad input (subprocess, no Ray) -----------------------------------------------------


@pytest.mark.parametrize('extra, message', [
    (['--sweep=make_agent.learning_rate=[1e-3'], 'unclosed'),
    (['--seeds=2', '--seed_list=0,1'], '--seeds and --seed_list'),
    (['--sweep=train_eval.seed=[1, 2]'], '--seeds'),
    (['--gin_file=gin/nope.gin'], 'nope.gin'),
])
def test_bad_input_exits_2_before_writing(tmp_path, tag, extra, message):
  root = tmp_path / 'sweep'
  cmd = sweep_command(str(root), sweeps=(), extra=extra)
  result = run_sweep(cmd, tag)
  assert result.returncode == 2, tail(result)
  assert len(result.stderr.splitlines()) == 1, result.stderr
  assert result.stderr.startswith('harness-sweep: error:') and message in result.stderr
  assert not root.exists()


def _sweep_temp_dirs():
  """The sweep's temporary directories (the trials' gate, Tune's files) now present."""
  return set(glob.glob(os.path.join(tempfile.gettempdir(), 'harness-sweep-*')))


@pytest.mark.slow
def test_unknown_binding_name_exits_2_before_writing(tmp_path, tag):
  """Tune starts while the check runs, its trials held at the gate: on bad input
  the gate closes, Tune stops, and nothing of the sweep is left anywhere."""
  root = tmp_path / 'sweep'
  temp_before = _sweep_temp_dirs()
  result = run_sweep(sweep_command(str(root), sweeps=['make_agent.learning_rat=[1e-3]']), tag)
  assert result.returncode == 2, tail(result)
  assert len(result.stderr.splitlines()) == 1, result.stderr
  assert 'make_agent.learning_rate' in result.stderr  # the suggestion
  assert not root.exists()
  assert _sweep_temp_dirs() <= temp_before
  assert_nothing_left(tag)


def test_a_trial_waits_at_the_gate_until_it_opens_and_fails_if_it_closes(tmp_path):
  from harness.sweeps import gate as sweep_gate
  gate = sweep_gate.Gate(str(tmp_path))
  waiter = threading.Thread(target=gate.wait)
  waiter.start()
  time.sleep(3 * sweep_gate.POLL_SECONDS)
  assert waiter.is_alive()  # neither open nor closed: the check still runs
  gate.open()
  waiter.join(timeout=5)
  assert not waiter.is_alive()

  closed = sweep_gate.Gate(str(tmp_path / 'closed'))
  os.makedirs(closed.path)
  closed.close()
  with pytest.raises(sweep_gate.GateClosed):
    closed.wait()
  closed.remove()
  assert not os.path.exists(closed.path)


def test_one_child_claims_the_check_and_the_first_verdict_stands(tmp_path):
  from harness.sweeps import gate as sweep_gate
  gate = sweep_gate.Gate(str(tmp_path))
  gate.request_check(['/a.gin'], ['x.y=1'], ['make_agent.learning_rate'])
  assert gate.check_request() == {'gin_files': ['/a.gin'], 'bindings': ['x.y=1'],
                                  'names': ['make_agent.learning_rate']}
  claims = []
  threads = [threading.Thread(target=lambda: claims.append(gate.claim_check()))
             for _ in range(8)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert sorted(claims) == [False] * 7 + [True]
  assert gate.verdict() is None
  assert gate.wait_verdict(5, cancelled=_set_event()) is None  # cancelled: no verdict
  assert gate.record_verdict(sweep_gate.Verdict(False, 'unknown gin binding', 2))
  assert not gate.record_verdict(sweep_gate.Verdict(True))
  assert gate.wait_verdict(5) == sweep_gate.Verdict(False, 'unknown gin binding', 2)


def _set_event() -> threading.Event:
  event = threading.Event()
  event.set()
  return event


def _gated_child(tmp_path, gate, script: str):
  """A sweep_trial.Child whose process is `python -c script` (its argv ends with
  the gate flags), in a sweep directory that does not exist yet."""
  from harness.sweeps import trial as sweep_trial

  class ScriptChild(sweep_trial.ChildSpec):

    def command(self) -> List[str]:
      return [sys.executable, '-c', script]

  sweep = tmp_path / 'sweep'
  spec = ScriptChild('t1', str(sweep / 'trials' / 't1'), str(sweep / 'logs' / 't1.log'), [], [])
  return sweep_trial.Child(spec, gate), sweep


_WAITS_FOR_THE_GATE = """
import os, sys, time
print('at the gate:', ' '.join(sys.argv[1:]), flush=True)
gate = sys.argv[1].split('=', 1)[1]
while not os.path.exists(os.path.join(gate, 'open')):
  time.sleep(0.05)
print('through the gate', flush=True)
"""


def test_a_gated_child_starts_at_once_and_writes_its_log_only_once_the_gate_opens(tmp_path):
  from harness.sweeps import gate as sweep_gate
  gate = sweep_gate.Gate(str(tmp_path / 'gate'))
  os.makedirs(gate.path)
  child, sweep = _gated_child(tmp_path, gate, _WAITS_FOR_THE_GATE)
  child.start()
  time.sleep(1.0)
  assert child.exit_code() is None and not sweep.exists()  # held: nothing in SWEEP
  gate.open()
  child.gate_opened()
  deadline = time.time() + 30
  while child.poll():
    assert time.time() < deadline
    time.sleep(0.05)
  log = (sweep / 'logs' / 't1.log').read_text()
  assert log.startswith('=== harness-sweep: launch at')
  # The first child at the gate was the one to check the input.
  assert f'at the gate: --sweep_gate={gate.path} --sweep_check' in log
  assert log.index('at the gate') < log.index('through the gate')


def test_a_child_that_ends_at_the_gate_gives_the_verdict_and_writes_nothing(tmp_path):
  """A crash before the checker's own verdict must not leave the sweep waiting."""
  from harness.sweeps import gate as sweep_gate
  from harness.sweeps import trial as sweep_trial
  gate = sweep_gate.Gate(str(tmp_path / 'gate'))
  os.makedirs(gate.path)
  child, sweep = _gated_child(
      tmp_path, gate, "import sys; sys.stderr.write('Boom: no such thing\\n'); sys.exit(3)")
  child.start()
  trial = type('Trial', (), {'_children': [child], 'cleanup': lambda self: None})()
  with pytest.raises(sweep_gate.GateClosed):
    sweep_trial.HarnessTrial._wait_at_the_gate(trial, gate)  # pylint: disable=protected-access
  assert gate.verdict() == sweep_gate.Verdict(False, 'Boom: no such thing', 1)
  assert not sweep.exists()


# --- a finished 2 x 2 grid (shared) ----------------------------------------------------


@pytest.fixture(scope='module')
def grid_sweep(tmp_path_factory):
  """A 2 x 2 grid (two learning rates, two seeds), run once for the tests below."""
  root = str(tmp_path_factory.mktemp('grid') / 'sweep')
  tag = uuid.uuid4().hex
  temp_before = _sweep_temp_dirs()
  result = run_sweep(sweep_command(root), tag, watch_for_ray=True)
  assert_nothing_left(tag, after=result)
  assert _sweep_temp_dirs() <= temp_before  # the gate and Tune's files are removed
  return root, result


@pytest.mark.slow
def test_grid_completes_with_run_dirs_and_tables(grid_sweep):
  root, result = grid_sweep
  assert result.returncode == 0, tail(result)
  assert result.ray_seen
  assert not result.idle_helpers_seen  # no autoscaler monitor, log monitor, dashboard head
  trials = sorted(os.listdir(os.path.join(root, 'trials')))
  assert trials == ['learning_rate=1e-3,seed=0', 'learning_rate=1e-3,seed=1',
                    'learning_rate=3e-3,seed=0', 'learning_rate=3e-3,seed=1']
  for tid in trials:
    run_dir = os.path.join(root, 'trials', tid)
    assert os.path.isfile(os.path.join(run_dir, 'results.json'))
    assert os.path.isfile(os.path.join(run_dir, 'eval.csv'))
    assert os.path.isfile(os.path.join(root, 'logs', f'{tid}.log'))
  rows = read_rows(root, 'trials.csv')
  assert [r['trial_id'] for r in rows] == trials
  for row in rows:
    assert row['status'] == 'done'
    assert math.isfinite(float(row['final_return']))
    assert math.isfinite(float(row['best_policy_return']))
    assert int(row['env_steps']) >= 400 and float(row['wall_seconds']) > 0
    assert row['error'] == '' and row['attempts'] == '1'
  summary = read_rows(root, 'summary.csv')
  assert [r['make_agent.learning_rate'] for r in summary] == ['1e-3', '3e-3']
  for row in summary:
    assert row['n_seeds'] == '2'
    assert float(row['ci_low']) <= float(row['iqm']) <= float(row['ci_high'])
    assert float(row['best_ci_low']) <= float(row['best_iqm']) <= float(row['best_ci_high'])
  with open(os.path.join(root, 'summary.png'), 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  # One progress line per trial, then the table on stdout; nothing on stderr.
  assert 'trial 4/4 done: learning_rate=' in result.stdout
  assert 'IQM final [95% CI]' in result.stdout
  assert result.stderr == '', result.stderr[-3000:]
  assert not os.path.exists(os.path.join(root, '.tune'))


@pytest.mark.slow
def test_same_command_again_starts_no_trial_and_no_ray(grid_sweep, tag):
  root, first = grid_sweep
  assert first.returncode == 0, tail(first)
  trials = os.path.join(root, 'trials')
  before = tree_digest(trials)
  result = run_sweep(sweep_command(root), tag, watch_for_ray=True)
  assert result.returncode == 0, tail(result)
  assert 'Nothing left to run' in result.stdout
  assert not result.ray_seen
  assert tree_digest(trials) == before  # metrics.csv, checkpoints...: bytes and mtimes
  assert 'IQM final [95% CI]' in result.stdout


@pytest.mark.slow
def test_changed_spec_is_refused_and_nothing_touched(grid_sweep, tag):
  root, first = grid_sweep
  assert first.returncode == 0, tail(first)
  before = tree_digest(root)
  result = run_sweep(sweep_command(root, sweeps=['make_agent.learning_rate=[1e-3, 1e-2]']), tag)
  assert result.returncode == 2, tail(result)
  assert len(result.stderr.splitlines()) == 1
  assert 'holds another sweep' in result.stderr and 'make_agent.learning_rate' in result.stderr
  assert tree_digest(root) == before


@pytest.mark.slow
def test_plot_draws_the_summary_of_a_sweep(grid_sweep, tmp_path):
  root, first = grid_sweep
  assert first.returncode == 0, tail(first)
  out = tmp_path / 'sweep.png'
  result = subprocess.run([sys.executable, '-m', 'harness.plot', root, f'--out={out}'],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
  assert result.returncode == 0, result.stderr
  with open(out, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  assert '2 curves' in result.stdout or '2 points' in result.stdout


# --- SIGKILL mid-trial, bad values -----------------------------------------------------


def _kill_group_and_leftovers(pgid: int, tag: str) -> List[str]:
  """SIGKILLs the sweep's process group, then whatever of this test survived it.

  Returns what survived the group kill (for the record: see README).
  """
  try:
    os.killpg(pgid, signal.SIGKILL)
  except ProcessLookupError:
    pass
  time.sleep(3)
  survivors = tagged_processes(tag)
  seen = describe(survivors)
  for proc in survivors:
    try:
      proc.kill()
    except psutil.Error:
      pass
  psutil.wait_procs(survivors, timeout=10)
  return seen


@pytest.fixture(scope='module')
def killed_sweep(tmp_path_factory):
  """One good and one bad learning rate, one seed. The first launch is SIGKILLed once
  the good trial has a checkpoint (the bad one has failed by then); the second
  launch runs to the end."""
  root = str(tmp_path_factory.mktemp('killed') / 'sweep')
  tag = uuid.uuid4().hex
  cmd = sweep_command(root, sweeps=['make_agent.learning_rate=[1e-3, -1e-3]'],
                      bindings=TINY + ['train_eval.num_env_steps=1500'], extra=['--seeds=1'])
  good = os.path.join(root, 'trials', 'learning_rate=1e-3,seed=0')
  proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
                          env=tagged_env(tag), start_new_session=True)
  deadline = time.time() + TIMEOUT
  while not os.path.exists(os.path.join(good, 'train', 'checkpoint')):
    assert proc.poll() is None, 'the sweep ended before the kill'
    assert time.time() < deadline, f'no checkpoint after {TIMEOUT} s'
    time.sleep(0.2)
  # The bad trial fails within seconds; give its row time to reach trials.csv.
  bad_seen = time.time() + 300
  while time.time() < bad_seen:
    if any(r['status'] == 'failed' for r in read_rows(root, 'trials.csv')):
      break
    time.sleep(0.5)
  first_rows = read_rows(root, 'trials.csv')
  survivors = _kill_group_and_leftovers(os.getpgid(proc.pid), tag)
  proc.wait()
  assert not os.path.exists(os.path.join(good, 'results.json'))
  assert_nothing_left(tag)
  result = run_sweep(cmd, tag)
  assert_nothing_left(tag, after=result)
  return root, good, result, first_rows, survivors


@pytest.mark.slow
def test_sigkilled_sweep_resumes_the_killed_trial(killed_sweep):
  root, good, result, _, survivors = killed_sweep
  print('survived the group SIGKILL:', survivors)
  assert result.returncode == 1, tail(result)  # the bad trial failed (again)
  resume_reports = [f for f in os.listdir(os.path.join(good, 'config'))
                    if f.startswith('resume-')]
  assert resume_reports, os.listdir(os.path.join(good, 'config'))
  rows = {r['trial_id']: r for r in read_rows(root, 'trials.csv')}
  good_row = rows['learning_rate=1e-3,seed=0']
  assert good_row['status'] == 'done' and good_row['attempts'] == '2'
  assert int(good_row['env_steps']) >= 1500


@pytest.mark.slow
def test_bad_value_fails_only_its_trials(killed_sweep):
  root, _, result, first_rows, _ = killed_sweep
  first = {r['trial_id']: r for r in first_rows}
  assert first['learning_rate=-1e-3,seed=0']['status'] == 'failed'
  rows = {r['trial_id']: r for r in read_rows(root, 'trials.csv')}
  bad = rows['learning_rate=-1e-3,seed=0']
  assert bad['status'] == 'failed'
  assert bad['error'] == 'make_agent.learning_rate=-0.001 must be a positive number, e.g. 1e-3'
  assert bad['failures'] == '2'  # failed on the first launch, retried once on the second
  assert rows['learning_rate=1e-3,seed=0']['status'] == 'done'
  assert 'failed: learning_rate=-1e-3 seed=0: make_agent.learning_rate=-0.001' in result.stdout
  summary = {r['make_agent.learning_rate']: r for r in read_rows(root, 'summary.csv')}
  assert summary['1e-3']['n_seeds'] == '1' and summary['-1e-3']['n_seeds'] == '0'


@pytest.mark.slow
def test_sigterm_stops_the_trials_with_their_checkpoint_and_exits_143(tmp_path, tag):
  """What a scheduler's preemption sends: each running harness-train gets its own
  SIGTERM, writes its stop checkpoint (its log says so), the row goes back to
  pending, the driver exits 143 and nothing is left running. Before the fix
  Ray's handler ended the driver (exit 1) and Ray SIGKILLed the children."""
  root = str(tmp_path / 'sweep')
  bindings = [b for b in TINY if not b.startswith('train_eval.num_env_steps')]
  cmd = sweep_command(root, sweeps=[], bindings=bindings + ['train_eval.num_env_steps=100000'],
                      extra=['--seeds=1'])
  log = os.path.join(root, 'logs', 'seed=0.log')
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          cwd=REPO, env=tagged_env(tag), start_new_session=True)
  try:
    deadline = time.time() + TIMEOUT
    while not (os.path.exists(log) and 'Checkpoint at train_step' in open(log).read()):
      assert proc.poll() is None, proc.stdout.read()[-3000:]
      assert time.time() < deadline, f'no checkpoint after {TIMEOUT} s'
      time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
  except BaseException:
    _kill_group_and_leftovers(proc.pid, tag)
    raise
  assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
  with open(log) as f:
    stop_lines = [line for line in f if 'stopped by SIGTERM at env_steps' in line]
  assert stop_lines, 'the trial\'s harness-train did not write its stop checkpoint'
  [row] = read_rows(root, 'trials.csv')
  assert row['status'] == 'pending'
  assert '1 trials unfinished: the same command resumes them' in out


# --- stopping Ray --------------------------------------------------------------------


@pytest.mark.slow
def test_stopping_ray_survives_a_collection_on_another_thread(tag):
  """ray_runtime.stop against the Ray 2.40 crash (scripts/repro_shutdown_gc.py):
  ObjectRefs in garbage cycles, collected on a thread while Ray stops, killed
  the sweep's driver (its agents left running; 6 of 318 Ray sessions here).
  With a plain ray.shutdown() these delays died in the first or second round,
  3 runs of 3."""
  delays = '0.01,0.03,0.05,0.07,0.1'
  result = run_sweep([sys.executable, os.path.join(REPO, 'scripts', 'repro_shutdown_gc.py'),
                      '--stop=harness', f'--delays={delays}'], tag)
  assert result.returncode == 0, tail(result)
  assert result.stdout.count('survived') == len(delays.split(',')), tail(result)
  assert_nothing_left(tag, after=result)


def test_only_rays_own_leftovers_are_killed_early():
  """ray_runtime.stop kills Ray's leftovers after RAY_GRACE_S, but gives other
  processes (a trial's harness-train, checkpointing) EXIT_WAIT_S."""
  from harness.base import ray_runtime
  import ray
  ray_dir = os.path.dirname(ray.__file__) + os.sep
  worker = subprocess.Popen(['bash', '-c', 'exec -a ray::IDLE sleep 60'])
  # An agent's command line names its script in Ray's package (here as argv[0]).
  agent = subprocess.Popen(['bash', '-c', f'exec -a {ray_dir}dashboard/agent.py sleep 60'])
  ours = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', 'harness.train'])
  try:
    time.sleep(1)  # exec has replaced bash's command line
    assert ray_runtime._is_rays_own(psutil.Process(worker.pid), ray_dir)
    assert ray_runtime._is_rays_own(psutil.Process(agent.pid), ray_dir)
    assert not ray_runtime._is_rays_own(psutil.Process(ours.pid), ray_dir)
  finally:
    for proc in (worker, agent, ours):
      proc.kill()
      proc.wait()


# --- Optuna -------------------------------------------------------------------------------


@pytest.mark.slow
def test_optuna_search_of_4_trials(tmp_path, tag):
  root = str(tmp_path / 'search')
  cmd = sweep_command(root, sweeps=['make_agent.learning_rate=loguniform(1e-4, 1e-2)'],
                      extra=['--search=optuna', '--num_trials=4', '--seeds=1'])
  result = run_sweep(cmd, tag)
  assert result.returncode == 0, tail(result)
  summary = read_rows(root, 'summary.csv')
  assert len(summary) == 4
  rates = [float(r['make_agent.learning_rate']) for r in summary]
  assert len(set(rates)) == 4 and all(1e-4 <= r <= 1e-2 for r in rates)
  rows = read_rows(root, 'trials.csv')
  assert len(rows) == 4
  assert {r['status'] for r in rows} <= {'done', 'stopped'}
  assert any(r['status'] == 'done' for r in rows)
  spec = sweep_spec.read_spec(root)
  assert spec['search'] == 'optuna' and spec['num_trials'] == 4
  # Run again: the search is complete, nothing runs.
  again = run_sweep(cmd, tag)
  assert again.returncode == 0, tail(again)
  assert 'Nothing left to run' in again.stdout
