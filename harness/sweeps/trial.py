"""The Ray Tune trainable of a sweep: runs `harness-train` children and reports on them.

One Tune trial runs one child per seed it was given (one in a grid, a point's
seeds in an Optuna search), each `python -m harness.train` with the trial's
bindings in `SWEEP/trials/<trial_id>/`, its output appended to
`SWEEP/logs/<trial_id>.log`. While they run, the trainable reads their eval.csv
and reports the latest eval return to Tune (the Optuna objective: the IQM over
seeds); at the end it reads their results.json.

Why a class `tune.Trainable` and not a function trainable: when Tune stops a
trial (early stopping, Ctrl-C), it calls `Trainable.cleanup()`, where the
children get SIGTERM and are waited for; a function trainable's thread is just
abandoned. Every child also gets SIGTERM from the kernel if the thread that
started it dies (`PR_SET_PDEATHSIG`): Ray runs the tasks of a one-at-a-time
actor on its main thread, which is the one that starts and waits on the
children. Children run in a session of their own, so a Ctrl-C in the sweep's
terminal reaches the driver (Tune stops the trials, which stop their children)
and not every harness-train at once.

This module imports no TensorFlow: the children do the training.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import math
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Deque, Dict, List, Optional, Sequence

import numpy as np
from ray import tune

from harness.rundir import results
from harness.sweeps import aggregate
from harness.sweeps import gate as sweep_gate
from harness.sweeps import spec as sweep_spec

# A relaunch refused because a dying previous child still holds ROOT/.lock.
IN_USE_MARK = 'is in use by pid'
IN_USE_RETRY_SECONDS = 3.0
IN_USE_RETRIES = 20
POLL_SECONDS = 0.25
REPORT_EVERY_SECONDS = 10.0
# How long a child may take to checkpoint and exit after SIGTERM.
STOP_GRACE_SECONDS = 120.0
_PR_SET_PDEATHSIG = 1


def _die_with_parent_fn():
  """A preexec_fn: SIGTERM the child when the thread that started it ends (Linux)."""
  parent = os.getpid()

  def preexec() -> None:
    try:
      ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
      return  # Not Linux: children are still stopped by cleanup().
    if os.getppid() != parent:  # The parent died before prctl took effect.
      os._exit(143)  # pylint: disable=protected-access

  return preexec


def _existing_folder(path: str) -> str:
  """`path`, or its nearest existing parent: SWEEP/trials/ is made only once the
  gate opens, and children at the gate start before."""
  while not os.path.isdir(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  return path


@dataclasses.dataclass(frozen=True)
class ChildSpec:
  """What one harness-train child runs."""
  trial_id: str
  root_dir: str
  log_path: str
  gin_files: List[str]
  bindings: List[str]
  track_group: Optional[str] = None  # harness-sweep --track: the sweep's W&B group

  def command(self) -> List[str]:
    cmd = [sys.executable, '-m', 'harness.train', f'--root_dir={self.root_dir}']
    cmd += [f'--gin_file={f}' for f in self.gin_files]
    cmd += [f'--gin_bindings={b}' for b in self.bindings]
    cmd += ['--track'] if self.track_group else []
    return cmd

  def environment(self) -> Optional[Dict[str, str]]:
    """The child's environment: ours, plus its W&B group when tracked."""
    if not self.track_group:
      return None
    return dict(os.environ, WANDB_RUN_GROUP=self.track_group)


def child_specs(sweep_dir: str, spec: sweep_spec.Spec, point: sweep_spec.Point,
                seeds: Sequence[int], track_group: Optional[str] = None) -> List[ChildSpec]:
  """The children of one point: one per seed."""
  children = []
  for seed in seeds:
    trial = sweep_spec.make_trial(spec.sweeps, point, seed)
    children.append(ChildSpec(
        trial.trial_id, sweep_spec.trial_dir(sweep_dir, trial.trial_id),
        sweep_spec.log_path(sweep_dir, trial.trial_id), list(spec.gin_files),
        sweep_spec.trial_bindings(spec.bindings, point, seed), track_group))
  return children


def error_line(stderr_tail: Sequence[str], returncode: int) -> str:
  """One line for a failed child: harness-train's error line, the last stderr
  line, or the exit status."""
  prefix = 'harness-train: error:'
  for line in reversed(stderr_tail):
    if line.startswith(prefix):
      return line[len(prefix):].strip()
  for line in reversed(stderr_tail):
    if line.strip():
      return line.strip()[:300]
  if returncode < 0:
    return f'killed by {signal.Signals(-returncode).name}'
  return f'exit status {returncode}'


class Child:
  """One harness-train process, with its stderr kept for the error line.

  With a `gate` that is not open yet (the sweep's first trials, on one machine)
  the child starts at once and waits at the gate itself (`harness-train
  --sweep_gate`); the first child to start there checks the sweep's input first.
  Until the gate opens its output is held here: nothing is written to SWEEP
  before the input is known to be good.
  """

  def __init__(self, spec: ChildSpec, gate: Optional[sweep_gate.Gate] = None):
    self.spec = spec
    self.status = 'pending'
    self.error = ''
    self.results: Optional[Dict[str, Any]] = None
    self.wall_seconds = 0.0
    self.launches = 0
    self._gate = gate
    self._process: Optional[subprocess.Popen] = None
    self._started = 0.0
    self._tail: Deque[str] = collections.deque(maxlen=30)
    self._readers: List[threading.Thread] = []
    self._log_ready = threading.Event()  # set once output may go to the log (or is dropped)
    self._drop_output = False
    self._stderr_read = threading.Event()  # set at the end of the child's stderr
    self._launched_at = ''
    self._in_use_retries = 0
    self._retry_at = 0.0

  def start(self) -> None:
    """Skips a finished run; otherwise launches harness-train (resuming its ROOT)."""
    self.results = results.read_results(self.spec.root_dir)
    if self.results is not None:
      self.status = 'done'
      return
    gated = self._gate is not None and not self._gate.is_open()
    command = self.spec.command()
    if gated:  # The first child to start at the gate checks the sweep's input.
      command += [f'--sweep_gate={self._gate.path}']
      command += ['--sweep_check'] if self._gate.claim_check() else []
    self._tail.clear()
    self._log_ready.clear()
    self._stderr_read.clear()
    self._drop_output = False
    self._launched_at = time.strftime('%Y-%m-%d %H:%M:%S')
    log = None if gated else self._open_log()
    self._process = subprocess.Popen(  # pylint: disable=consider-using-with,subprocess-popen-preexec-fn
        command, stdout=subprocess.PIPE if gated else log, stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL, env=self.spec.environment(),
        preexec_fn=_die_with_parent_fn(), start_new_session=True,
        cwd=_existing_folder(os.path.dirname(self.spec.root_dir)))
    if log is not None:
      log.close()  # The child holds its own descriptor.
    self._started = time.time()
    self.launches += 1
    self.status = 'running'
    streams = [(self._process.stderr, True)] + ([(self._process.stdout, False)] if gated else [])
    self._readers = [threading.Thread(target=self._copy_to_log, args=stream, daemon=True)
                     for stream in streams]
    for reader in self._readers:
      reader.start()

  def _open_log(self):
    """SWEEP/logs/<trial_id>.log with this launch's first line, open for appending."""
    os.makedirs(os.path.dirname(self.spec.log_path), exist_ok=True)
    log = open(self.spec.log_path, 'ab')  # pylint: disable=consider-using-with
    log.write(f'=== harness-sweep: launch at {self._launched_at} on '
              f'{os.uname().nodename}\n'.encode())
    log.flush()
    self._log_ready.set()
    return log

  def gate_opened(self) -> None:
    """The sweep's input passed: the held output goes to the log, and so does the rest."""
    if self._process is not None and not self._log_ready.is_set():
      self._open_log().close()

  def gate_closed(self) -> None:
    """Bad input: the child's output is dropped (nothing is written to SWEEP)."""
    self._drop_output = True
    self._log_ready.set()

  def _copy_to_log(self, stream, keep_tail: bool) -> None:
    """Copies one of the child's streams into its log (stderr: keeping the last
    lines); lines that come before the log is ready are held until it is."""
    held: List[bytes] = []
    log = None
    try:
      for raw in stream:
        if keep_tail:
          self._tail.append(raw.decode(errors='replace').rstrip('\n'))
        held.append(raw)
        if self._log_ready.is_set():
          log = self._write_held(held, log)
      if keep_tail:
        self._stderr_read.set()
      if held and self._log_ready.wait(timeout=STOP_GRACE_SECONDS):
        log = self._write_held(held, log)
    finally:
      if log is not None:
        log.close()

  def _write_held(self, held: List[bytes], log):
    if not self._drop_output:
      log = log or open(self.spec.log_path, 'ab')  # pylint: disable=consider-using-with
      log.writelines(held)
      log.flush()
    held.clear()
    return log

  def exit_code(self) -> Optional[int]:
    """The exit status of the child while nobody has polled it since; None while it runs."""
    return None if self._process is None else self._process.poll()

  def start_error(self) -> str:
    """The error line of a child that ended before its run started."""
    self._stderr_read.wait(timeout=10)  # its last lines may still be on their way
    code = self.exit_code()
    return error_line(list(self._tail), code if code is not None else 1)

  def poll(self) -> bool:
    """Updates the status; True while the child runs (or waits to be relaunched)."""
    if self.status == 'waiting' and time.time() >= self._retry_at:
      self.start()
    if self._process is None:
      return self.status == 'waiting'
    code = self._process.poll()
    if code is None:
      return True
    for reader in self._readers:
      reader.join(timeout=10)
    self.wall_seconds += time.time() - self._started
    self._process = None
    self.results = results.read_results(self.spec.root_dir)
    if code == 0 and self.results is not None:
      self.status = 'done'
      return False
    if (code == 2 and any(IN_USE_MARK in line for line in self._tail)
        and self._in_use_retries < IN_USE_RETRIES):
      # The previous child of this trial is still checkpointing after SIGTERM.
      self._in_use_retries += 1
      self.status, self._retry_at = 'waiting', time.time() + IN_USE_RETRY_SECONDS
      return True
    self.status = 'failed'
    self.error = (error_line(list(self._tail), code) if code != 0 else
                  'harness-train exited 0 but wrote no results.json')
    return False

  def latest_eval(self) -> Optional[tuple]:
    """(env_steps, avg_return) of the newest eval.csv row, or None."""
    steps, returns = aggregate.read_eval_curve(self.spec.root_dir)
    return (float(steps[-1]), float(returns[-1])) if steps.size else None

  def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
    """SIGTERM (harness-train checkpoints and exits), SIGKILL after `grace` seconds."""
    process = self._process
    if process is None:
      return
    if process.poll() is None:
      process.terminate()
      try:
        process.wait(timeout=grace)
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    self.wall_seconds += time.time() - self._started
    self._process = None
    self.status = 'stopped'

  def row(self) -> Dict[str, Any]:
    """What the driver records for this child."""
    res = self.results or {}
    return {'trial_id': self.spec.trial_id, 'status': self.status, 'error': self.error,
            'final_return': res.get('final_return'),
            'best_policy_return': res.get('best_policy_return'),
            'train_return_last100': res.get('train_return_last100'),
            'env_steps': res.get('env_steps'),
            'wall_seconds': self.wall_seconds + (time.time() - self._started
                                                 if self._process is not None else 0.0),
            'launches': self.launches}


def iqm(values: Sequence[float]) -> float:
  """IQM of a few numbers, the Optuna objective: `aggregate.iqm`, checked against
  rliable's aggregate_iqm in the tests; rliable's import would cost each trial
  worker ~1 CPU-second and 55 MB."""
  finite = [v for v in values if v is not None and math.isfinite(v)]
  return float(aggregate.iqm(np.asarray(finite))) if finite else math.nan


class HarnessTrial(tune.Trainable):
  """Runs the harness-train children of one Tune trial; see the module docstring.

  Config (from Tune): `point` (grid: the whole point) or `p0, p1, ...` (Optuna:
  the searcher's values of the swept names in order) and `seeds`. The sweep's
  directory, spec, W&B group (`--track`) and gate (`harness.sweeps.gate`, on one
  machine) come through `tune.with_parameters`.
  """

  def setup(self, config: Dict[str, Any], sweep_dir: str = '',  # pylint: disable=arguments-differ
            spec_json: Optional[Dict[str, Any]] = None,
            track_group: Optional[str] = None, gate_dir: Optional[str] = None) -> None:
    spec = sweep_spec.spec_from_json(spec_json or {})
    config = config.get('run', config)  # A grid run: {'point': ..., 'seeds': [seed]}
    point = config_point(spec, config)
    gate = sweep_gate.Gate(gate_dir) if gate_dir else None
    if gate is not None and gate.is_open():
      gate = None  # The sweep is past its input check.
    self._children = [Child(c, gate) for c in child_specs(sweep_dir, spec, point,
                                                          config['seeds'], track_group)]
    self._last_report = 0.0
    self._last_seen: Optional[tuple] = None
    for child in self._children:
      child.start()
    if gate is not None:
      # Tune counts the trial as started (and the table writes it) once setup returns.
      self._wait_at_the_gate(gate)

  def _wait_at_the_gate(self, gate: sweep_gate.Gate) -> None:
    """Returns once the driver opens the gate. The children meanwhile start (one of
    them checks the sweep's input) and wait there; a child that ends first gives
    the verdict if there is none yet (the checker's crash, say)."""
    def check_children() -> None:
      for child in self._children:
        code = child.exit_code()
        if code is not None:
          gate.record_verdict(sweep_gate.Verdict(
              False, child.start_error(), 2 if code == 2 else 1))
          raise sweep_gate.GateClosed(f'harness-train ended at the gate: exit status {code}')

    try:
      gate.wait(while_waiting=check_children)
    except sweep_gate.GateClosed:
      for child in self._children:
        child.gate_closed()
      self.cleanup()
      raise
    for child in self._children:
      child.gate_opened()

  def step(self) -> Dict[str, Any]:
    """Waits for news (a child ended, a new evaluation, or 10 s), then reports."""
    deadline = time.time() + REPORT_EVERY_SECONDS
    while True:
      running = [c.poll() for c in self._children]
      if not any(running):
        return self._result(done=True)
      seen = tuple(c.latest_eval() for c in self._children)
      if seen != self._last_seen or time.time() >= deadline:
        self._last_seen = seen
        return self._result(done=False, latest=seen)
      time.sleep(POLL_SECONDS)

  def _result(self, done: bool, latest: Optional[tuple] = None) -> Dict[str, Any]:
    """Tune metrics: `objective` and `env_steps` (for the searcher and ASHA)."""
    if done:
      finals = [(c.results or {}).get('final_return') for c in self._children
                if c.status == 'done']
      steps = [(c.results or {}).get('env_steps', 0) for c in self._children
               if c.status == 'done']
      objective, env_steps = iqm(finals), (min(steps) if steps else 0)
    else:
      evals = [e for e in (latest or ())]
      if all(e is not None for e in evals) and evals:
        objective, env_steps = iqm([e[1] for e in evals]), min(e[0] for e in evals)
      else:
        objective, env_steps = math.nan, 0
    return {'objective': objective, 'env_steps': env_steps, 'finished': done,
            'children': [c.row() for c in self._children], tune.result.DONE: done}

  def cleanup(self) -> None:
    """Tune stopped the trial (or it ended): stop any child still running."""
    for child in self._children:
      if child.status in ('running', 'waiting'):
        child.stop()

  def reset_config(self, new_config: Dict[str, Any]) -> bool:
    """Tune reuses this actor for its next trial (no new Ray worker to start)."""
    self.cleanup()
    self.setup(new_config)  # tune.with_parameters' subclass adds sweep_dir and spec_json.
    return True

  def save_checkpoint(self, checkpoint_dir: str) -> Dict[str, Any]:
    # Each child checkpoints its own run directory; Tune keeps nothing.
    return {}

  def load_checkpoint(self, checkpoint: Any) -> None:
    pass


def config_point(spec: sweep_spec.Spec, config: Dict[str, Any]) -> sweep_spec.Point:
  """The point of a Tune config: grid configs carry it whole, Optuna ones as p0, p1..."""
  if 'point' in config:
    return dict(config['point'])
  point = {}
  for i, sweep in enumerate(spec.sweeps):
    value = config[f'p{i}']
    point[sweep.name] = (value if isinstance(value, str) else sweep_spec.float_text(value))
  return point
