"""Stopping a run on request: finish the iteration, checkpoint, exit with a status that says why.

A `StopRequest` is set by a signal handler (SIGTERM, SIGINT) or by a
supervisor in the same process (a Ray actor asked to stop). The run loop asks
it between iterations; when it is set, the loop writes a complete checkpoint
and raises `Stopped`, which the entry point turns into the exit status
(143 for SIGTERM, 130 for SIGINT: 128 + the signal number, as a shell reports
a process killed by that signal, so schedulers requeue it).
"""

from __future__ import annotations

import signal
from typing import Optional


class Stopped(Exception):
  """The run stopped on request after writing its checkpoint."""

  def __init__(self, message: str, exit_code: int):
    super().__init__(message)
    self.exit_code = exit_code


class StopRequest:
  """Whether this process has been asked to stop, and why."""

  def __init__(self):
    self.reason: Optional[str] = None
    self.exit_code: Optional[int] = None

  @property
  def requested(self) -> bool:
    return self.reason is not None

  def request(self, reason: str, exit_code: int) -> None:
    """Asks the run to stop after its current iteration (the first request wins)."""
    if self.reason is None:
      self.reason, self.exit_code = reason, exit_code

  def request_for_signal(self, signum: int) -> None:
    self.request(signal.Signals(signum).name, 128 + signum)


# The process's stop request: one run per process.
_CURRENT = StopRequest()


def current() -> StopRequest:
  return _CURRENT
