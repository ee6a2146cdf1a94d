"""`harness-launch`: a distributed run on Ray (`python -m harness.launch` is the same).

  harness-launch --root_dir=R --gin_file=F [--gin_bindings=B ...] --num_collectors=N
                 [--eval_job] [--ray_address=auto|host:port]

The replay server, N collectors, the learner and (with --eval_job) an eval
job run as Ray actors, each in a worker process of its own (harness/actors.py).
Without --ray_address Ray runs embedded on this machine, bound to localhost,
and stops with the launch; with it the actors spread over that cluster, which
keeps running afterwards (the launch only disconnects).

The input is checked first, by `harness-train --check_only` in a child
process: the same checks and messages as harness-train, and this process stays
a light Ray driver (no TensorFlow) for the length of the run. Bad input ends
with one line on stderr and exit status 2, before Ray starts and before
anything in ROOT is touched; a refused resume (the learner opens ROOT before
any other job starts) too.

Ray restarts a job whose process dies (`Distributed.max_restarts`). The launch
waits for the learner to reach its target, then stops the other jobs. SIGINT
(Ctrl-C) or SIGTERM asks the learner to write a checkpoint and stop, then
stops every job; a second one stops at once.

Exit status: 0 the learner reached its target; 1 a job failed for good (or the
stop did not complete); 2 bad input; 130 (SIGINT) or 143 (SIGTERM) stopped
cleanly, the learner's checkpoint written: the same command resumes.
"""

from __future__ import annotations

import csv
import logging as std_logging
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import gin
import psutil

from harness import actors
from harness import errors
from harness import settings as settings_lib
from harness.errors import UsageError

_ROOT_DIR = flags.DEFINE_string('root_dir', None, 'Run directory; an existing run there is resumed.')
_GIN_FILE = flags.DEFINE_multi_string('gin_file', [], 'Gin files, applied in order.')
_GIN_BINDINGS = flags.DEFINE_multi_string(
    'gin_bindings', [], 'Gin bindings, applied after the files (so they win).')
_NUM_COLLECTORS = flags.DEFINE_integer('num_collectors', 2, 'Collector jobs (each a Ray actor).')
_EVAL_JOB = flags.DEFINE_bool(
    'eval_job', False, 'Evaluate in a job of its own (Distributed.eval_in_learner=False).')
_RAY_ADDRESS = flags.DEFINE_string(
    'ray_address', None, 'A running Ray cluster: `auto` (the one `ray start` started on this '
    'host) or host:port of its head. Without it Ray runs embedded on this machine.')

_PROGRAM = 'harness-launch'
_POLL_S = 1.0
# How long the learner may take to finish its iteration and write the
# checkpoint after a stop request (a second signal stops at once).
_LEARNER_STOP_GRACE_S = 300.0
# After the learner's target, the eval job's last evaluation may take this long
# (on top of Distributed.eval_job_interval_seconds).
_EVAL_FINISH_S = 120.0
# ray.shutdown() returns before all of its processes have exited.
_RAY_EXIT_WAIT_S = 30.0
_ADDRESS = re.compile(r'^(auto|ray://\S+|[^\s:]+:\d+)$')


class _Signals:
  """SIGINT and SIGTERM, turned into a request that the main loop handles."""

  def __init__(self):
    self.signum: Optional[int] = None
    self.count = 0

  def install(self) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
      signal.signal(sig, self._handle)

  def _handle(self, signum: int, _frame) -> None:
    self.count += 1
    if self.signum is None:
      self.signum = signum
    logging.info('%s: received %s%s', _PROGRAM, signal.Signals(signum).name,
                 '' if self.count == 1 else ' again: stopping at once')

  @property
  def exit_code(self) -> int:
    return 128 + (self.signum or 0)


def check_flags(num_collectors: int, ray_address: Optional[str]) -> None:
  if num_collectors < 1:
    raise UsageError(f'--num_collectors={num_collectors} must be at least 1')
  if ray_address is not None and not _ADDRESS.match(ray_address):
    raise UsageError(f'--ray_address={ray_address!r} must be `auto` or host:port of a Ray '
                     'head (the address `ray start --head` prints)')


def check_config(root_dir: Optional[str], gin_files: Sequence[str],
                 gin_bindings: Sequence[str], verbose: bool) -> None:
  """`harness-train --check_only` on the same input: raises its error line as a `UsageError`."""
  cmd = [sys.executable, '-m', 'harness.train', '--check_only']
  cmd += [f'--root_dir={root_dir}'] if root_dir is not None else []
  cmd += [f'--gin_file={f}' for f in gin_files] + [f'--gin_bindings={b}' for b in gin_bindings]
  cmd += ['--verbosity=1'] if verbose else []
  result = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if result.returncode == 0:
    return
  if verbose:
    sys.stderr.write(result.stderr)
  lines = result.stderr.strip().splitlines() or [f'exit status {result.returncode}']
  message = lines[-1].split(': error: ', 1)[-1]
  if result.returncode == UsageError.exit_code:
    raise UsageError(message)
  raise LaunchError(f'checking the input failed ({message})')


def read_distributed(gin_files: Sequence[str], gin_bindings: Sequence[str]):
  """The launch's `Distributed` settings, validated.

  gin parses the (already checked) files here too, skipping every configurable
  but `Distributed`, which harness/settings.py registers without TensorFlow.
  """
  gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings), skip_unknown=True)
  return settings_lib.Distributed().validate()


def _quiet_ray() -> None:
  """Keeps Ray's own lines off the terminal: the launch prints its own.

  `log_to_driver=False` keeps the actors' output away, but Ray 2.40 still
  prints worker-death notices from its error channel straight to stdout, with
  no setting to turn that off; they go to our log at DEBUG level instead (the
  launch reports restarts itself, from the jobs' files).
  """
  import ray._private.worker as ray_worker  # pylint: disable=g-import-not-at-top

  def to_debug_log(data: Dict[str, Any], ignore_prefix: bool = False) -> None:
    del ignore_prefix
    for line in data.get('lines', []):
      logging.debug('ray (%s): %s', data.get('pid'), line)

  if hasattr(ray_worker, 'print_to_stdstream'):
    ray_worker.print_to_stdstream = to_debug_log


def start_ray(ray_address: Optional[str]) -> None:
  """Starts embedded Ray (localhost, no dashboard) or connects to a cluster."""
  import ray  # pylint: disable=g-import-not-at-top
  options = dict(include_dashboard=False, log_to_driver=False,
                 logging_level=std_logging.WARNING)
  try:
    if ray_address is None:
      # RAY_ADDRESS would win over address='local' and join some other cluster.
      os.environ.pop('RAY_ADDRESS', None)
      ray.init(address='local', _node_ip_address='127.0.0.1', **options)
    else:
      ray.init(address=ray_address, **options)
  except ConnectionError as e:
    raise UsageError(f'cannot connect to the Ray cluster at --ray_address={ray_address} '
                     f'({errors.first_line(e)}): start it with `ray start --head`, or drop '
                     '--ray_address to run on this machine') from e
  _quiet_ray()


def check_resources(settings, num_collectors: int, eval_job: bool, embedded: bool) -> None:
  """Refuses (embedded) or warns about (cluster) jobs that ask Ray for more than it has."""
  import ray  # pylint: disable=g-import-not-at-top
  need = actors.required_resources(settings, num_collectors, eval_job)
  have = ray.cluster_resources()
  for name, needed in need.items():
    if needed <= have.get(name, 0.0) + 1e-9:
      continue
    message = (f'the jobs ask Ray for {needed:g} {name}s (Distributed.replay_cpus, '
               'collector_cpus x --num_collectors, learner_cpus, eval_cpus, learner_gpus) '
               f'but Ray has {have.get(name, 0.0):g}')
    if embedded:
      raise UsageError(f'{message}: lower those settings or --num_collectors')
    logging.warning('%s: %s; the jobs wait until the cluster has room', _PROGRAM, message)


class _Progress:
  """Our lines on the terminal: job (re)starts from ROOT/jobs/, rows of metrics.csv."""

  def __init__(self, root_dir: str, names: Sequence[str], launch_id: str):
    self._root, self._names, self._launch_id = root_dir, names, launch_id
    self._seen: Dict[str, tuple] = {}
    self._rows = len(self._metrics_rows())  # an earlier launch's rows are not news

  def poll(self) -> None:
    for name in self._names:
      record = actors.read_record(self._root, name)
      if not record:
        continue
      key = (record.get('pid'), record.get('restarts'), record.get('started'))
      if self._seen.get(name) != key and record.get('launch') == self._launch_id:
        self._seen[name] = key
        where = f' serving {record["address"]}' if 'address' in record else ''
        again = f' (restart {record["restarts"]})' if record.get('restarts') else ''
        logging.info('%s: %s pid %s on %s%s%s', _PROGRAM, name, record.get('pid'),
                     record.get('host'), where, again)
    self._poll_metrics()

  def _metrics_rows(self) -> List[Dict[str, str]]:
    try:
      with open(os.path.join(self._root, 'metrics.csv'), newline='') as f:
        return list(csv.DictReader(f))
    except OSError:
      return []

  def _poll_metrics(self) -> None:
    rows = self._metrics_rows()
    if len(rows) < self._rows:  # rewritten by a resuming learner
      self._rows = len(rows)
    for row in rows[self._rows:]:
      logging.info('%s: env_steps %s  train_step %s  %s steps/s  loss %s  avg_return %s',
                   _PROGRAM, row.get('env_steps'), row.get('train_step'),
                   row.get('steps_per_sec'), row.get('loss'), row.get('avg_return'))
    self._rows = len(rows)


def _cause(error: BaseException) -> BaseException:
  """The job's own exception inside Ray's wrapper."""
  return getattr(error, 'cause', None) or error


class Launch:
  """The actors of one launch, from start to a clean stop."""

  def __init__(self, spec: actors.JobSpec, settings, num_collectors: int, eval_job: bool,
               signals: _Signals, embedded: bool):
    self._spec, self._settings, self._embedded = spec, settings, embedded
    self._num_collectors, self._eval_job = num_collectors, eval_job
    self._signals = signals
    self._names = actors.names(num_collectors, eval_job)
    self._progress = _Progress(spec.root_dir, self._names, spec.launch_id)
    self._handles: Dict[str, Any] = {}
    self._calls: Dict[Any, str] = {}  # running calls (ObjectRef -> job name)
    self._learner_run = None

  def run(self) -> int:
    """Starts the jobs, waits for the learner, stops everything; returns the exit status."""
    # Every actor is created (and loads TensorFlow) at once; none writes to
    # ROOT before its `run`/`serve` call, made once the learner has opened
    # ROOT, so a refused resume leaves ROOT as it was.
    learner = self._start('learner-0', actors.LearnerJob, self._spec)
    port = self._settings.replay_port or (_free_port() if self._embedded else 0)
    replay = self._start('replay-0', actors.ReplayJob, self._spec, port)
    workers = {}
    for i in range(self._num_collectors):
      name = actors.job_name(actors.COLLECTOR, i)
      workers[name] = self._start(name, actors.CollectorJob, self._spec, i)
    if self._eval_job:
      workers['eval-0'] = self._start('eval-0', actors.EvalJob, self._spec)
    if not (self._wait(learner.check.remote(), 'learner-0')
            and self._wait(replay.address.remote(), 'replay-0')):
      return self._stop_all(self._signals.exit_code)
    self._calls[replay.serve.remote()] = 'replay-0'
    self._learner_run = learner.run.remote(replay)
    self._calls[self._learner_run] = 'learner-0'
    for name, worker in workers.items():
      self._calls[worker.run.remote(replay)] = name
    logging.info('%s: %d jobs running; their logs are in %s', _PROGRAM, len(self._handles),
                 os.path.join(self._spec.root_dir, 'logs'))
    return self._watch()

  def _start(self, name: str, cls: type, *args):
    handle = actors.remote_class(cls, self._settings, self._num_collectors).remote(*args)
    self._handles[name] = handle
    return handle

  def _wait(self, ref, name: str) -> bool:
    """Waits for one start-up call; False when a signal came first.

    A `UsageError` of the job (a refused resume) passes through as bad input.
    """
    import ray  # pylint: disable=g-import-not-at-top
    while not ray.wait([ref], timeout=_POLL_S)[0]:
      if self._signals.signum:
        return False
    try:
      ray.get(ref)
    except Exception as e:  # pylint: disable=broad-except
      cause = _cause(e)
      if isinstance(cause, UsageError):
        raise UsageError(errors.first_line(cause)) from e
      raise _JobFailed(name, cause) from e
    return True

  def _watch(self) -> int:
    """Waits for the learner's target, a failed job or a signal."""
    import ray  # pylint: disable=g-import-not-at-top
    failed: List[str] = []
    while True:
      ready, _ = ray.wait(list(self._calls), num_returns=1, timeout=_POLL_S)
      self._progress.poll()
      if self._signals.signum:
        return self._stop_all(self._signals.exit_code)
      for ref in ready:
        name = self._calls.pop(ref)
        try:
          result = ray.get(ref)
        except Exception as e:  # pylint: disable=broad-except  (the job failed for good)
          self._report_failure(name, _cause(e))
          failed.append(name)
          continue
        if ref is self._learner_run:
          logging.info('%s: the learner reached its target; stopping the other jobs', _PROGRAM)
          if not self._finish_eval():
            failed.append(actors.job_name(actors.EVAL))
          self._stop_all(0)
          return 1 if failed else 0
        if name.startswith(actors.REPLAY):
          self._report_failure(name, RuntimeError('the replay server stopped'))
          failed.append(name)
      if failed:
        self._stop_all(1)
        return 1

  def _report_failure(self, name: str, error: BaseException) -> None:
    print(f'{_PROGRAM}: error: job {name} failed ({type(error).__name__}: '
          f'{errors.first_line(error)}); see {actors.log_path(self._spec.root_dir, name)}',
          file=sys.stderr, flush=True)

  def _finish_eval(self) -> bool:
    """Gives the eval job time for its evaluation at the target; False if it failed.

    Collectors are not waited for: the rate limiter holds their inserts once
    the learner stops sampling, so most never see the final count.
    """
    import ray  # pylint: disable=g-import-not-at-top
    refs = [ref for ref, name in self._calls.items() if name.startswith(actors.EVAL)]
    deadline = time.time() + self._settings.eval_job_interval_seconds + _EVAL_FINISH_S
    while refs and time.time() < deadline and not self._signals.signum:
      if ray.wait(refs, timeout=_POLL_S)[0]:
        self._calls.pop(refs[0])
        try:
          ray.get(refs[0])
        except Exception as e:  # pylint: disable=broad-except
          self._report_failure(actors.job_name(actors.EVAL), _cause(e))
          return False
        return True
      self._progress.poll()
    return True

  def _stop_all(self, exit_code: int) -> int:
    """Stops the learner cleanly (it checkpoints), then every other job.

    Returns `exit_code`, or 1 when the learner could not stop cleanly.
    """
    import ray  # pylint: disable=g-import-not-at-top
    code = exit_code
    learner = self._handles.get('learner-0')
    if self._learner_run is not None and self._learner_run in self._calls:
      reason = (signal.Signals(self._signals.signum).name if self._signals.signum
                else 'a failed job')
      logging.info('%s: asking the learner to write a checkpoint and stop (%s)', _PROGRAM,
                   reason)
      learner.stop.remote(f'{_PROGRAM} ({reason})', exit_code or 1)
      code = self._wait_for_learner(exit_code)
    for name in reversed(list(self._handles)):
      if name == 'replay-0':
        try:
          ray.get(self._handles[name].stop.remote(), timeout=10)
        except Exception:  # pylint: disable=broad-except  (killed below anyway)
          pass
      ray.kill(self._handles[name], no_restart=True)
    self._progress.poll()
    return code

  def _wait_for_learner(self, exit_code: int) -> int:
    import ray  # pylint: disable=g-import-not-at-top
    signals_before = self._signals.count
    deadline = time.time() + _LEARNER_STOP_GRACE_S
    while time.time() < deadline and self._signals.count == signals_before:
      if ray.wait([self._learner_run], timeout=_POLL_S)[0]:
        break
      self._progress.poll()
    else:
      why = ('a second signal' if self._signals.count != signals_before
             else f'no checkpoint after {_LEARNER_STOP_GRACE_S:.0f} s')
      logging.error('%s: %s: stopping the learner without waiting for its checkpoint',
                    _PROGRAM, why)
      return 1
    try:
      result = ray.get(self._learner_run)
    except Exception as e:  # pylint: disable=broad-except
      self._report_failure('learner-0', _cause(e))
      return 1
    finally:
      self._calls.pop(self._learner_run, None)
    if result.get('status') == 'stopped':
      logging.info('%s: %s', _PROGRAM, result.get('message'))
      return exit_code
    return exit_code if self._signals.signum else 0


class LaunchError(Exception):
  """The launch could not go on (exit status 1, one line on stderr)."""


class _JobFailed(LaunchError):
  """A job failed while starting."""

  def __init__(self, name: str, cause: BaseException):
    super().__init__(f'job {name} failed to start ({type(cause).__name__}: '
                     f'{errors.first_line(cause)})')


def _free_port() -> int:
  """A free port on this machine for an embedded launch's replay server."""
  import portpicker  # pylint: disable=g-import-not-at-top
  return portpicker.pick_unused_port()


def _ray_processes() -> List[psutil.Process]:
  """This process's children and their children: Ray's processes and the jobs' workers."""
  try:
    return psutil.Process().children(recursive=True)
  except psutil.Error:
    return []


def _wait_for_exit(processes: Sequence[psutil.Process]) -> None:
  """Waits until Ray's processes of an embedded launch have exited.

  `ray.shutdown()` returns while some are still on their way out (seen: the
  autoscaler monitor); the launch ends only when nothing of it runs. Any left
  after `_RAY_EXIT_WAIT_S` is killed, and named in the log.
  """
  _, alive = psutil.wait_procs(processes, timeout=_RAY_EXIT_WAIT_S)
  for process in alive:
    try:
      logging.warning('%s: killing %s (pid %d), left running by Ray', _PROGRAM,
                      process.name(), process.pid)
      process.kill()
    except psutil.Error:
      pass
  psutil.wait_procs(alive, timeout=5)


def main(argv: List[str]) -> int:
  if len(argv) > 1:
    raise UsageError(f'unexpected arguments {argv[1:]}: use --flag=value forms')
  check_flags(_NUM_COLLECTORS.value, _RAY_ADDRESS.value)
  verbose = _verbose()
  if _ROOT_DIR.value is None:
    raise UsageError('--root_dir is required: e.g. --root_dir=runs/dist')
  signals = _Signals()
  signals.install()
  try:
    check_config(_ROOT_DIR.value, _GIN_FILE.value, _GIN_BINDINGS.value, verbose)
  finally:
    if signals.signum:  # Ctrl-C while checking (the check got it too): nothing started yet
      return signals.exit_code  # pylint: disable=lost-exception
  gin_files = tuple(os.path.abspath(f) for f in _GIN_FILE.value)
  bindings = tuple(_GIN_BINDINGS.value) + (
      ('Distributed.eval_in_learner=False',) if _EVAL_JOB.value else ())
  settings = read_distributed(gin_files, bindings)
  spec = actors.JobSpec(root_dir=os.path.abspath(_ROOT_DIR.value), gin_files=gin_files,
                        gin_bindings=bindings, launch_id=uuid.uuid4().hex[:12], verbose=verbose)
  embedded = _RAY_ADDRESS.value is None
  import ray  # pylint: disable=g-import-not-at-top
  start_ray(_RAY_ADDRESS.value)
  signals.install()  # again: ray.init installs a SIGTERM handler of its own
  try:
    logging.info('%s: Ray %s (%s); run directory %s', _PROGRAM,
                 'embedded on this machine' if embedded else f'cluster at {_RAY_ADDRESS.value}',
                 ', '.join(f'{v:g} {k}' for k, v in sorted(ray.cluster_resources().items())
                           if k in ('CPU', 'GPU')), spec.root_dir)
    check_resources(settings, _NUM_COLLECTORS.value, _EVAL_JOB.value, embedded)
    code = Launch(spec, settings, _NUM_COLLECTORS.value, _EVAL_JOB.value, signals,
                  embedded).run()
  finally:
    processes = _ray_processes() if embedded else []
    ray.shutdown()  # embedded: stops Ray and every job; a cluster: disconnects only
    _wait_for_exit(processes)
  logging.info('%s: exit status %d', _PROGRAM, code)
  return code


def _verbose() -> bool:
  return logging.get_verbosity() >= logging.DEBUG


def _main_with_clean_errors(argv: List[str]) -> None:
  errors.log_to_stdout()
  try:
    code = main(argv)
  except UsageError as e:
    errors.report(_PROGRAM, e, _verbose())
    sys.exit(UsageError.exit_code)
  except LaunchError as e:
    errors.report(_PROGRAM, e, _verbose())
    sys.exit(1)
  sys.exit(code)


def _parse_flags(argv: List[str]) -> List[str]:
  """absl's flag parsing, with a bad flag reported as one line and status 2."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f'{_PROGRAM}: error: {e}; see {_PROGRAM} --helpfull', file=sys.stderr)
    sys.exit(UsageError.exit_code)


def run() -> None:
  """Console-script entry point."""
  app.run(_main_with_clean_errors, flags_parser=_parse_flags)


if __name__ == '__main__':
  run()
