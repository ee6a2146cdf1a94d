"""Starting and stopping Ray the way both `harness-sweep` and `harness-launch` want it.

Embedded Ray (no `--ray_address`) listens on 127.0.0.1 only and has no
dashboard: a sweep or launch on a laptop opens nothing to the network. With an
address the same code joins an existing cluster, and stopping only disconnects.
Ray's own lines stay off the user's terminal; the commands print their own.

No TensorFlow here: the drivers never import the training code.
"""

from __future__ import annotations

import contextlib
import gc
import logging as std_logging
import os
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence

from absl import logging
import psutil

from harness.base import errors
from harness.base.errors import UsageError

# ray.shutdown() returns before all of its processes have exited: Ray's own
# get RAY_GRACE_S, ours (the trials' harness-train, which checkpoint on the
# SIGTERM their dying worker sends) EXIT_WAIT_S.
RAY_GRACE_S = 3.0
EXIT_WAIT_S = 30.0


def quiet_environment() -> None:
  """Before Ray is imported: no progress tables, result files or usage stats;
  idle Ray workers go sooner."""
  os.environ.setdefault('RAY_AIR_NEW_OUTPUT', '0')  # verbose=0 is silent only in the old output
  os.environ.setdefault('TUNE_DISABLE_AUTO_CALLBACK_LOGGERS', '1')  # Tune's json/csv/tb files
  os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
  os.environ.setdefault('TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S', '1000')
  # Ray's processes wait 5 s for the GCS by default; on a machine at load
  # average 50 ray.init timed out getting the cluster id and segfaulted.
  os.environ.setdefault('RAY_gcs_rpc_server_connect_timeout_s', '60')
  # The workers Ray prestarts run Tune's placement-group checks but never host a
  # trial (the trials' actors get workers of their own); Ray keeps them for 1 s
  # after they fall idle, which is when the trials' workers import Tune: all
  # four together were the sweep's peak RSS (986 to 1,016 MiB in 4 runs; with
  # 0.1 s, 876 to 915 MiB in 3; docs/performance.md).
  os.environ.setdefault('RAY_idle_worker_killing_time_threshold_ms', '100')


def route_library_logs(handler: std_logging.Handler,
                       names: Sequence[str] = ('ray', 'optuna')) -> None:
  """The Python log records of these libraries go to `handler`, not the terminal."""
  for name in names:
    logger = std_logging.getLogger(name)
    for old in list(logger.handlers):
      logger.removeHandler(old)
    logger.addHandler(handler)
    logger.propagate = False


class ToAbslLog(std_logging.Handler):
  """Forwards a library's log records to our log: warnings and errors as they
  are, the rest at DEBUG (seen with --verbosity=1)."""

  def emit(self, record: std_logging.LogRecord) -> None:
    level = logging.WARNING if record.levelno >= std_logging.WARNING else logging.DEBUG
    logging.log(level, '%s: %s', record.name, record.getMessage())


def start(address: Optional[str], num_cpus: Optional[int] = None) -> None:
  """Starts embedded Ray on localhost (`address` None) or joins the cluster at
  `address` (`auto` or host:port); an unreachable cluster is a `UsageError`."""
  quiet_environment()
  import ray  # pylint: disable=g-import-not-at-top
  options: Dict[str, Any] = dict(include_dashboard=False, log_to_driver=False,
                                 configure_logging=False)
  try:
    if address is None:
      # RAY_ADDRESS would win over address='local' and join some other cluster.
      os.environ.pop('RAY_ADDRESS', None)
      with _no_idle_helpers():
        ray.init(address='local', num_cpus=num_cpus, _node_ip_address='127.0.0.1', **options)
    else:
      ray.init(address=address, **options)
  except (ConnectionError, ValueError, RuntimeError) as e:
    if address is None:
      raise
    raise UsageError(f'cannot connect to the Ray cluster at --ray_address={address} '
                     f'({errors.first_line(e)}): start it with `ray start --head`, or drop '
                     '--ray_address to run on this machine') from e
  _worker_messages_to_debug_log()


@contextlib.contextmanager
def _no_idle_helpers() -> Iterator[None]:
  """While embedded Ray starts: no autoscaler monitor, log monitor or dashboard head.

  On one node with nothing to autoscale, with `log_to_driver=False` and with
  the dashboard off, all three idle for the whole sweep or launch, yet they are
  three Python processes of 73-87 MiB RSS each (measured with Ray 2.40), about
  a fifth of what a sweep's driver and Ray hold. (`include_dashboard=False`
  still starts the dashboard's head process, for Ray's usage statistics, which
  we turn off.) `ray start` can leave out the monitor (`--no-monitor`),
  `ray.init` none of them: the node parameters it builds get the first two
  switches here, and the node skips the head the way Ray does when it fails to
  start (no dashboard URL, the rest runs). Ray is pinned (setup.cfg);
  tests/test_sweep.py checks that none of the three runs.
  """
  from ray._private import node  # pylint: disable=g-import-not-at-top
  from ray._private import parameter  # pylint: disable=g-import-not-at-top

  original_params = parameter.RayParams
  original_api_server = node.Node.start_api_server

  class WithoutIdleHelpers(original_params):  # pylint: disable=missing-class-docstring

    def __init__(self, *args, **kwargs):
      kwargs.update(no_monitor=True, include_log_monitor=False)
      super().__init__(*args, **kwargs)

  def without_api_server(self, **unused_kwargs) -> None:
    self._webui_url = None  # pylint: disable=protected-access

  parameter.RayParams = WithoutIdleHelpers
  node.Node.start_api_server = without_api_server
  try:
    yield
  finally:
    parameter.RayParams = original_params
    node.Node.start_api_server = original_api_server


def _worker_messages_to_debug_log() -> None:
  """`log_to_driver=False` keeps the workers' output away, but Ray 2.40 still
  prints worker-death notices from its error channel straight to stdout, with
  no setting to turn that off; they go to our log at DEBUG level instead (the
  commands report failures and restarts themselves)."""
  import ray._private.worker as ray_worker  # pylint: disable=g-import-not-at-top

  def to_debug_log(data: Dict[str, Any], ignore_prefix: bool = False) -> None:
    del ignore_prefix
    for line in data.get('lines', []):
      logging.debug('ray (%s): %s', data.get('pid'), line)

  if hasattr(ray_worker, 'print_to_stdstream'):
    ray_worker.print_to_stdstream = to_debug_log


def child_processes() -> List[psutil.Process]:
  """This process's children and theirs: embedded Ray's processes and workers."""
  try:
    return psutil.Process().children(recursive=True)
  except psutil.Error:
    return []


def stop(embedded: bool, program: str) -> None:
  """`ray.shutdown()`, then (embedded) waits until every process it started has exited.

  `ray.shutdown()` gives the raylet one second to stop its agents and workers,
  then SIGKILLs it; on a busy machine the dashboard and runtime-env agents
  outlive it, and an orphaned dashboard agent was seen still running minutes
  later. So Ray's own processes still running after `RAY_GRACE_S` are killed,
  and anything else (a trial's harness-train, saving its checkpoint) after
  `EXIT_WAIT_S`, named in the log. A command ends only when nothing of it runs.
  On a cluster this only disconnects the driver.
  """
  import ray  # pylint: disable=g-import-not-at-top
  processes = child_processes() if embedded else []
  _shutdown_without_collecting(ray)
  alive = _wait_for_exit(processes, RAY_GRACE_S)
  ray_dir = os.path.dirname(ray.__file__) + os.sep
  rays_own = [p for p in alive if _is_rays_own(p, ray_dir)]
  for process in rays_own:
    _kill(process, program, 'left running by Ray', logging.DEBUG)  # expected: quiet
  alive = _wait_for_exit([p for p in alive if p not in rays_own], EXIT_WAIT_S - RAY_GRACE_S)
  for process in alive:
    _kill(process, program, f'still running {EXIT_WAIT_S:.0f} s after Ray stopped',
          logging.WARNING)
  _wait_for_exit(rays_own + alive, 5.0)


def _is_rays_own(process: psutil.Process, ray_dir: str) -> bool:
  """Ray's services, agents (scripts in `ray_dir`) and workers (`ray::` titles),
  not what a worker started."""
  try:
    line = process.cmdline()
    return process.name() in ('raylet', 'gcs_server') or bool(line) and (
        line[0].startswith('ray::') or any(arg.startswith(ray_dir) for arg in line[:3]))
  except psutil.Error:
    return False


def _kill(process: psutil.Process, program: str, why: str, level: int) -> None:
  try:
    logging.log(level, '%s: killing %s (pid %d): %s', program, process.name(), process.pid, why)
    process.kill()
  except psutil.Error:
    pass


def _shutdown_without_collecting(ray: Any) -> None:
  """`ray.shutdown()` with no garbage collection while it runs.

  An `ObjectRef` that dies releases its reference through the core worker, and
  `ray.shutdown()` destroys the core worker before it drops Python's handle to
  it; a collection in that window, on any thread (a sweep's driver: Tune's
  garbage, freed as the thread drawing summary.png allocates), frees an
  ObjectRef through the destroyed worker and the process dies at once, without
  our `finally`s, its Ray agents left running. Seen with Ray 2.40 in 6 of 318 Ray sessions here;
  scripts/repro_shutdown_gc.py shows it. So: collect first, while the core
  worker lives, and no automatic collection until it is gone.
  """
  gc.collect()
  gc.disable()
  try:
    ray.shutdown()
  finally:
    gc.enable()


def _wait_for_exit(processes: List[psutil.Process], timeout: float) -> List[psutil.Process]:
  """Waits until each process has exited; returns those still running at `timeout`.

  A zombie counts as exited: it runs nothing and only awaits its parent's reaping.
  `psutil.wait_procs` counts it as running, and Ray's idle workers, whose
  parent (the raylet) is gone first, are reaped by the machine's init process,
  which on a VM here took ~1 s after each sweep and launch (a container's init
  may never reap).
  """
  deadline = time.monotonic() + timeout
  while True:
    alive = [p for p in processes if _running(p)]
    if not alive or time.monotonic() >= deadline:
      return alive
    time.sleep(0.02)


def _running(process: psutil.Process) -> bool:
  try:
    return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
  except psutil.Error:
    return False
