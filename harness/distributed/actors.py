"""The jobs of a distributed run as Ray actors: replay server, collectors, learner, eval job.

`harness-launch` creates one actor per job. Each runs in a Ray worker process
of its own, parses the same gin files and bindings there, and runs the job
code of `harness/distributed/jobs.py` in that process (no `harness-train` child).
Ray restarts an actor whose process dies (`max_restarts`) and calls its
pending `run` again (`max_task_retries`); a restarted learner resumes from its
last checkpoint, a restarted replay server from its paired Reverb checkpoint.

Jobs find the replay server through its actor (`ReplayJob.address`, asked
again on every reconnect), so no one types an address. Each job writes
`ROOT/jobs/<job>-<id>.json` (pid, host, started, restarts) on every (re)start
and logs to `ROOT/logs/<job>-<id>.log`.

Only Ray and light modules are imported at the top: the launcher imports this
module to create the actors, and TensorFlow is loaded in the actors only.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import socket
import sys
import threading
import time
import warnings
from typing import Any, Dict, Optional, Sequence, Tuple

from absl import flags
from absl import logging
import ray

REPLAY, COLLECTOR, LEARNER, EVAL = 'replay', 'collector', 'learner', 'eval'
# How long a job waits for the replay actor to say where its server is; a
# restarting actor answers once it is back (the job's reconnect path retries).
_LOOKUP_TIMEOUT_S = 10.0
# A job still on the address of a server that has since moved is stuck (see
# `_ReplayFinder.watch`) once it has not followed for this long.
_MOVED_GRACE_S = 30.0
_WATCH_INTERVAL_S = 5.0
# Exit status of a job that leaves so that Ray restarts it (EX_TEMPFAIL).
_EXIT_FOR_RESTART = 75


@dataclasses.dataclass(frozen=True)
class JobSpec:
  """What every job of one launch is started with.

  Attributes:
    root_dir: the run directory (absolute: workers start elsewhere).
    gin_files: gin files, absolute paths, parsed in every job's process.
    gin_bindings: the bindings, applied after the files.
    launch_id: tells this launch's job files from an earlier launch's.
    verbose: log at DEBUG level.
  """
  root_dir: str
  gin_files: Tuple[str, ...]
  gin_bindings: Tuple[str, ...]
  launch_id: str
  verbose: bool = False


def job_name(kind: str, index: int = 0) -> str:
  """`replay-0`, `collector-1`, `learner-0`, `eval-0`: the name of its json and log files."""
  return f'{kind}-{index}'


def record_path(root_dir: str, name: str) -> str:
  return os.path.join(root_dir, 'jobs', f'{name}.json')


def log_path(root_dir: str, name: str) -> str:
  return os.path.join(root_dir, 'logs', f'{name}.log')


def read_record(root_dir: str, name: str) -> Optional[Dict[str, Any]]:
  """A job's json file, or None when it is missing or torn."""
  try:
    with open(record_path(root_dir, name)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def _write_json(path: str, record: Dict[str, Any]) -> None:
  """Writes `record` to `path` atomically (temporary file + rename)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f'{path}.{os.getpid()}.tmp'
  with open(tmp, 'w') as f:
    json.dump(record, f, indent=2)
    f.write('\n')
  os.replace(tmp, path)


class _JobLog:
  """The job's log file: absl lines and whatever the process writes to stdout
  or stderr (TensorFlow's and Reverb's C++ logs), appended across restarts.

  Until `open` the absl lines are held in memory, so a learner that refuses
  a resume has written nothing to ROOT.
  """

  def __init__(self, verbose: bool):
    # No absl flags are parsed in a worker: say so, or absl warns on stderr.
    flags.FLAGS.mark_as_parsed()
    logging.use_absl_handler()
    logging.set_verbosity(logging.DEBUG if verbose else logging.INFO)
    self._handler = logging.get_absl_handler().python_handler
    self._held = io.StringIO()
    self._handler.stream = self._held

  def open(self, path: str, header: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    log = open(path, 'a', buffering=1)  # pylint: disable=consider-using-with  (the process's)
    log.write(f'\n=== {time.strftime("%Y-%m-%d %H:%M:%S")} {header}\n{self._held.getvalue()}')
    log.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    self._handler.stream = log


def _configure(spec: JobSpec, job: str, collector_id: int = 0):
  """Parses the gin files and bindings in this process; returns (RunConfig, Distributed).

  The input was checked by `harness-launch` before any job started; the same
  checks run here again, as in every job.
  """
  import harness  # pylint: disable=g-import-not-at-top  (quiet TF start-up before TF loads)
  from harness.run import experiment  # pylint: disable=g-import-not-at-top
  from harness.base import memory  # pylint: disable=g-import-not-at-top
  from harness.run import parts  # pylint: disable=g-import-not-at-top
  from harness.run import settings  # pylint: disable=g-import-not-at-top
  from harness.base import threads  # pylint: disable=g-import-not-at-top
  harness.quiet_tensorflow_logs()
  experiment.parse_gin(spec.gin_files, spec.gin_bindings)
  cfg = experiment.settings_from_gin(root_dir=spec.root_dir, job=job, replay_address=None,
                                     collector_id=collector_id).validate()
  # Both before TensorFlow runs an op: it picks its CPU allocator (tf_cpu_pool) and
  # sizes its thread pools once.
  memory.configure_allocator()
  threads.configure_threads()
  parts.seed_everything(cfg.seed)
  return cfg, settings.Distributed()


def _reconstructed() -> bool:
  """Whether Ray restarted this actor (its process had died)."""
  with warnings.catch_warnings():
    # Ray 2.40 warns about its own use of a deprecated property in here.
    warnings.simplefilter('ignore')
    return ray.get_runtime_context().was_current_actor_reconstructed


def _start_record(spec: JobSpec, name: str, **extra: Any) -> Dict[str, Any]:
  """Writes this job's json for this (re)start and returns it.

  `restarts` counts Ray's restarts of this launch's actor: one more than the
  previous file's when Ray reconstructed the actor, 0 on a job's first start.
  """
  previous = read_record(spec.root_dir, name)
  restarted = (_reconstructed() and previous and previous.get('launch') == spec.launch_id)
  record = {
      'job': name, 'pid': os.getpid(), 'host': socket.gethostname(),
      'node_ip': ray.util.get_node_ip_address(),
      'started': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
      'restarts': int(previous.get('restarts', 0)) + 1 if restarted else 0,
      'launch': spec.launch_id, 'log': log_path(spec.root_dir, name), **extra,
  }
  _write_json(record_path(spec.root_dir, name), record)
  logging.info('Job %s started: pid %d on %s (restart %d)', name, record['pid'], record['host'],
               record['restarts'])
  return record


class _ReplayFinder:
  """Finds the replay server through its actor, for the jobs' reconnect path.

  Reverb's clients retry the one address they were made with: a collector
  flushing or a learner sampling when the server comes back on another port
  or node waits for ever and never reaches the reconnect path (seen with
  Reverb 0.14). `watch` notices such a job and ends its process, so that Ray
  restarts it, and the restarted job finds the server anew. Our own code,
  because Ray cannot see inside a blocked Reverb call.
  """

  def __init__(self, replay: 'ray.actor.ActorHandle', name: str, root_dir: str):
    self._replay, self._name = replay, name
    self._replay_log = log_path(root_dir, job_name(REPLAY))
    self.current: Optional[str] = None

  def find(self) -> str:
    self.current = ray.get(self._replay.address.remote(), timeout=_LOOKUP_TIMEOUT_S)
    return self.current

  def locator(self):
    from harness.distributed import jobs  # pylint: disable=g-import-not-at-top
    return jobs.ReplayLocator(
        self.find, f'the replay job did not come back (see {self._replay_log})')

  def watch(self) -> None:
    """Starts a daemon thread that ends this process when it is stuck on a moved server."""
    threading.Thread(target=self._watch, name='replay-watch', daemon=True).start()

  def _watch(self) -> None:
    moved_since = None
    while True:
      time.sleep(_WATCH_INTERVAL_S)
      try:
        address = ray.get(self._replay.address.remote(), timeout=_LOOKUP_TIMEOUT_S)
      except Exception:  # pylint: disable=broad-except  (restarting: the job waits for it)
        continue
      if self.current is None or address == self.current:
        moved_since = None
        continue
      moved_since = moved_since or time.time()
      if time.time() - moved_since > _MOVED_GRACE_S:
        logging.error('%s: the replay server moved from %s to %s and this job still waits on '
                      'the old address: exiting so that Ray restarts it', self._name,
                      self.current, address)
        logging.flush()
        os._exit(_EXIT_FOR_RESTART)  # pylint: disable=protected-access


class _Job:
  """A job's actor: gin parsed in `__init__`, where nothing is written to ROOT.

  Its long-running call starts with `_started`, which opens the log and writes
  the json; the launcher makes those calls only once the learner has opened
  ROOT, so a refused resume leaves ROOT as it was, although every actor was
  created (and loaded TensorFlow) at the same time.
  """
  kind = ''

  def __init__(self, spec: JobSpec, job: str, index: int = 0):
    self._spec = spec
    self._name = job_name(self.kind, index)
    self._log = _JobLog(spec.verbose)
    self._cfg, self._settings = _configure(spec, job, index)

  def _started(self, **extra: Any) -> None:
    self._log.open(log_path(self._spec.root_dir, self._name), f'{self._name} starting')
    _start_record(self._spec, self._name, **extra)

  def _finder(self, replay: 'ray.actor.ActorHandle') -> '_ReplayFinder':
    finder = _ReplayFinder(replay, self._name, self._spec.root_dir)
    finder.watch()
    return finder


class ReplayJob(_Job):
  """The replay server: the replay table and the variables table, in this actor's process.

  A threaded actor: `serve` holds one thread until `stop` while `address`
  answers the other jobs.
  """
  kind = REPLAY

  def __init__(self, spec: JobSpec, port: int):
    """Starts the server on `port` (0: a free one); a restart prefers the port it had."""
    super().__init__(spec, REPLAY)
    from harness.distributed import jobs  # pylint: disable=g-import-not-at-top
    previous = read_record(spec.root_dir, self._name)
    if (_reconstructed() and previous and previous.get('launch') == spec.launch_id
        and previous.get('node_ip') == ray.util.get_node_ip_address()):
      # Reverb's clients reconnect by themselves to a server back on the same port.
      port = int(previous['address'].rsplit(':', 1)[1])
    try:
      self._server = jobs.start_replay(self._cfg, self._settings, port)
    except ValueError as e:  # Reverb: "Failed to BuildAndStart gRPC server"
      if not port:
        raise
      logging.warning('Port %d is taken (%s): serving on a free port', port, e)
      self._server = jobs.start_replay(self._cfg, self._settings, 0)
    self._address = f'{ray.util.get_node_ip_address()}:{self._server.port}'
    self._stopped = threading.Event()

  def address(self) -> str:
    """`host:port` of the server, for the other jobs."""
    return self._address

  def serve(self) -> None:
    """Returns when `stop` is called (the launcher watches it to see the job fail)."""
    self._started(address=self._address)
    self._stopped.wait()

  def stop(self) -> None:
    logging.info('Replay server stopping')
    self._server.stop()
    self._stopped.set()


class CollectorJob(_Job):
  """One collector: steps its envs, inserts into the replay table, pulls weights."""
  kind = COLLECTOR

  def __init__(self, spec: JobSpec, collector_id: int):
    super().__init__(spec, 'collect', collector_id)
    self._id = collector_id

  def run(self, replay: 'ray.actor.ActorHandle') -> str:
    """Collects until the learner's pushed env-step count reaches the target."""
    from harness.distributed import jobs  # pylint: disable=g-import-not-at-top
    self._started()
    jobs.run_collector(self._cfg, self._settings, self._finder(replay).locator(),
                              self._id)
    return 'done'


class EvalJob(_Job):
  """The eval job: evaluates the newest pushed weights, writes eval.csv."""
  kind = EVAL

  def __init__(self, spec: JobSpec):
    super().__init__(spec, 'eval')

  def run(self, replay: 'ray.actor.ActorHandle') -> str:
    from harness.distributed import jobs  # pylint: disable=g-import-not-at-top
    self._started()
    jobs.run_evaluator(self._cfg, self._settings, self._finder(replay).locator())
    return 'done'


class LearnerJob(_Job):
  """The learner. A threaded actor: `stop` is answered while `run` trains.

  `check` opens ROOT (a refused resume raises `UsageError`) before the
  launcher lets any job write there.
  """
  kind = LEARNER

  def __init__(self, spec: JobSpec):
    super().__init__(spec, 'learn')
    self._start = None

  def check(self) -> None:
    """Builds the agent and opens ROOT: refuses a bad resume, writes nothing."""
    from harness.distributed import jobs  # pylint: disable=g-import-not-at-top
    self._start = jobs.open_learner(self._cfg)

  def run(self, replay: 'ray.actor.ActorHandle') -> Dict[str, Any]:
    """Trains until the target or a stop request: {'status': 'done'} or
    {'status': 'stopped', 'exit_code': ..., 'message': ...} after a checkpoint.

    Ray calls it again in a restarted actor, which resumes from the checkpoint.
    """
    from harness.distributed import jobs  # pylint: disable=g-import-not-at-top
    from harness.base import shutdown  # pylint: disable=g-import-not-at-top
    start, self._start = self._start, None
    if start is None:  # a restarted actor: open ROOT (and check the resume) again
      start = jobs.open_learner(self._cfg)
    self._started()
    try:
      jobs.run_learner(self._cfg, self._settings, self._finder(replay).locator(), start)
    except shutdown.Stopped as e:
      return {'status': 'stopped', 'exit_code': e.exit_code, 'message': str(e)}
    return {'status': 'done'}

  def stop(self, reason: str, exit_code: int) -> None:
    """Asks `run` to checkpoint and return after its current iteration."""
    from harness.base import shutdown  # pylint: disable=g-import-not-at-top
    logging.info('Stop requested: %s', reason)
    shutdown.current().request(reason, exit_code)


def remote_class(cls: type, settings: Any, num_collectors: int) -> Any:
  """`cls` as a Ray actor class with its job's resources and restart policy.

  `settings` is the launch's `Distributed`. Every job is restarted by Ray when
  its process dies, and its pending call is made again in the new process.
  """
  cpus = {ReplayJob: settings.replay_cpus, CollectorJob: settings.collector_cpus,
          LearnerJob: settings.learner_cpus, EvalJob: settings.eval_cpus}[cls]
  options: Dict[str, Any] = dict(num_cpus=cpus, max_restarts=settings.max_restarts,
                                 max_task_retries=-1)
  if cls is LearnerJob:
    options.update(num_gpus=settings.learner_gpus, max_concurrency=4)
  if cls is ReplayJob:
    # `serve` holds one thread; every other job asks `address` now and then.
    options.update(max_concurrency=num_collectors + 8)
  return ray.remote(**options)(cls)


def required_resources(settings: Any, num_collectors: int, eval_job: bool) -> Dict[str, float]:
  """The CPUs and GPUs that the launch's actors ask Ray for, together."""
  cpus = (settings.replay_cpus + settings.learner_cpus + num_collectors * settings.collector_cpus
          + (settings.eval_cpus if eval_job else 0.0))
  return {'CPU': cpus, 'GPU': float(settings.learner_gpus)}


def names(num_collectors: int, eval_job: bool) -> Sequence[str]:
  """The names of a launch's jobs."""
  return ([job_name(REPLAY), job_name(LEARNER)]
          + [job_name(COLLECTOR, i) for i in range(num_collectors)]
          + ([job_name(EVAL)] if eval_job else []))
