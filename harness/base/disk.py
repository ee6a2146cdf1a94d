"""Failed writes (a full disk): one translation into a one-line `WriteError`, exit status 1.

Every place that writes into the run directory (checkpoints, policy exports,
CSV rows, TensorBoard events, results.json, launch files, the lock) does so
inside `writing(path)`. A failed write there stops the run with one line that
names the path and what to do, instead of a traceback from deep inside a
library; the newest complete checkpoint stays as it was, so the same command
resumes once the cause is fixed.

What the libraries raise on a full disk (TF 2.15, dm-reverb 0.14; seen on a
small tmpfs):
  - Python file writes: `OSError` with errno ENOSPC.
  - TensorFlow (a checkpoint's `SaveV2`, `PolicySaver`'s variables and
    saved_model.pb, `tf.summary` events, `tf.io.gfile`):
    `tf.errors.ResourceExhaustedError`, "<path>; No space left on device".
  - Reverb's `Client.checkpoint()`: `IndexError` (Reverb's mapping of the
    RESOURCE_EXHAUSTED status), "<path>; No space left on device".
Only those are translated (TensorFlow's and Reverb's when their message names
the full disk or an exceeded quota); any other error passes through unchanged.
This module imports no TensorFlow: it recognises TensorFlow's error only when
TensorFlow is already loaded.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
from typing import Callable, Iterator, Optional

_NO_SPACE = os.strerror(errno.ENOSPC)  # 'No space left on device'
_QUOTA = os.strerror(errno.EDQUOT)  # 'Disk quota exceeded'
# "{{function_node ...}} /path/file; No space left on device [Op:SaveV2]" -> /path/file
_FAILED_PATH = re.compile(r'(?:^|\}\}\s*)([^;{}\n]+?);\s*(?:%s|%s)' % (re.escape(_NO_SPACE),
                                                                   re.escape(_QUOTA)))


class WriteError(Exception):
  """A write into the run directory failed (full disk, quota, I/O error): exit status 1."""

  exit_code = 1


def _space_problem(message: str) -> Optional[str]:
  if _NO_SPACE in message:
    return 'no space left on device'
  if _QUOTA in message:
    return 'disk quota exceeded'
  return None


def _is_library_write_error(error: BaseException) -> bool:
  """TensorFlow's or Reverb's error for a write that found the disk full."""
  tf = sys.modules.get('tensorflow')
  library_types = (IndexError,)  # Reverb
  if tf is not None:
    library_types += (tf.errors.ResourceExhaustedError,)
  return isinstance(error, library_types) and _space_problem(str(error)) is not None


def translate(error: BaseException, path: str) -> Optional[WriteError]:
  """The `WriteError` for a failed write of `path`; None if `error` is not one."""
  if isinstance(error, OSError):
    failed = error.filename or path
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
      return WriteError(f'{_space_problem(os.strerror(error.errno))} writing {failed}: free '
                        'space and run the same command to resume')
    reason = error.strerror or str(error) or type(error).__name__
    return WriteError(f'could not write {failed} ({reason}): fix that and run the same '
                      'command to resume')
  if _is_library_write_error(error):
    message = str(error)
    match = _FAILED_PATH.search(message)
    failed = match.group(1).strip() if match else path
    return WriteError(f'{_space_problem(message)} writing {failed}: free space and run the '
                      'same command to resume')
  return None


@contextlib.contextmanager
def writing(path: str, cleanup: Optional[Callable[[], None]] = None) -> Iterator[None]:
  """Turns a failed write of `path` inside the block into a `WriteError`.

  `cleanup` runs first when the write failed, e.g. to remove a half-written
  temporary file (it frees space; its own errors are ignored).
  """
  try:
    yield
  except WriteError:
    raise
  except Exception as e:  # pylint: disable=broad-except  (translate() picks what it knows)
    translated = translate(e, path)
    if translated is None:
      raise
    if cleanup is not None:
      try:
        cleanup()
      except Exception:  # pylint: disable=broad-except
        pass
    raise translated from e
