"""`harness-train`: the one entry point (`python -m harness.train` is the same).

Parses flags and gin, checks the input, then hands over to
the job `--job` names (`run_job`). Bad input ends with one line on stderr and exit
status 2 before anything in `--root_dir` is created or touched; `--verbosity=1`
adds the traceback and whatever libraries printed meanwhile.

The log (absl, including the progress lines) goes to stdout, so that stderr
carries problems only.

Exit status: 0 done; 1 a failed write (full disk: one line, the last complete
checkpoint stays) or a crash; 2 bad input, or ROOT held by another launch;
143 / 130 stopped by SIGTERM / SIGINT (see `shutdown`).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import time
from typing import Any, Callable, List, Optional, Sequence

from absl import flags
from absl import logging
import gin

import harness
from harness.base import cli
from harness.base import disk
from harness.base import errors
from harness.base import memory
from harness.base import shutdown
from harness.base import threads
from harness.base.errors import UsageError
from harness.distributed import jobs
from harness.rl import agents
from harness.rl import envs
from harness.run import experiment
from harness.run import parts
from harness.run import single_process
from harness.run.settings import RunConfig
from harness.rundir import lock as run_lock
from harness.sweeps import gate as sweep_gate

_ROOT_DIR = flags.DEFINE_string('root_dir', None, 'Run directory; an existing run there is resumed.')
_GIN_FILE = flags.DEFINE_multi_string('gin_file', [], 'Gin files, applied in order.')
_GIN_BINDINGS = flags.DEFINE_multi_string(
    'gin_bindings', [], 'Gin bindings, applied after the files (so they win).')
_JOB = flags.DEFINE_enum('job', 'all', ['all', 'replay', 'collect', 'learn', 'eval'],
                         'Which job this process runs; `all` runs everything in one process.')
_REPLAY_ADDRESS = flags.DEFINE_string(
    'replay_address', None, 'host:port of a Reverb server for the connecting jobs '
    '(for --job=replay: the port it listens on).')
_COLLECTOR_ID = flags.DEFINE_integer(
    'collector_id', 0, 'Which collector this is (--job=collect): its seed and csv file.')

_TRACK = flags.DEFINE_bool(
    'track', False, "Also stream the run to Weights & Biases (pip install -e '.[wandb]'); "
    'files under ROOT/wandb/. WANDB_MODE=offline needs no network.')

_CHECK_ONLY = flags.DEFINE_bool(
    'check_only', False, 'Check the flags, gin files, bindings and environment, then exit '
    '(0 = fine, 2 = one-line error); nothing is written. --root_dir is optional then.')
_CHECK_NAMES = flags.DEFINE_multi_string(
    'check_names', [], 'With --check_only: binding names (configurable.parameter) that must '
    'exist, e.g. the names a sweep will bind.')

_SWEEP_GATE = flags.DEFINE_string(
    'sweep_gate', None, 'Set by harness-sweep on one machine: its gate directory '
    '(harness/sweeps/gate.py). The run waits there, touching nothing, until the sweep has '
    'checked its input and prepared its directory.')
_SWEEP_CHECK = flags.DEFINE_bool(
    'sweep_check', False, "With --sweep_gate: first check the sweep's common gin files, "
    'bindings and swept names, and record the verdict at the gate.')

_PROGRAM = 'harness-train'
# Jobs that connect to a replay server started elsewhere (`--job=replay`).
_JOBS_NEEDING_REPLAY = ('replay', 'collect', 'learn', 'eval')
# The jobs that write the run's checkpoints and logs, and so hold ROOT/.lock.
_WRITER_JOBS = ('all', 'learn')


def check_root_dir(root_dir: Optional[str]) -> None:
  """Raises `UsageError` unless `root_dir` is (or can become) a writable directory."""
  if not root_dir:
    raise UsageError('--root_dir is required: e.g. --root_dir=runs/cartpole')
  path = os.path.abspath(root_dir)
  if os.path.exists(path) and not os.path.isdir(path):
    raise UsageError(f'--root_dir={root_dir} is a file, not a directory: pass a directory '
                     '(a new path starts a run, an existing run directory resumes it)')
  existing = path
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise UsageError(f'--root_dir={root_dir} lies under the file {existing}: pass a path '
                     'whose parents are directories')
  if not os.access(existing, os.W_OK | os.X_OK):
    raise UsageError(f'--root_dir={root_dir} is not writable ({existing} does not allow '
                     'writing): pick a directory you can write to, e.g. --root_dir=runs/NAME')


def check_job(job: str, replay_address: Optional[str]) -> None:
  if job == 'replay' and not replay_address:
    raise UsageError('--job=replay needs --replay_address=host:port: the port it serves on, '
                     'e.g. --replay_address=localhost:8000')
  if job == 'all' and replay_address:
    raise UsageError('--job=all runs its own replay server: drop --replay_address, or run '
                     'the replay, collect and learn jobs separately')
  if job in _JOBS_NEEDING_REPLAY and not replay_address:
    raise UsageError(f'--job={job} needs --replay_address=host:port of a running replay '
                     'server: start one with --job=replay (or use --job=all)')


def _gin_value(fn: Callable[..., Any], name: str) -> Any:
  """The value gin will pass for `fn`'s parameter `name` (binding or default)."""
  bound = gin.get_bindings(fn)
  if name in bound:
    return bound[name]
  return inspect.signature(fn).parameters[name].default


def check_values(root_dir: Optional[str], job: str, replay_address: Optional[str],
                 collector_id: int) -> RunConfig:
  """Checks the bound values that would otherwise fail only deep inside the run
  (with the same checks the run applies: `RunConfig.validate`, `agents.check_settings`);
  returns the run's settings."""
  cfg = experiment.settings_from_gin(root_dir=root_dir, job=job, replay_address=replay_address,
                                     collector_id=collector_id).validate()
  names = inspect.signature(agents.check_settings).parameters
  agents.check_settings(**{name: _gin_value(agents.make_agent, name) for name in names})
  return cfg


def check_env() -> None:
  """Builds the configured environment once: an unknown id or a continuous
  action space fails here, before anything is written."""
  env_id = _gin_value(envs.make_env, 'env_id')
  if not isinstance(env_id, str):
    raise UsageError(f'make_env.env_id={env_id!r} must be a string, e.g. '
                     "make_env.env_id='CartPole-v1'")
  envs.check_env_id(env_id)
  try:
    env = envs.make_env()
  except UsageError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise UsageError(f'could not make environment {env_id!r}: {errors.first_line(e)}; '
                     'check the make_env bindings') from e
  env.close()


def run_job() -> None:
  """Runs the job `--job` names with `train_eval`'s settings: the single-process
  job, or one job of a distributed run. The jobs that train hold ROOT/.lock."""
  cfg = experiment.train_eval(root_dir=_ROOT_DIR.value, replay_address=_REPLAY_ADDRESS.value,
                              job=_JOB.value, collector_id=_COLLECTOR_ID.value,
                              track=_TRACK.value)
  parts.seed_everything(cfg.seed)
  writes_root = cfg.job in _WRITER_JOBS
  with run_lock.hold(cfg.root_dir, cfg.job) if writes_root else contextlib.nullcontext():
    if cfg.job == 'all':
      single_process.run_single_process(cfg)
    else:
      jobs.run_job(cfg)


def check_names(names: Sequence[str]) -> None:
  """Raises `UsageError` for a name that no configurable parameter has."""
  known = set(errors.known_binding_names())
  for name in names:
    if name not in known:
      raise UsageError(f'unknown gin binding {name!r}: {errors.binding_hint(name)}')


def check_input(gin_files: Sequence[str], gin_bindings: Sequence[str],
                names: Sequence[str] = (), root_dir: Optional[str] = None, job: str = 'all',
                replay_address: Optional[str] = None, collector_id: int = 0) -> RunConfig:
  """Parses gin and checks names, values, the environment and the allocator
  setting; returns the run's settings. Library output meanwhile (gin's logging
  of a missing file, the ALE banner) is held back: a failed start shows only our
  error line."""
  with errors.held_output(replay_on_error=_verbose()):
    experiment.parse_gin(gin_files, gin_bindings)
    check_names(names)
    cfg = check_values(root_dir, job, replay_address, collector_id)
    check_env()
    memory.configure_allocator()  # checks its gin value too
    threads.configure_threads()  # before TensorFlow runs an op; checks its values
  return cfg


def check_for_sweep(gate: sweep_gate.Gate) -> None:
  """--sweep_check: checks the sweep's common configuration (as `--check_only`
  with `--check_names` would), records the verdict at the gate, and clears gin
  for the run's own configuration."""
  request = gate.check_request()
  try:
    check_input(request['gin_files'], request['bindings'], request['names'])
  except UsageError as e:
    gate.record_verdict(sweep_gate.Verdict(False, str(e), UsageError.exit_code))
    raise
  except Exception as e:  # pylint: disable=broad-except  (a bug: the sweep reports it)
    gate.record_verdict(sweep_gate.Verdict(False, errors.first_line(e), 1))
    raise
  gate.record_verdict(sweep_gate.Verdict(True))
  gin.clear_config()


def wait_at_gate(gate: sweep_gate.Gate) -> None:
  """Waits until the sweep opens its gate (SIGTERM still stops the wait)."""
  started = time.monotonic()
  try:
    gate.wait(while_waiting=lambda: shutdown.exit_if_requested("at the sweep's gate"))
  except sweep_gate.GateClosed as e:
    raise UsageError("the sweep's input check failed: harness-sweep reports why") from e
  logging.info("Waited %.1f s at the sweep's gate (its input check)",
               time.monotonic() - started)


def main(argv: List[str]) -> None:
  # Signals first: a launch stopped while it starts exits with 143/130 too.
  # The grace is train_eval's default until the bindings are read.
  shutdown.install_signal_handlers(
      _gin_value(experiment.train_eval, 'shutdown_grace_seconds'), _PROGRAM)
  if len(argv) > 1:
    raise UsageError(f'unexpected arguments {argv[1:]}: use --flag=value forms')
  if not (_CHECK_ONLY.value and _ROOT_DIR.value is None):
    check_root_dir(_ROOT_DIR.value)
  check_job(_JOB.value, _REPLAY_ADDRESS.value)
  if _TRACK.value:
    from harness.base import tracking  # pylint: disable=g-import-not-at-top
    tracking.check_ready()
  harness.quiet_tensorflow_logs()
  if _SWEEP_GATE.value:
    gate = sweep_gate.Gate(_SWEEP_GATE.value)
    if _SWEEP_CHECK.value:
      check_for_sweep(gate)
    wait_at_gate(gate)
  cfg = check_input(_GIN_FILE.value, _GIN_BINDINGS.value, _CHECK_NAMES.value, _ROOT_DIR.value,
                    _JOB.value, _REPLAY_ADDRESS.value, _COLLECTOR_ID.value)
  shutdown.install_signal_handlers(cfg.shutdown_grace_seconds, _PROGRAM)
  shutdown.exit_if_requested('during start-up')
  if _CHECK_ONLY.value:
    return
  run_job()


def _verbose() -> bool:
  return logging.get_verbosity() >= logging.DEBUG


COMMAND = cli.Command(
    program=_PROGRAM,
    summary='trains a DQN agent with TF-Agents and Reverb; an existing run in --root_dir '
            'is resumed.',
    usage='--root_dir=DIR --gin_file=FILE [--gin_bindings=BINDING ...] [flags]',
    example='harness-train --root_dir=runs/cartpole --gin_file=gin/ddqn_cartpole.gin '
            '--gin_bindings="train_eval.num_env_steps=20000"',
    module=__name__)


def run() -> None:
  """Console-script entry point."""
  try:
    cli.run_app(_PROGRAM, main, COMMAND, reported=(disk.WriteError,), silent=(shutdown.Stopped,))
  except SystemExit as e:
    cli.exit_without_teardown(e.code)


if __name__ == '__main__':
  run()
