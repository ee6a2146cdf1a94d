"""One writer per run directory: an exclusive `fcntl.flock` on ROOT/.lock.

A launch that trains (`--job=all`, or the learner of a distributed run) takes
the lock before it writes anything and holds it for the life of the process;
the operating system releases it when the process ends, however it ends, so a
killed run never leaves a stale lock. The holder writes its pid, host and start
time into the file (information only: the flock is the lock). A second launch
on a held ROOT gets a one-line `UsageError` naming the holder, and touches
nothing: it opens the file without truncating it and writes nothing.

A launch that is refused after taking the lock (bad input found while opening
the run, e.g. a changed network shape) puts ROOT back as it was: the file's
previous bytes, or no file (and no ROOT) when this launch created them.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from typing import Dict, Iterator, List, Optional

from harness.base import disk
from harness.base.errors import UsageError

LOCK_FILE = '.lock'

# Locks this process holds, by real path: a second launch in the same process
# (a supervisor running jobs in-process) reuses its own lock.
_HELD: Dict[str, 'RunLock'] = {}


def lock_path(root_dir: str) -> str:
  return os.path.join(root_dir, LOCK_FILE)


def _missing_dirs(path: str) -> List[str]:
  """The directories of `path` that do not exist yet, outermost first."""
  missing = []
  path = os.path.abspath(path)
  while not os.path.exists(path):
    missing.append(path)
    path = os.path.dirname(path)
  return missing[::-1]


def _remove_empty(created: List[str]) -> None:
  """Removes the directories a refused launch created, innermost first, if still empty."""
  for folder in reversed(created):
    with contextlib.suppress(OSError):  # not empty: something else lives there now
      os.rmdir(folder)


def _holder_text(fd: int) -> str:
  """'pid P on host H' from the lock file's contents (as far as they can be read)."""
  try:
    info = json.loads(os.pread(fd, 4096, 0).decode() or '{}')
  except (OSError, ValueError):
    info = {}
  if not isinstance(info, dict):
    info = {}
  return f"pid {info.get('pid', 'unknown')} on host {info.get('host', 'unknown')}"


class RunLock:
  """The held lock of one run directory (see the module doc)."""

  def __init__(self, root_dir: str, fd: int, previous: Optional[bytes], created: List[str]):
    self.root_dir = root_dir
    self.path = lock_path(root_dir)
    self._fd: Optional[int] = fd
    self._previous = previous  # the file's bytes before this launch; None if it created it
    self._created = created  # directories this launch created, outermost first

  @classmethod
  def acquire(cls, root_dir: str, job: str) -> 'RunLock':
    """Takes the lock of `root_dir` and records this process as the holder.

    Raises `UsageError` (ROOT untouched) when another process holds it.
    """
    key = os.path.realpath(root_dir)
    if key in _HELD:
      return _HELD[key]
    path = lock_path(root_dir)
    created = _missing_dirs(root_dir)
    with disk.writing(path):
      os.makedirs(root_dir, exist_ok=True)
      existed = os.path.exists(path)
      fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      holder = _holder_text(fd)
      os.close(fd)
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
        raise UsageError(f'{root_dir} is in use by {holder} ({path}): wait for that run to '
                         'end or stop it; a run directory takes one writer') from e
      if not existed:  # e.g. ENOLCK: a filesystem without locks; leave ROOT as it was
        os.remove(path)
        _remove_empty(created)
      raise UsageError(f'cannot lock {path} ({e.strerror}): use a --root_dir on a filesystem '
                       'that supports flock') from e
    previous = os.pread(fd, os.fstat(fd).st_size, 0) if existed else None
    lock = cls(root_dir, fd, previous, created)
    _HELD[key] = lock
    lock._record_holder(job)  # pylint: disable=protected-access
    return lock

  def _record_holder(self, job: str) -> None:
    info = {'pid': os.getpid(), 'host': socket.gethostname(), 'job': job,
            'started': time.strftime('%Y-%m-%dT%H:%M:%S%z')}
    self._write((json.dumps(info) + '\n').encode())

  def _write(self, data: bytes) -> None:
    with disk.writing(self.path):
      os.ftruncate(self._fd, 0)
      os.pwrite(self._fd, data, 0)

  def restore(self) -> None:
    """Puts ROOT back as it was before `acquire` (a refused launch), then releases."""
    try:
      if self._previous is not None:
        self._write(self._previous)
      else:
        os.remove(self.path)
        _remove_empty(self._created)
    finally:
      self.release()

  def release(self) -> None:
    """Releases the lock now (the operating system does it at exit otherwise)."""
    _HELD.pop(os.path.realpath(self.root_dir), None)
    if self._fd is not None:
      os.close(self._fd)  # closing the last descriptor drops the flock
      self._fd = None


@contextlib.contextmanager
def hold(root_dir: str, job: str) -> Iterator[RunLock]:
  """Holds the lock of `root_dir` for the block and beyond (until the process ends).

  A `UsageError` out of the block means the launch was refused: ROOT is put
  back as it was (`RunLock.restore`).
  """
  lock = RunLock.acquire(root_dir, job)
  try:
    yield lock
  except UsageError:
    lock.restore()
    raise
