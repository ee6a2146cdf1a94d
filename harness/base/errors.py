"""User errors: the `UsageError` type and helpers that keep them to one line.

Anything raised as `UsageError` ends a command with exit status 2 and a single
line on stderr that names the problem and the fix (see `harness.train`). The
helpers here turn gin's multi-line parse errors into such lines, and keep
library chatter (absl, ALE banners, gin's own logging) off stderr while the
input is being checked.
"""

from __future__ import annotations

import contextlib
import difflib
import inspect
import io
import os
import re
import sys
import tempfile
import tokenize
from typing import Iterator, List, Optional, Sequence, Tuple

import gin


class UsageError(Exception):
  """Bad input from the user: a wrong binding, value, file or environment."""

  exit_code = 2


def first_line(error: BaseException) -> str:
  """The first non-empty line of an error message.

  gin appends "In call to configurable ..." lines to exceptions that pass
  through a configurable; only the first line is ours.
  """
  for line in str(error).splitlines():
    if line.strip():
      return line.strip()
  return type(error).__name__


def report(program: str, error: BaseException, verbose: bool) -> None:
  """Prints `error` as one line on stderr (after its traceback when verbose)."""
  if verbose:
    import traceback  # pylint: disable=g-import-not-at-top
    traceback.print_exception(error)
  print(f'{program}: error: {first_line(error)}', file=sys.stderr, flush=True)


def log_to_stdout() -> None:
  """Sends absl logging to stdout, keeping stderr for problems only, and holds
  back the libraries' chatter unless --verbosity asks for it (`harness.base.quiet`).

  Call it inside `app.run`'s main (absl installs its handler there).
  """
  from harness.base import quiet  # pylint: disable=g-import-not-at-top
  quiet.setup_log()


@contextlib.contextmanager
def held_output(replay_on_error: bool = False) -> Iterator[None]:
  """Holds stderr (file descriptor 2) and absl log lines until the block ends.

  On success, or on an unexpected exception (a bug: its context helps), the
  held output is written out. On a `UsageError` it is dropped unless
  `replay_on_error`, so that a failed start shows only our one error line.
  stderr is held at the descriptor level because C++ code (TensorFlow, ALE)
  writes there directly, past `sys.stderr`.
  """
  from absl import logging  # pylint: disable=g-import-not-at-top
  handler = logging.get_absl_handler().python_handler
  log_stream, held_log = handler.stream, io.StringIO()
  sys.stderr.flush()
  saved = os.dup(2)
  replay = True
  with tempfile.TemporaryFile() as held:
    os.dup2(held.fileno(), 2)
    handler.stream = held_log
    try:
      yield
    except UsageError:
      replay = replay_on_error
      raise
    finally:
      handler.stream = log_stream
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      if replay:
        held.seek(0)
        sys.stderr.buffer.write(held.read())
        sys.stderr.flush()
        log_stream.write(held_log.getvalue())
        log_stream.flush()


# --- gin errors ---------------------------------------------------------------

_UNKNOWN_CONFIGURABLE = re.compile(r"No configurable matching (?:reference )?'@?([^'(]+)")
_UNKNOWN_PARAMETER = re.compile(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'")
_IN_FILE = re.compile(r'In file "([^"]+)", line (\d+)')
_IN_BINDINGS = re.compile(r'In bindings string line (\d+)')


def known_binding_names(harness_only: bool = False) -> List[str]:
  """Bindable `configurable.parameter` names in gin's registry (for suggestions).

  Parameters without a default (specs, counters, `root_dir`) are passed by the
  code, not bound, so they are left out.
  """
  names = []
  for _, configurable in gin.config._REGISTRY.items():  # pylint: disable=protected-access
    if harness_only and not (configurable.module or '').startswith('harness'):
      continue
    try:
      params = inspect.signature(configurable.wrapped).parameters
    except (TypeError, ValueError):
      continue
    for param in params.values():
      if (param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY) and
          param.default is not param.empty):
        names.append(f'{configurable.name}.{param.name}')
  return sorted(set(names))


def _known_configurable_names() -> List[str]:
  return sorted({c.name for _, c in gin.config._REGISTRY.items()})  # pylint: disable=protected-access


def suggest_binding(key: str) -> List[str]:
  """Known `configurable.parameter` names closest to the unknown `key`.

  The harness's own names come first: a user binding `train_eval.epsilon_greedy`
  means `make_agent.epsilon_greedy`, not one of tf-agents' classes.
  """
  param = key.rsplit('.', 1)[-1]
  for known in (known_binding_names(harness_only=True), known_binding_names()):
    # Right parameter on the wrong configurable first.
    same_param = [name for name in known if name.rsplit('.', 1)[-1] == param]
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.75)
    found = list(dict.fromkeys(same_param + close))[:3]
    if found:
      return found
  return []


def _location(message: str, gin_bindings: Sequence[str]) -> str:
  """Where a gin error happened: `file, line N` or the offending binding."""
  match = _IN_FILE.search(message)
  if match:
    return f'{match.group(1)}, line {match.group(2)}'
  match = _IN_BINDINGS.search(message)
  if match:
    text = _statement(message) or _binding_line(gin_bindings, int(match.group(1)))
    return f'--gin_bindings "{text}"'
  return ''


def _statement(message: str) -> str:
  """The offending statement that gin prints indented under its location."""
  lines = message.splitlines()
  for i, line in enumerate(lines[:-1]):
    if _IN_FILE.search(line) or _IN_BINDINGS.search(line):
      return lines[i + 1].strip()
  return ''


def _binding_line(gin_bindings: Sequence[str], line: int) -> str:
  lines = '\n'.join(gin_bindings).splitlines()
  return lines[line - 1].strip() if 0 < line <= len(lines) else ''


def _where(location: str) -> str:
  return f' (in {location})' if location else ''


def _unclosed_bracket_line(text: str) -> int:
  """Line of the outermost bracket still open when tokenizing fails; 0 if none."""
  opened = []
  try:
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
      if token.type == tokenize.OP and token.string in '([{':
        opened.append(token.start[0])
      elif token.type == tokenize.OP and token.string in ')]}' and opened:
        opened.pop()
  except tokenize.TokenError:
    return opened[0] if opened else -1
  return 0


def _untokenizable(gin_files: Sequence[str], gin_bindings: Sequence[str]) -> str:
  """The first gin file (with line) or binding that Python's tokenizer cannot read."""
  for path in gin_files:
    try:
      with open(path) as f:
        line = _unclosed_bracket_line(f.read())
    except OSError:
      continue
    if line:
      return path if line < 0 else f'{path}, line {line}'
  for binding in gin_bindings:
    if _unclosed_bracket_line(binding):
      return f'--gin_bindings "{binding}"'
  return ''


# Modules that moved into subpackages (the layout of docs/architecture.md): a gin
# file that still imports an old path gets the new one in its error line.
MOVED_MODULES = {
    'harness.actors': 'harness.distributed.actors',
    'harness.agents': 'harness.rl.agents',
    'harness.aggregate': 'harness.sweeps.aggregate',
    'harness.atari': 'harness.rl.atari',
    'harness.checkpoints': 'harness.rundir.checkpoints',
    'harness.cli': 'harness.base.cli',
    'harness.collect': 'harness.rl.collect',
    'harness.disk': 'harness.base.disk',
    'harness.distributed': 'harness.distributed.jobs',
    'harness.envs': 'harness.rl.envs',
    'harness.errors': 'harness.base.errors',
    'harness.evaluation': 'harness.run.evaluation',
    'harness.experiment': 'harness.run.experiment',
    'harness.exploration': 'harness.rl.exploration',
    'harness.frame_replay': 'harness.rl.frame_replay',
    'harness.host_policy': 'harness.rl.host_policy',
    'harness.learn': 'harness.rl.learn',
    'harness.loop': 'harness.run.loop',
    'harness.memory': 'harness.base.memory',
    'harness.metrics': 'harness.rundir.metrics',
    'harness.nstep': 'harness.rl.nstep',
    'harness.parts': 'harness.run.parts',
    'harness.quiet': 'harness.base.quiet',
    'harness.ray_launch': 'harness.distributed.ray_launch',
    'harness.ray_runtime': 'harness.base.ray_runtime',
    'harness.replay': 'harness.rl.replay',
    'harness.reporting': 'harness.run.reporting',
    'harness.results': 'harness.rundir.results',
    'harness.resume': 'harness.rundir.resume',
    'harness.run_dir': 'harness.rundir.directory',
    'harness.run_lock': 'harness.rundir.lock',
    'harness.settings': 'harness.run.settings',
    'harness.shutdown': 'harness.base.shutdown',
    'harness.single_process': 'harness.run.single_process',
    'harness.sweep_gate': 'harness.sweeps.gate',
    'harness.sweep_spec': 'harness.sweeps.spec',
    'harness.sweep_table': 'harness.sweeps.table',
    'harness.sweep_trial': 'harness.sweeps.trial',
    'harness.sweep_tune': 'harness.sweeps.tune',
    'harness.threads': 'harness.base.threads',
    'harness.tracking': 'harness.base.tracking',
    'harness.triggers': 'harness.run.triggers',
    'harness.video': 'harness.run.video',
}


def gin_usage_error(error: BaseException, gin_bindings: Sequence[str] = (),
                    gin_files: Sequence[str] = ()) -> UsageError:
  """Translates an exception from gin parsing into a one-line `UsageError`."""
  message = str(error)
  head = first_line(error)

  if isinstance(error, tokenize.TokenError):
    # An unclosed bracket or string: gin's tokenizer gives up at the end of input.
    where = _untokenizable(gin_files, gin_bindings) or 'the gin configuration'
    reason = error.args[0] if error.args else 'incomplete statement'
    return UsageError(f'gin syntax error in {where}: {reason} (an unclosed bracket or quote?); '
                      'close it')

  if isinstance(error, SyntaxError):
    if error.filename:
      where = f'{error.filename}, line {error.lineno}'
    else:
      where = f'--gin_bindings "{_binding_line(gin_bindings, error.lineno or 0) or error.text}"'
    return UsageError(f'gin syntax error in {where}: {error.msg.rstrip(".")}; fix the syntax '
                      f"there (values are Python literals, strings need quotes, e.g. "
                      f"make_env.env_id='CartPole-v1')")

  location = _location(message, gin_bindings)
  match = _UNKNOWN_PARAMETER.search(head)
  if match:
    key = f'{match.group(1).rsplit(".", 1)[-1]}.{match.group(2)}'
    return UsageError(f'unknown gin binding {key!r}{_where(location)}: ' + binding_hint(key))
  match = _UNKNOWN_CONFIGURABLE.search(head)
  if match:
    selector = match.group(1).strip()
    statement = _statement(message)
    key = statement.split('=', 1)[0].strip() if '=' in statement else ''
    if key and 'reference' not in head:
      return UsageError(f'unknown gin binding {key!r}{_where(location)}: ' + binding_hint(key))
    close = difflib.get_close_matches(selector, _known_configurable_names(), n=3, cutoff=0.6)
    hint = (f"did you mean {', '.join(repr(c) for c in close)}?" if close else
            'import the module that defines it at the top of the gin file')
    return UsageError(f'unknown gin configurable {selector!r}{_where(location)}: {hint}')
  if isinstance(error, ImportError):
    moved = _moved_module(error)
    if moved:
      old, new = moved
      return UsageError(f'{old} has moved to {new}{_where(location)}: change the line '
                        f'`import {old}` to `import {new}`')
    return UsageError(f'{head}{_where(location)}: install that module or fix the import line')
  if isinstance(error, OSError):
    return UsageError(f'{head.rstrip(".")}{_where(location)}: check the file path')
  return UsageError(f'bad gin configuration{_where(location)}: {head}')


def _moved_module(error: ImportError) -> Optional[Tuple[str, str]]:
  """(old, new) when `error` is the import of a module path that has moved."""
  name = getattr(error, 'name', None) or ''
  for old, new in MOVED_MODULES.items():
    if name == old or f"'{old}'" in str(error):
      return old, new
  return None


def binding_hint(key: str) -> str:
  """'did you mean ...?' for an unknown binding name, or what its configurable takes."""
  close = suggest_binding(key)
  if close:
    return f"did you mean {', '.join(repr(c) for c in close)}?"
  configurable = key.rsplit('.', 1)[0]
  params = [n.rsplit('.', 1)[-1] for n in known_binding_names()
            if n.rsplit('.', 1)[0] == configurable]
  if params:
    return f"{configurable} takes {', '.join(params)}"
  return 'check the name in the gin files under gin/'

