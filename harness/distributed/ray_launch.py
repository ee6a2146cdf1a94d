"""One distributed run on Ray: the jobs' actors from their start to a clean stop.

`Launch.run` creates the actors (harness/distributed/actors.py), lets the learner open
ROOT first, starts every job's long-running call and waits: for the learner's
target (exit status 0), for a job that fails for good (1), or for SIGINT or
SIGTERM (130, 143), after which it asks the learner for a checkpoint and
stops every job. Ray does the restarting; this module only watches the calls
and reports, from the jobs' files, what happened.
"""

from __future__ import annotations

import csv
import os
import signal
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from absl import logging
import portpicker

from harness.base import errors
from harness.base.errors import UsageError
from harness.distributed import actors

PROGRAM = 'harness-launch'
_POLL_S = 1.0
# How long the learner may take to finish its iteration and write the
# checkpoint after a stop request (a second signal stops at once).
_LEARNER_STOP_GRACE_S = 300.0
# After the learner's target, the eval job's last evaluation may take this long
# (on top of Distributed.eval_job_interval_seconds).
_EVAL_FINISH_S = 120.0


class Signals:
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
    logging.info('%s: received %s%s', PROGRAM, signal.Signals(signum).name,
                 '' if self.count == 1 else ' again: stopping at once')

  @property
  def exit_code(self) -> int:
    return 128 + (self.signum or 0)


class Progress:
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
        logging.info('%s: %s pid %s on %s%s%s', PROGRAM, name, record.get('pid'),
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
                   PROGRAM, row.get('env_steps'), row.get('train_step'),
                   row.get('steps_per_sec'), row.get('loss'), row.get('avg_return'))
    self._rows = len(rows)


def cause(error: BaseException) -> BaseException:
  """The job's own exception inside Ray's wrapper."""
  return getattr(error, 'cause', None) or error


class Launch:
  """The actors of one launch, from start to a clean stop."""

  def __init__(self, spec: actors.JobSpec, settings, num_collectors: int, eval_job: bool,
               signals: Signals, embedded: bool):
    self._spec, self._settings, self._embedded = spec, settings, embedded
    self._num_collectors, self._eval_job = num_collectors, eval_job
    self._signals = signals
    self._names = actors.names(num_collectors, eval_job)
    self._progress = Progress(spec.root_dir, self._names, spec.launch_id)
    self._handles: Dict[str, Any] = {}
    self._calls: Dict[Any, str] = {}  # running calls (ObjectRef -> job name)
    self._learner_run = None

  def run(self) -> int:
    """Starts the jobs, waits for the learner, stops everything; returns the exit status."""
    # Every actor is created (and loads TensorFlow) at once; none writes to
    # ROOT before its `run`/`serve` call, made once the learner has opened
    # ROOT, so a refused resume leaves ROOT as it was.
    learner = self._start('learner-0', actors.LearnerJob, self._spec)
    port = self._settings.replay_port or (free_port() if self._embedded else 0)
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
    logging.info('%s: %d jobs running; their logs are in %s', PROGRAM, len(self._handles),
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
      error = cause(e)
      if isinstance(error, UsageError):
        raise UsageError(errors.first_line(error)) from e
      raise JobFailed(name, error) from e
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
          ray.get(ref)
        except Exception as e:  # pylint: disable=broad-except  (the job failed for good)
          self._report_failure(name, cause(e))
          failed.append(name)
          continue
        if ref is self._learner_run:
          logging.info('%s: the learner reached its target; stopping the other jobs', PROGRAM)
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
    print(f'{PROGRAM}: error: job {name} failed ({type(error).__name__}: '
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
          self._report_failure(actors.job_name(actors.EVAL), cause(e))
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
      logging.info('%s: asking the learner to write a checkpoint and stop (%s)', PROGRAM,
                   reason)
      learner.stop.remote(f'{PROGRAM} ({reason})', exit_code or 1)
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
                    PROGRAM, why)
      return 1
    try:
      result = ray.get(self._learner_run)
    except Exception as e:  # pylint: disable=broad-except
      self._report_failure('learner-0', cause(e))
      return 1
    finally:
      self._calls.pop(self._learner_run, None)
    if result.get('status') == 'stopped':
      logging.info('%s: %s', PROGRAM, result.get('message'))
      return exit_code
    return exit_code if self._signals.signum else 0


class LaunchError(Exception):
  """The launch could not go on (exit status 1, one line on stderr)."""


class JobFailed(LaunchError):
  """A job failed while starting."""

  def __init__(self, name: str, cause: BaseException):
    super().__init__(f'job {name} failed to start ({type(cause).__name__}: '
                     f'{errors.first_line(cause)})')


def free_port() -> int:
  """A free port on this machine for an embedded launch's replay server."""
  return portpicker.pick_unused_port()
