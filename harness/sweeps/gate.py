"""The gate that holds a sweep's trials until its input has been checked.

On one machine `harness-sweep` does not check its input in a process of its
own: the first trial's `harness-train` does it. Ray Tune starts at once; the
first trial actor to start claims the check (`claim_check`) and starts its
child with `--sweep_gate=DIR --sweep_check`: the child checks the sweep's
common configuration and swept names (`check_request`, written by the driver),
records the verdict here, then waits like every other child until the gate
opens. The driver opens the gate once the check has passed and SWEEP is
prepared, or closes it on bad input: the children exit, Tune stops, and the
sweep exits 2 with nothing in SWEEP. A child does nothing to its run directory
before the gate opens.

Why not a `harness-train --check_only` of our own beside Tune (as on a
cluster): that was a second TensorFlow start (~5 CPU-seconds) while Ray and
the trials start, which on two cores delayed the first trials by ~2 s
(docs/performance.md). The trial's child imports TensorFlow anyway.

The gate is a temporary directory on the driver's machine, so it is only used
with embedded Ray; on a cluster the check finishes before Tune starts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import threading
import time
from typing import Any, Callable, Dict, Optional, Sequence

POLL_SECONDS = 0.05
_OPEN, _CLOSED = 'open', 'closed'
_REQUEST, _CLAIM, _VERDICT = 'check.json', 'checker', 'verdict.json'


class GateClosed(RuntimeError):
  """The sweep's input check failed: the trial must not run."""


@dataclasses.dataclass(frozen=True)
class Verdict:
  """The input check's outcome: `message` and `exit_code` (2: bad input) when it failed."""
  passed: bool
  message: str = ''
  exit_code: int = 0


class Gate:
  """A directory holding the check's request and verdict, and `open` or `closed`
  (or neither, while the check runs)."""

  def __init__(self, path: Optional[str] = None):
    self.path = path or tempfile.mkdtemp(prefix='harness-sweep-gate-')

  # --- the input check: requested by the driver, claimed by one trial ---

  def request_check(self, gin_files: Sequence[str], bindings: Sequence[str],
                    names: Sequence[str]) -> None:
    """What the checking child checks: the sweep's common config and swept names."""
    self._write_new(_REQUEST, {'gin_files': list(gin_files), 'bindings': list(bindings),
                               'names': list(names)})

  def check_request(self) -> Dict[str, Any]:
    with open(os.path.join(self.path, _REQUEST), encoding='utf-8') as f:
      return json.load(f)

  def claim_check(self) -> bool:
    """True for the first caller only (a file created exclusively)."""
    return self._write_new(_CLAIM, {'pid': os.getpid()})

  def record_verdict(self, verdict: Verdict) -> bool:
    """Records the check's outcome; the first verdict stands (False: one was there)."""
    return self._write_new(_VERDICT, dataclasses.asdict(verdict))

  def verdict(self) -> Optional[Verdict]:
    try:
      with open(os.path.join(self.path, _VERDICT), encoding='utf-8') as f:
        return Verdict(**json.load(f))
    except FileNotFoundError:  # none yet (`_write_new` links it in whole)
      return None

  def wait_verdict(self, timeout: float,
                   cancelled: Optional[threading.Event] = None) -> Optional[Verdict]:
    """The verdict; None if `cancelled` was set first; `TimeoutError` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while (verdict := self.verdict()) is None:
      if cancelled is not None and cancelled.is_set():
        return None
      if time.monotonic() > deadline:
        raise TimeoutError(f'the input check gave no verdict in {timeout:.0f} s')
      time.sleep(POLL_SECONDS)
    return verdict

  # --- the driver's decision ---

  def open(self) -> None:
    self._write_new(_OPEN, {})

  def close(self) -> None:
    self._write_new(_CLOSED, {})

  def is_open(self) -> bool:
    return os.path.exists(os.path.join(self.path, _OPEN))

  def is_closed(self) -> bool:
    return os.path.exists(os.path.join(self.path, _CLOSED))

  def wait(self, while_waiting: Optional[Callable[[], None]] = None) -> None:
    """Returns once the gate is open; raises `GateClosed` if it was closed.
    `while_waiting` is called at every poll (it may raise to stop the wait)."""
    while not self.is_open():
      if self.is_closed():
        raise GateClosed("the sweep's input check failed")
      if while_waiting is not None:
        while_waiting()
      time.sleep(POLL_SECONDS)

  def remove(self) -> None:
    shutil.rmtree(self.path, ignore_errors=True)

  def _write_new(self, name: str, content: Dict[str, Any]) -> bool:
    """Writes `name` whole (readers never see half of it) unless it exists."""
    final = os.path.join(self.path, name)
    if os.path.exists(final):
      return False
    partial = f'{final}.{os.getpid()}.{threading.get_ident()}'
    with open(partial, 'w', encoding='utf-8') as f:
      json.dump(content, f)
    try:
      os.link(partial, final)  # fails if `final` exists: the first writer wins
      return True
    except FileExistsError:
      return False
    finally:
      os.unlink(partial)
