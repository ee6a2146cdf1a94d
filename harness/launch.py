"""`harness-launch`: a distributed run on Ray (`python -m harness.launch` is the same).

  harness-launch --root_dir=R --gin_file=F [--gin_bindings=B ...] --num_collectors=N
                 [--eval_job] [--ray_address=auto|host:port]

The replay server, N collectors, the learner and (with --eval_job) an eval
job run as Ray actors, each in a worker process of its own (harness/distributed/actors.py;
harness/distributed/ray_launch.py takes them from start to a clean stop).
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

import os
import re
import subprocess
import sys
import uuid
from typing import List, Optional, Sequence

from absl import flags
from absl import logging
import gin

from harness.base import cli
from harness.base import ray_runtime
from harness.base.errors import UsageError
from harness.distributed import actors
from harness.distributed import ray_launch
from harness.run import settings as settings_lib

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

_PROGRAM = ray_launch.PROGRAM
_ADDRESS = re.compile(r'^(auto|[^\s:/]+:\d+)$')


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
  raise ray_launch.LaunchError(f'checking the input failed ({message})')


def read_distributed(gin_files: Sequence[str], gin_bindings: Sequence[str]):
  """The launch's `Distributed` settings, validated.

  gin parses the (already checked) files here too, skipping every configurable
  but `Distributed`, which harness/run/settings.py registers without TensorFlow.
  """
  gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings), skip_unknown=True)
  return settings_lib.Distributed().validate()


def start_ray(ray_address: Optional[str]) -> None:
  """Starts embedded Ray (localhost, no dashboard) or connects to a cluster;
  Ray's warnings reach our log, its other records only with --verbosity=1."""
  ray_runtime.route_library_logs(ray_runtime.ToAbslLog(), names=('ray',))
  ray_runtime.start(ray_address)


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


def main(argv: List[str]) -> int:
  if len(argv) > 1:
    raise UsageError(f'unexpected arguments {argv[1:]}: use --flag=value forms')
  check_flags(_NUM_COLLECTORS.value, _RAY_ADDRESS.value)
  verbose = _verbose()
  if _ROOT_DIR.value is None:
    raise UsageError('--root_dir is required: e.g. --root_dir=runs/dist')
  signals = ray_launch.Signals()
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
    code = ray_launch.Launch(spec, settings, _NUM_COLLECTORS.value, _EVAL_JOB.value, signals,
                  embedded).run()
  finally:
    # Embedded: stops Ray and every job; a cluster: disconnects only.
    ray_runtime.stop(embedded, _PROGRAM)
  logging.info('%s: exit status %d', _PROGRAM, code)
  return code


def _verbose() -> bool:
  return logging.get_verbosity() >= logging.DEBUG


COMMAND = cli.Command(
    program=_PROGRAM,
    summary='a distributed run on Ray: replay server, collectors, learner (and an eval job) '
            'as Ray actors; an existing run in --root_dir is resumed.',
    usage='--root_dir=DIR --gin_file=FILE [--gin_bindings=BINDING ...] --num_collectors=N '
          '[flags]',
    example='harness-launch --root_dir=runs/cartpole_dist --gin_file=gin/ddqn_cartpole.gin '
            '--num_collectors=2 --eval_job',
    module=__name__)


def run() -> None:
  """Console-script entry point."""
  cli.run_app(_PROGRAM, main, COMMAND, reported=(ray_launch.LaunchError,))


if __name__ == '__main__':
  run()
