"""Stopping a run on request: finish the iteration, checkpoint, exit with a status that says why.

A `StopRequest` is set by a signal (SIGTERM, SIGINT) or by a supervisor in the
same process (a Ray actor asked to stop). The run loop asks it between
iterations; when it is set, the loop writes a complete checkpoint and raises
`Stopped`, which the entry point turns into the exit status (143 for SIGTERM,
130 for SIGINT: 128 + the signal number, as a shell reports a process killed
by that signal, so schedulers requeue it). Start-up asks it too
(`exit_if_requested`): a launch stopped before it trained anything exits with
the same status and writes nothing.

`install_signal_handlers` (harness-train calls it before the run starts):
  - the first SIGTERM or SIGINT sets the request and starts a timer that ends
    the process with the same status if the stop takes longer than the grace
    (`train_eval.shutdown_grace_seconds`);
  - a second signal ends the process at once (no checkpoint; the previous one
    stays).
The signals are read on a thread of their own (through `signal.set_wakeup_fd`),
so the second signal and the timer act even while the main thread sits in a
long C++ call (a Reverb checkpoint, a SavedModel export), where a Python
signal handler would wait for the call to return.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Optional

from absl import logging

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(Exception):
  """The run stopped on request (after writing its checkpoint, if it had new work)."""

  def __init__(self, message: str, exit_code: int):
    super().__init__(message)
    self.exit_code = exit_code


class StopRequest:
  """Whether this process has been asked to stop, and why."""

  def __init__(self):
    self.reason: Optional[str] = None
    self.exit_code: Optional[int] = None
    self._lock = threading.Lock()
    self._event = threading.Event()

  @property
  def requested(self) -> bool:
    return self.reason is not None

  def request(self, reason: str, exit_code: int) -> bool:
    """Asks the run to stop after its current iteration; True for the first request
    (which wins)."""
    with self._lock:
      if self.reason is not None:
        return False
      self.reason, self.exit_code = reason, exit_code
    self._event.set()
    return True

  def request_for_signal(self, signum: int) -> bool:
    return self.request(signal.Signals(signum).name, 128 + signum)

  def wait(self, timeout: Optional[float] = None) -> bool:
    """Sleeps until a stop is requested or `timeout` seconds pass; True if requested."""
    return self._event.wait(timeout)


# The process's stop request: one run per process.
_CURRENT = StopRequest()


def current() -> StopRequest:
  return _CURRENT


def exit_if_requested(where: str, outcome: str = 'nothing new to checkpoint') -> None:
  """Raises `Stopped` when a stop was requested, without writing anything.

  For the points of a launch before its loop (start-up, the initial random
  collect), where nothing new would go into a checkpoint, and for waits where
  no checkpoint can be written (`outcome` says so).
  """
  stop = current()
  if stop.requested:
    message = f'stopped by {stop.reason} {where}: {outcome}; run the same command to resume'
    logging.info('%s', message)
    raise Stopped(message, stop.exit_code)


class _SignalWatcher:
  """Reads SIGTERM/SIGINT from the wakeup pipe on a daemon thread and acts on them."""

  def __init__(self, grace_seconds: float, program: str):
    self.grace_seconds = grace_seconds
    self._program = program
    self._signals = 0
    self._read_fd, self.write_fd = os.pipe()
    os.set_blocking(self.write_fd, False)
    signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
    for signum in SIGNALS:
      # A signal ignored when the process started stays ignored (a background
      # job of a shell script must not take the terminal's Ctrl-C).
      if signal.getsignal(signum) is not signal.SIG_IGN:
        signal.signal(signum, _python_handler)
    threading.Thread(target=self._watch, name='signal-watcher', daemon=True).start()

  def _watch(self) -> None:
    while True:
      for signum in os.read(self._read_fd, 64):
        if signum in SIGNALS:
          self._on_signal(signum)

  def _on_signal(self, signum: int) -> None:
    self._signals += 1
    name = signal.Signals(signum).name
    if self._signals > 1:
      self._exit_now(f'{self._program}: second signal ({name}): exiting at once without a '
                     'checkpoint; the previous checkpoint stays', 128 + signum)
    stop = current()
    if stop.requested:
      return  # a supervisor asked first; its status stands
    exit_code = 128 + signum
    # The timer first: logging could block on a full stdout pipe.
    timer = threading.Timer(self.grace_seconds, self._exit_now, args=(
        f'{self._program}: error: the stop after {name} took longer than '
        f'train_eval.shutdown_grace_seconds={self.grace_seconds:g}: exited without finishing '
        'its checkpoint; the previous checkpoint stays; run the same command to resume',
        exit_code))
    timer.daemon = True
    timer.start()
    # The line before the request: a process that stops fast (nothing to
    # checkpoint) could otherwise exit before this thread logs it.
    logging.warning('%s received: finishing the current iteration, then a checkpoint and exit '
                    '%d (within %g s; a second signal exits at once)', name, exit_code,
                    self.grace_seconds)
    if not stop.request_for_signal(signum):
      timer.cancel()  # a supervisor asked in between; its status and timing stand

  @staticmethod
  def _exit_now(line: str, exit_code: int) -> None:
    try:
      # Past a hold of fd 2 (`quiet.native_stderr`), whose lines would be lost.
      from harness.base import quiet  # pylint: disable=g-import-not-at-top
      os.write(quiet.stderr_fd(), (line + '\n').encode())
    finally:
      os._exit(exit_code)  # pylint: disable=protected-access


def _python_handler(signum, frame) -> None:  # pylint: disable=unused-argument
  """The Python-level handler: the C-level one has already written the signal
  number to the wakeup pipe, and the watcher thread does the work. Should a
  library have taken the wakeup fd over since, the number is passed on here."""
  if _WATCHER is None:
    return
  previous = signal.set_wakeup_fd(_WATCHER.write_fd, warn_on_full_buffer=False)
  if previous != _WATCHER.write_fd:
    signal.set_wakeup_fd(previous)
    try:
      os.write(_WATCHER.write_fd, bytes([signum]))
    except OSError:
      pass  # a full pipe already holds signals enough to act on


_WATCHER: Optional[_SignalWatcher] = None


def install_signal_handlers(grace_seconds: float, program: str) -> None:
  """SIGTERM/SIGINT stop the run gracefully (see the module doc); call from the main thread.

  Calling it again only updates the grace (the value bound in gin, once known).
  """
  global _WATCHER
  if _WATCHER is None:
    _WATCHER = _SignalWatcher(grace_seconds, program)
  else:
    _WATCHER.grace_seconds = grace_seconds
