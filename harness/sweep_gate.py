"""The gate that holds a sweep's trials until its input check has passed.

On one machine `harness-sweep` starts Ray Tune while `harness-train
--check_only` still runs (a TensorFlow start, ~5 s): Tune's controller and its
trial actors (a Ray worker each, importing Ray Tune) get ready meanwhile, and
each trial waits here before it writes anything or starts a child. The driver
opens the gate once the check has passed and SWEEP is prepared, or closes it on
bad input: the trials then fail at setup, Tune stops, and the sweep exits 2
with nothing in SWEEP. Measured on two cores, the first child started ~3 s
earlier (docs/performance.md).

The gate is a temporary directory on the driver's machine, so it is only used
with embedded Ray; on a cluster the check finishes before Tune starts.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Optional

POLL_SECONDS = 0.05
_OPEN, _CLOSED = 'open', 'closed'


class GateClosed(RuntimeError):
  """The sweep's input check failed: the trial must not run."""


class Gate:
  """A directory holding `open` or `closed` (or neither, while the check runs)."""

  def __init__(self, path: Optional[str] = None):
    self.path = path or tempfile.mkdtemp(prefix='harness-sweep-gate-')

  def open(self) -> None:
    self._mark(_OPEN)

  def close(self) -> None:
    self._mark(_CLOSED)

  def _mark(self, name: str) -> None:
    with open(os.path.join(self.path, name), 'w', encoding='utf-8'):
      pass

  def is_open(self) -> bool:
    return os.path.exists(os.path.join(self.path, _OPEN))

  def is_closed(self) -> bool:
    return os.path.exists(os.path.join(self.path, _CLOSED))

  def wait(self) -> None:
    """Returns once the gate is open; raises `GateClosed` if it was closed."""
    while not self.is_open():
      if self.is_closed():
        raise GateClosed("the sweep's input check failed")
      time.sleep(POLL_SECONDS)

  def remove(self) -> None:
    shutil.rmtree(self.path, ignore_errors=True)
