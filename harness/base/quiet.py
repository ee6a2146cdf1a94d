"""A quiet log: the harness's own lines on stdout, library chatter held back.

On a good run stdout carries only absl log lines written by `harness/` modules
(start-up summary, progress, evaluations, checkpoints, resume report, done) and
stderr only real problems. What libraries say on the way is held back unless
`--verbosity=1` (or higher) asks for it:

- Python log records of other modules (TensorFlow's SavedModel writer, tf-agents'
  PolicySaver and Checkpointer, gin) and Python warnings (autograph's
  `SyntaxWarning`s, deprecations) pass the absl handler only at ERROR and above;
  a few warnings that matter become one line of ours (`_TRANSLATIONS`).
- Reverb's C++ code logs with an unconditional `std::clog` (no level, no switch),
  so the calls that print its start, restore, checkpoint and stop lines run
  inside `native_stderr()`, which holds file descriptor 2 and lets through
  every line except the known informational ones (`NATIVE_CHATTER`).
- ALE's banner is switched off with its own logger mode (`quiet_ale`).
"""

from __future__ import annotations

import contextlib
import logging as std_logging
import os
import re
import sys
import tempfile
import threading
import warnings
from typing import Iterator, List, Optional, Pattern, Tuple

from absl import logging

# The harness package's folder (this file is in harness/base/): its modules' records pass.
_HARNESS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

# Lines that Reverb's C++ code writes on stderr on every good run (informational,
# though Reverb gives them no level). Any other line is a problem and passes.
NATIVE_CHATTER: Tuple[Pattern[str], ...] = tuple(re.compile(p) for p in (
    r'^\[reverb/cc/platform/tfrecord_checkpointer\.cc:\d+\]\s+(Initializing TFRecordCheckpointer'
    r'|Loading latest checkpoint|Loading checkpoint|Successfully loaded|No checkpoint found'
    r'|Restored|Writing checkpoint|Saving|Deleting)',
    r'^\[reverb/cc/platform/default/server\.cc:\d+\]\s+(Started replay server|Shutting down '
    r'replay server)',
    r'^\[reverb/cc/reverb_service_impl\.cc:\d+\]\s+Stored checkpoint to',
    r'^\[reverb/cc/client\.cc:\d+\]\s+Sampler and server are owned by the same process',
    # The in-process server confirms the writer's items late on a busy machine;
    # the observers flush at every checkpoint and at the end of a run.
    r'^\[reverb/cc/trajectory_writer\.cc:\d+\]\s+The number of pending items is alarmingly high',
))

_UNENDED = re.compile(r'^\[reverb/cc/platform/default/server\.cc:\d+\]\s+Shutting down replay server')

# Library warnings that matter, as one line of ours: (pattern, our line).
_TRANSLATIONS: Tuple[Tuple[Pattern[str], str], ...] = (
    (re.compile(r'triggered tf\.function retracing'),
     'TensorFlow retraced a function more than once (each trace costs time and memory in a '
     'long run); run with --verbosity=1 to see which'),
)


def verbose() -> bool:
  """True when `--verbosity` asks for the libraries' lines (1 = DEBUG or more)."""
  return logging.get_verbosity() >= logging.DEBUG


def is_harness_file(path: str) -> bool:
  return os.path.abspath(path).startswith(_HARNESS_DIR)


class LibraryFilter(std_logging.Filter):
  """Passes harness records, and other records only at ERROR or when verbose.

  A held-back warning that matters is logged once as a line of ours instead.
  """

  def __init__(self):
    super().__init__()
    self._translated = set()

  def filter(self, record: std_logging.LogRecord) -> bool:
    if is_harness_file(record.pathname) or record.levelno >= std_logging.ERROR or verbose():
      return True
    if record.levelno >= std_logging.WARNING:
      self._translate(record)
    return False

  def _translate(self, record: std_logging.LogRecord) -> None:
    try:
      message = record.getMessage()
    except Exception:  # pylint: disable=broad-except  (a library's bad format string)
      return
    for pattern, line in _TRANSLATIONS:
      if pattern.search(message) and line not in self._translated:
        self._translated.add(line)
        logging.warning('%s', line)


_FILTER = LibraryFilter()


def setup_log(to_stdout: bool = True) -> None:
  """Libraries' records held back, and (`to_stdout`) the absl log on stdout.

  Entry points call it inside `app.run`'s main. A Ray job passes
  `to_stdout=False`: its log already goes to its own file (`actors.JobLog`),
  and a Ray worker's `sys.stdout` is block-buffered, so lines sent there
  stayed unwritten until the buffer filled or were lost when the job was killed.
  """
  handler = logging.get_absl_handler().python_handler
  if to_stdout:
    handler.stream = sys.stdout
  if _FILTER not in handler.filters:
    handler.addFilter(_FILTER)
  # Python warnings (autograph's SyntaxWarnings on generated code, deprecations)
  # become log records of `py.warnings`, which the filter holds back.
  std_logging.captureWarnings(True)
  warnings.filterwarnings('ignore', message='Encoding a StructuredValue')
  level = std_logging.DEBUG if verbose() else std_logging.WARNING
  std_logging.getLogger('tensorflow').setLevel(level)


class _NativeStderr:
  """Holds file descriptor 2 in a temporary file while C++ code runs, then
  writes back every line except `NATIVE_CHATTER`. Nested and concurrent holds
  share one hold."""

  def __init__(self):
    self._lock = threading.Lock()
    self._depth = 0
    self._saved: Optional[int] = None
    self._file = None

  def __enter__(self) -> '_NativeStderr':
    with self._lock:
      self._depth += 1
      if self._depth == 1:
        if self._file is None:
          self._file = tempfile.TemporaryFile()  # pylint: disable=consider-using-with
        sys.stderr.flush()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
    return self

  def __exit__(self, *exc_info) -> None:
    with self._lock:
      self._depth -= 1
      if self._depth:
        return
      sys.stderr.flush()
      os.dup2(self._saved, 2)
      os.close(self._saved)
      self._saved = None
      size = os.fstat(self._file.fileno()).st_size
      if not size:
        return
      self._file.seek(0)
      held = self._file.read().decode(errors='replace')
      self._file.seek(0)
      self._file.truncate()
    kept = keep_lines(held)
    if kept:
      sys.stderr.write(kept)
      sys.stderr.flush()


def keep_lines(text: str) -> str:
  """`text` without the lines that match `NATIVE_CHATTER`.

  Reverb ends its 'Shutting down replay server' line without a newline, so
  whatever follows it on that line is kept.
  """
  kept: List[str] = []
  for line in text.splitlines(keepends=True):
    if any(pattern.match(line) for pattern in NATIVE_CHATTER):
      unended = _UNENDED.match(line)
      line = line[unended.end():] if unended else ''
    if line.strip():
      kept.append(line)
  return ''.join(kept)


_NATIVE = _NativeStderr()


def stderr_fd() -> int:
  """The descriptor that reaches the real stderr, even inside `native_stderr()`
  (a last line written with `os.write` before `os._exit`)."""
  saved = _NATIVE._saved  # pylint: disable=protected-access
  return 2 if saved is None else saved


@contextlib.contextmanager
def native_stderr() -> Iterator[None]:
  """Runs a block whose C++ code (Reverb) writes informational lines on stderr:
  they are dropped, anything else is written out when the block ends. With
  `--verbosity=1` or more, nothing is held."""
  if verbose():
    yield
    return
  with _NATIVE:
    yield


def quiet_ale() -> None:
  """ALE prints a banner on stderr for every new game unless told otherwise."""
  if verbose():
    return
  try:
    import ale_py  # pylint: disable=g-import-not-at-top
    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)
  except (ImportError, AttributeError):
    pass
