"""`harness-sweep`: seeds x settings (grid) or an Optuna search, as harness-train runs on Ray.

```
harness-sweep --root_dir=SWEEP --gin_file=F [--gin_bindings=B ...]
              [--sweep='NAME=[v1, v2]' ...] [--seeds=N | --seed_list=0,1,2]
              [--search=grid|optuna] [--num_trials=K] [--max_concurrent=C]
              [--cpus_per_trial=1] [--ray_address=auto|host:port]
```

Every trial is one `harness-train` process in `SWEEP/trials/<trial_id>/`, a
normal run directory; Ray Tune schedules them (`sweep_tune`, `sweep_trial`), and
`sweep_table` keeps their record. The driver (this module)
checks the input first (bad input: one line on stderr, exit 2, nothing in SWEEP
written), keeps `SWEEP/trials.csv` and `SWEEP/summary.csv` up to date as trials
finish, and draws `SWEEP/summary.png` at the end.

Resume is ours, not Tune's: every launch derives all trials from the spec and
the run directories. A trial with results.json is done; a failed trial runs
again while it has failed fewer than `sweep_table.MAX_FAILURES` times; any other trial is
(re)submitted, and harness-train resumes it from its own checkpoint.

The sweep never imports TensorFlow or the training code. On one machine the
first trial's `harness-train` validates the common configuration before its own
run, and every trial waits at a gate (`sweep_gate`) until the check has passed
and SWEEP is written; on a cluster `harness-train --check_only` in a subprocess
checks it, beside Ray's start, before Tune starts.
"""

from __future__ import annotations

from concurrent import futures
import importlib
import logging as std_logging
from logging import handlers as log_handlers
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Callable, List, Optional

from absl import flags
from absl import logging

from harness.base import cli
from harness.base import ray_runtime
from harness.base.errors import UsageError
from harness.sweeps import aggregate
from harness.sweeps import gate as sweep_gate
from harness.sweeps import spec as sweep_spec
from harness.sweeps import tune as sweep_tune
from harness.sweeps.spec import Spec
from harness.sweeps.table import TrialTable

_ROOT_DIR = flags.DEFINE_string('root_dir', None, 'Sweep directory; an existing sweep there '
                                'is resumed.')
_GIN_FILE = flags.DEFINE_multi_string('gin_file', [], 'Gin files of every trial, in order.')
_GIN_BINDINGS = flags.DEFINE_multi_string('gin_bindings', [], 'Bindings of every trial.')
_SWEEP = flags.DEFINE_multi_string(
    'sweep', [], "NAME=[v1, v2, ...] (gin values; the grid is the product of all lists), or "
    'for --search=optuna NAME=loguniform(a, b) | uniform(a, b) | choice([...]).')
_SEEDS = flags.DEFINE_integer('seeds', None, 'Seeds 0..N-1 of every point (default: 1).')
_SEED_LIST = flags.DEFINE_string('seed_list', None, 'Seeds of every point, e.g. 0,1,2.')
_SEARCH = flags.DEFINE_enum('search', 'grid', list(sweep_spec.SEARCHES),
                            'grid: every combination; optuna: TPE with ASHA early stopping.')
_NUM_TRIALS = flags.DEFINE_integer('num_trials', None, '--search=optuna: points to try.')
_MAX_CONCURRENT = flags.DEFINE_integer(
    'max_concurrent', None, 'Tune trials running at once (default: as many as the CPUs allow).')
_CPUS_PER_TRIAL = flags.DEFINE_float('cpus_per_trial', 1.0,
                                     'CPUs Ray reserves for each harness-train process.')
_RAY_ADDRESS = flags.DEFINE_string(
    'ray_address', None, 'auto or host:port of a running Ray cluster; default: start Ray '
    'here, on localhost only, for this sweep.')

_TRACK = flags.DEFINE_bool(
    'track', False, 'Pass --track to every trial: one W&B run per trial, one W&B group per '
    "sweep (the sweep directory's name). Needs pip install -e '.[wandb]'.")

_PROGRAM = 'harness-sweep'
RAY_LOG = 'ray.log'
# Ray Tune's own files on a cluster (removed at the end); on one machine a temporary directory.
TUNE_DIR = '.tune'
# The longest an input check may take (a TensorFlow start, an environment built).
CHECK_TIMEOUT_SECONDS = 600


# --- input ----------------------------------------------------------------------------


def read_spec_from_flags() -> Spec:
  """The spec of this launch, from the flags; bad input is a `UsageError`."""
  if not _GIN_FILE.value:
    raise UsageError('--gin_file is required: e.g. --gin_file=gin/ddqn_cartpole.gin')
  search = _SEARCH.value
  sweeps = sweep_spec.parse_sweeps(_SWEEP.value, search)
  seeds = sweep_spec.parse_seeds(_SEEDS.value, _SEED_LIST.value)
  for binding in _GIN_BINDINGS.value:
    name = binding.split('=', 1)[0].strip()
    if name == sweep_spec.SEED_BINDING:
      raise UsageError(f'--gin_bindings "{binding}": a sweep sets train_eval.seed itself; '
                       'use --seeds=N or --seed_list=0,1,2')
  num_trials = _NUM_TRIALS.value
  if search == 'optuna':
    if num_trials is None or num_trials < 1:
      raise UsageError('--search=optuna needs --num_trials=K (K >= 1): the number of points '
                       'to try')
    if not sweeps:
      raise UsageError("--search=optuna needs at least one --sweep range, e.g. "
                       "--sweep='make_agent.learning_rate=loguniform(1e-4, 1e-2)'")
  elif num_trials is not None:
    raise UsageError('--num_trials goes with --search=optuna; a grid runs every combination')
  if _MAX_CONCURRENT.value is not None and _MAX_CONCURRENT.value < 1:
    raise UsageError(f'--max_concurrent={_MAX_CONCURRENT.value} must be at least 1')
  if not _CPUS_PER_TRIAL.value > 0:
    raise UsageError(f'--cpus_per_trial={_CPUS_PER_TRIAL.value} must be positive')
  paths, texts = sweep_spec.read_gin_files(_GIN_FILE.value)
  return Spec(paths, texts, list(_GIN_BINDINGS.value), sweeps, seeds, search, num_trials)


def check_root(root: Optional[str]) -> str:
  """The absolute sweep directory; a file, or a directory that is no sweep, is refused."""
  if not root:
    raise UsageError('--root_dir is required: e.g. --root_dir=runs/sweep')
  path = os.path.abspath(root)
  if os.path.exists(path) and not os.path.isdir(path):
    raise UsageError(f'--root_dir={root} is a file, not a directory')
  if (os.path.isdir(path) and os.listdir(path) and
      not os.path.exists(sweep_spec.spec_path(path))):
    raise UsageError(f'--root_dir={root} is a directory without {sweep_spec.SPEC_FILE}: not '
                     'a sweep; pass a new or empty directory, or an existing sweep')
  existing = path
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.access(existing, os.W_OK | os.X_OK):
    raise UsageError(f'--root_dir={root} is not writable ({existing})')
  return path


def check_same_spec(root: str, spec: Spec) -> bool:
  """True when SWEEP already holds this spec; False when it is new; `UsageError` otherwise."""
  stored = sweep_spec.read_spec(root)
  if stored is None:
    return False
  difference = spec.first_difference(stored)
  if difference:
    raise UsageError(f'--root_dir={_ROOT_DIR.value} holds another sweep: {difference}; run '
                     'its own command to resume it, or pass a new --root_dir')
  return True


def start_check(spec: Spec) -> subprocess.Popen:
  """Starts `harness-train --check_only` on the common config and the swept names.

  Values of single points are not checked here: a bad one fails its own
  trials, and the others go on. It runs while Ray starts (`finish_check`).
  """
  cmd = [sys.executable, '-m', 'harness.train', '--check_only']
  cmd += [f'--gin_file={p}' for p in spec.gin_files]
  cmd += [f'--gin_bindings={b}' for b in spec.bindings]
  cmd += [f'--check_names={s.name}' for s in spec.sweeps]
  return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          stdin=subprocess.DEVNULL)


def finish_check(check: subprocess.Popen) -> None:
  """Waits for the check; its error line becomes ours (exit 2)."""
  try:
    _, stderr = check.communicate(timeout=CHECK_TIMEOUT_SECONDS)
  except subprocess.TimeoutExpired as e:
    check.kill()
    check.communicate()
    raise UsageError(f'harness-train --check_only did not finish in {CHECK_TIMEOUT_SECONDS} s'
                     ) from e
  if check.returncode == 0:
    return
  lines = [l for l in stderr.splitlines() if l.strip()]
  prefix = 'harness-train: error:'
  message = next((l[len(prefix):].strip() for l in reversed(lines) if l.startswith(prefix)),
                 lines[-1] if lines else f'exit status {check.returncode}')
  if check.returncode == UsageError.exit_code:
    raise UsageError(message)
  raise RuntimeError(f'harness-train --check_only failed (exit {check.returncode}): {message}')


# --- Ray ------------------------------------------------------------------------------


def _ray_log_file(root: str) -> std_logging.Handler:
  """SWEEP/logs/ray.log, for Ray's and Optuna's log records."""
  handler = std_logging.FileHandler(os.path.join(root, sweep_spec.LOGS_DIR, RAY_LOG))
  handler.setFormatter(std_logging.Formatter('%(asctime)s %(levelname)s %(name)s: %(message)s'))
  return handler


def _import_tune() -> None:
  for module in ('ray.tune', 'harness.sweeps.trial'):
    importlib.import_module(module)


def start_ray(cpus_needed: float) -> None:
  """Embedded Ray with room for the trials, or the cluster of --ray_address, and
  Ray Tune's import meanwhile on a thread: `ray.init` mostly waits for Ray's
  processes to start, and the import (1.1 s here) then took 0.6 to 1.0 s less."""
  importlib.import_module('ray')  # once, before both threads
  importing = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix='import-tune')
  imported = importing.submit(_import_tune)
  importing.shutdown(wait=False)
  ray_runtime.start(_RAY_ADDRESS.value,
                    num_cpus=max(os.cpu_count() or 1, math.ceil(cpus_needed)))
  imported.result()


# --- main -----------------------------------------------------------------------------


def start_drawing(root: str) -> futures.Future:
  """Draws SWEEP/summary.png on a thread of its own (it reads only trials.csv and
  the run directories), so that it runs while Ray stops; see `finish`."""
  drawing = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix='summary.png')
  drawn = drawing.submit(aggregate.plot_sweep, root, os.path.join(root, aggregate.SUMMARY_PNG))
  drawing.shutdown(wait=False)
  return drawn


def finish(root: str, table: TrialTable, drawn: Optional[futures.Future] = None) -> int:
  """summary.csv, summary.png (unless `drawn` is drawing it) and the table on stdout;
  returns the exit status."""
  table.write()
  table.flush()
  (drawn or start_drawing(root)).result()
  print(aggregate.format_table(table.summary(), table.swept), flush=True)
  failed = table.failed()
  unfinished = [r for r in table.rows.values() if r['status'] in ('pending', 'running')]
  logging.info('%s: %d done, %d failed, %d stopped early, %d unfinished; %s, %s, %s',
               root, sum(r['status'] == 'done' for r in table.rows.values()), len(failed),
               sum(r['status'] == 'stopped' for r in table.rows.values()), len(unfinished),
               aggregate.TRIALS_FILE, aggregate.SUMMARY_FILE, aggregate.SUMMARY_PNG)
  if unfinished:
    logging.info('%d trials unfinished: the same command resumes them', len(unfinished))
  return 1 if failed or unfinished else 0


def prepare_sweep_dir(root: str, spec: Spec, table: TrialTable, resuming: bool,
                      held: log_handlers.MemoryHandler) -> None:
  """Once the input is good: SWEEP with sweep.json first (a directory without it
  is no sweep), trials/, logs/ (Ray's held log records go to logs/ray.log), and
  trials.csv."""
  os.makedirs(root, exist_ok=True)
  if not resuming:
    sweep_spec.write_spec(root, spec)
  os.makedirs(os.path.join(root, sweep_spec.TRIALS_DIR), exist_ok=True)
  os.makedirs(os.path.join(root, sweep_spec.LOGS_DIR), exist_ok=True)
  held.setTarget(_ray_log_file(root))
  held.flush()
  ray_runtime.route_library_logs(held.target)
  table.write()
  logging.info('Sweep %s: %d trials, %s to run%s', root, table.total,
               len(table.remaining()) if spec.search == 'grid' else 'points of the search',
               f' (max {_MAX_CONCURRENT.value} at once)' if _MAX_CONCURRENT.value else '')


class _GateOpener:
  """On a thread of its own: waits for the verdict of the input check (made by
  the first trial's harness-train, see `sweep_gate`), prepares SWEEP, then opens
  the trials' gate; on bad input (or any error) it closes the gate instead."""

  def __init__(self, gate: sweep_gate.Gate, prepare: Callable[[], None]):
    self._gate, self._prepare = gate, prepare
    self._error: Optional[BaseException] = None
    self._cancelled = threading.Event()
    self._thread = threading.Thread(target=self._run, name='gate', daemon=True)
    self._thread.start()

  def _run(self) -> None:
    try:
      verdict = self._gate.wait_verdict(CHECK_TIMEOUT_SECONDS, self._cancelled)
      if verdict is None:  # Tune ended first (Ctrl-C, or no trial could start)
        self._gate.close()
        return
      if not verdict.passed:
        if verdict.exit_code == UsageError.exit_code:
          raise UsageError(verdict.message)
        raise RuntimeError(f'the input check failed (exit {verdict.exit_code}): '
                           f'{verdict.message}')
      self._prepare()
      self._gate.open()
    except TimeoutError as e:
      self._error = UsageError(f'{e}: the first trial could not check the input')
      self._gate.close()
    except BaseException as e:  # pylint: disable=broad-except  (re-raised by result())
      self._error = e
      self._gate.close()

  def result(self) -> bool:
    """After Tune has returned: True once SWEEP was prepared and the gate opened;
    False if Tune ended before the input check did. Raises what stopped it (a bad
    input's UsageError)."""
    self._cancelled.set()
    self._thread.join()
    if self._error is not None:
      raise self._error
    return self._gate.is_open()


def nothing_left(table: TrialTable) -> bool:
  if table.spec.search == 'grid':
    return not table.remaining()
  finished, unfinished = sweep_tune.optuna_points(table)
  return not unfinished and len(finished) >= (table.spec.num_trials or 0)


# Set by the first SIGTERM: the sweep then exits 143, as harness-train does.
_STOPPED_BY_SIGTERM = threading.Event()


def _stop_as_on_ctrl_c(signum: int, frame) -> None:
  """SIGTERM (what Slurm and Kubernetes send before a kill) stops the sweep as Ctrl-C does.

  Tune stops its trials gracefully only on SIGINT (and SIGUSR1); on SIGTERM the
  driver just died, and Ray then SIGKILLed the trials' harness-train children
  with their worker, before their own SIGTERM checkpoint (seen on a MinAtar
  sweep: no stop line, the last checkpoint minutes old). Raised as SIGINT, it
  reaches Tune's handler while Tune runs (trials stop, their children
  checkpoint). Before Tune starts or after it ends, the driver exits 143 at
  once (the `finally` blocks stop Ray), as a second SIGTERM does. Installed
  once Ray has started, whose own handler would replace it.
  """
  del signum, frame
  if _STOPPED_BY_SIGTERM.is_set() or signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    sys.exit(128 + signal.SIGTERM)
  _STOPPED_BY_SIGTERM.set()
  logging.warning('SIGTERM: stopping the trials (each harness-train checkpoints); '
                  'the same command resumes')
  signal.raise_signal(signal.SIGINT)


def main(argv: List[str]) -> None:
  if len(argv) > 1:
    raise UsageError(f'unexpected arguments {argv[1:]}: use --flag=value forms')
  root = check_root(_ROOT_DIR.value)
  if _TRACK.value:
    from harness.base import tracking  # pylint: disable=g-import-not-at-top  (an optional extra)
    tracking.check_ready()
  spec = read_spec_from_flags()
  resuming = check_same_spec(root, spec)
  table = TrialTable(root, spec)
  if resuming and nothing_left(table):
    logging.info('Nothing left to run in %s: writing the summary', root)
    sys.exit(finish(root, table))
  ray_runtime.quiet_environment()
  # Ray's log records wait in memory until the input is known to be good.
  held = log_handlers.MemoryHandler(capacity=100_000, flushLevel=std_logging.CRITICAL + 1)
  per_trial = _CPUS_PER_TRIAL.value * (len(spec.seeds) if spec.search == 'optuna' else 1)
  drawn = None
  # On one machine the first trial's harness-train checks the input (see
  # sweep_gate), and Tune keeps its own files outside SWEEP meanwhile. On a
  # cluster a check of our own comes first, beside Ray's start, and Tune's files
  # go where every node sees them (as SWEEP must be).
  gate = None if _RAY_ADDRESS.value else sweep_gate.Gate()
  check = None
  if gate is None:
    check = start_check(spec)
  else:
    gate.request_check(spec.gin_files, spec.bindings, [s.name for s in spec.sweeps])
  tune_dir = (tempfile.mkdtemp(prefix='harness-sweep-tune-') if gate else
              os.path.join(root, TUNE_DIR))
  opener = None
  try:
    try:
      start_ray(per_trial * (_MAX_CONCURRENT.value or 1))  # beside the check, on a cluster
    except BaseException:
      if check is not None:
        finish_check(check)  # Bad input is the error to report, not Ray's.
      raise
    # After Ray's start: its core worker installs a SIGTERM handler of its own
    # (it logs the signal and ends the driver).
    signal.signal(signal.SIGTERM, _stop_as_on_ctrl_c)
    # After Ray's start: importing Ray and `ray.init` replace the 'ray' logger's handlers.
    ray_runtime.route_library_logs(held)
    if check is not None:
      finish_check(check)  # Bad input: exit 2 before anything in SWEEP is written.
      prepare_sweep_dir(root, spec, table, resuming, held)
    else:
      opener = _GateOpener(gate, lambda: prepare_sweep_dir(root, spec, table, resuming, held))
    sweep_tune.run_tune(root, spec, table, _CPUS_PER_TRIAL.value, _MAX_CONCURRENT.value,
                        tune_dir, track_group=os.path.basename(os.path.abspath(root))
                        if _TRACK.value else None, gate=gate)
    if opener is not None and not opener.result():  # Bad input: its UsageError, nothing in SWEEP.
      logging.error('The sweep stopped before its input was checked; nothing was written: '
                    'run the same command again')
      sys.exit(1)
    if not any(row['status'] == 'running' for row in table.rows.values()):  # not interrupted
      drawn = start_drawing(root)
  finally:
    if check is not None and check.poll() is None:
      check.kill()
      check.wait()
    # Stops the Ray we started; on a cluster it only disconnects this driver.
    ray_runtime.stop(embedded=not _RAY_ADDRESS.value, program=_PROGRAM)
    shutil.rmtree(tune_dir, ignore_errors=True)
    if gate is not None:
      gate.remove()
  if table.interrupted():
    logging.info('Interrupted: running trials go back to pending')
  status = finish(root, table, drawn)
  sys.exit(128 + signal.SIGTERM if _STOPPED_BY_SIGTERM.is_set() else status)


COMMAND = cli.Command(
    program=_PROGRAM,
    summary='runs seeds x settings (a grid, or an Optuna search) as harness-train trials on '
            'Ray; the same command resumes a sweep.',
    usage="--root_dir=SWEEP --gin_file=FILE [--sweep='NAME=[v1, v2]' ...] [--seeds=N] [flags]",
    example="harness-sweep --root_dir=runs/sweep_lr --gin_file=gin/ddqn_cartpole.gin "
            "--sweep='make_agent.learning_rate=[1e-3, 3e-3]' --seeds=3",
    module=__name__)

def run() -> None:
  """Console-script entry point. Once Ray has stopped and everything is written,
  the exit skips the interpreter's teardown (Ray's and pyarrow's C++ modules,
  joining idle threads): `cli.exit_without_teardown`."""
  try:
    cli.run_app(_PROGRAM, main, COMMAND)
  except SystemExit as e:
    cli.exit_without_teardown(e.code)


if __name__ == '__main__':
  run()
