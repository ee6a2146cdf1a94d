"""What every command line shares: `--help` that lists the command's own flags,
bad flags as one line (exit 2), the quiet log on stdout, `UsageError` as one line.

absl's `--help` lists the flags of `__main__` only, which for a console script
(`harness-train`) is the script wrapper: it printed `USAGE: harness-train
[flags]` and nothing else. Here `--help` (`-h`, `--helpshort`) prints the
command's summary, its own flags one line each (those its module defines, in
order), `--verbosity` and `--helpfull`, and an example; absl's and TensorFlow's
flags stay in `--helpfull`.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import sys
from typing import Callable, List, NoReturn, Sequence, Tuple, Type

from absl import flags

from harness.base import errors
from harness.base.errors import UsageError

HELP_ARGS = ('--help', '-h', '-?', '--helpshort', '--help=true', '--helpshort=true')
_MAX_LINE = 120


@dataclasses.dataclass(frozen=True)
class Command:
  """What `--help` says about a command.

  Attributes:
    program: the command's name, e.g. `harness-train`.
    summary: one sentence: what it does.
    usage: the synopsis after the program name.
    example: one example command line (without a shell prompt).
    module: the module whose flags are the command's own (its `__name__`).
  """
  program: str
  summary: str
  usage: str
  example: str
  module: str


def own_flags(module: str) -> List[flags.Flag]:
  """The flags that `module` defines, in the order it defines them."""
  found = sys.modules.get(module)
  holders = [value for value in vars(found).values()
             if isinstance(value, flags.FlagHolder)] if found else []
  return [flags.FLAGS[holder.name] for holder in holders if holder.name in flags.FLAGS]


_ABSL_SUFFIX = '; repeat this option to specify a list of values'


def _flag_name(flag: flags.Flag) -> str:
  if isinstance(flag, flags.BooleanFlag):
    return f'--[no]{flag.name}'
  if isinstance(flag, flags.MultiFlag):
    return f'--{flag.name}=... (repeatable)'
  if isinstance(flag, flags.EnumFlag) or getattr(flag.parser, 'enum_values', None):
    return f'--{flag.name}={"|".join(flag.parser.enum_values)}'
  return f'--{flag.name}'


def _help(flag: flags.Flag) -> str:
  """The flag's own help, without what absl adds (enum values, the repeat note)."""
  text = ' '.join((flag.help or '').split()).replace(_ABSL_SUFFIX, '')
  values = getattr(flag.parser, 'enum_values', None)
  if values:
    text = text.replace(f'<{"|".join(values)}>: ', '')
  return text


def _default(flag: flags.Flag) -> str:
  value = flag.default
  if value in (None, '', [], ()) or isinstance(flag, flags.BooleanFlag) and not value:
    return ''
  if isinstance(flag, flags.BooleanFlag):
    return ' (default: on)'
  return f' (default: {flag.default_as_str or value})'.replace("'", '')


def _one_line(text: str, default: str) -> str:
  """`text` + `default` in at most `_MAX_LINE` characters: the first sentence
  when the whole is too long, cut with '...' only when that is too."""
  if len(text + default) > _MAX_LINE:
    first, dot, rest = text.partition('. ')
    if dot and rest:
      text = first + '.'
  if len(text + default) > _MAX_LINE:
    text = text[:max(10, _MAX_LINE - len(default) - 3)].rstrip() + '...'
  return text + default


def help_text(command: Command) -> str:
  """The text of `--help`: summary, usage, own flags (one line each), example."""
  own = own_flags(command.module)
  rows = [(_flag_name(f), _one_line(_help(f), _default(f))) for f in own]
  rows += [('--verbosity=1', 'Also show the libraries\' log lines (TensorFlow, tf-agents, '
            'Reverb) and tracebacks'),
           ('--helpfull', 'Every flag, absl\'s and TensorFlow\'s included')]
  width = max(len(name) for name, _ in rows) + 2
  lines = [f'{command.program}: {command.summary}', '',
           f'usage: {command.program} {command.usage}', '', 'flags:']
  lines += [f'  {name.ljust(width)}{text}' for name, text in rows]
  lines += ['', 'example:', f'  {command.example}']
  return '\n'.join(lines) + '\n'


def wants_help(argv: Sequence[str]) -> bool:
  for arg in argv[1:]:
    if arg == '--':
      return False
    if arg in HELP_ARGS:
      return True
  return False


def flags_parser(command: Command) -> Callable[[List[str]], List[str]]:
  """A `flags_parser` for `absl.app.run`: our `--help`, and a bad flag as one
  line on stderr with exit status 2."""

  def parse(argv: List[str]) -> List[str]:
    if wants_help(argv):
      sys.stdout.write(help_text(command))
      sys.stdout.flush()
      sys.exit(0)
    return _parse_or_exit(command.program, argv)

  return parse


def plain_flags_parser(program: str) -> Callable[[List[str]], List[str]]:
  """absl's flag parsing (and help), with a bad flag as one line and exit status 2."""
  return lambda argv: _parse_or_exit(program, argv)


def _parse_or_exit(program: str, argv: List[str]) -> List[str]:
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f'{program}: error: {e}; see {program} --help', file=sys.stderr)
    sys.exit(UsageError.exit_code)


def run_app(program: str, main: Callable[[List[str]], object], command=None,
            reported: Tuple[Type[Exception], ...] = (),
            silent: Tuple[Type[Exception], ...] = ()) -> None:
  """`absl.app.run(main)`, with the log on stdout and a UsageError as one line, exit 2.

  With `command` (a `Command`), `--help` lists the command's own flags. An
  exception of a type in `reported` is one line too, one in `silent` (already
  logged where it was raised) is not; both end with their `exit_code` (1 if
  none). What `main` returns is the exit status.
  """
  from absl import app, logging  # pylint: disable=g-import-not-at-top

  def main_with_clean_errors(argv: List[str]) -> None:
    errors.log_to_stdout()
    verbose = logging.get_verbosity() >= logging.DEBUG
    try:
      code = main(argv)
    except UsageError as e:
      errors.report(program, e, verbose)
      sys.exit(UsageError.exit_code)
    except reported as e:  # pylint: disable=catching-non-exception
      errors.report(program, e, verbose)
      sys.exit(getattr(e, 'exit_code', 1))
    except silent as e:  # pylint: disable=catching-non-exception
      sys.exit(getattr(e, 'exit_code', 1))
    sys.exit(code)

  app.run(main_with_clean_errors,
          flags_parser=flags_parser(command) if command else plain_flags_parser(program))


def exit_without_teardown(code: object) -> NoReturn:
  """Ends the process as `sys.exit(code)` would, minus the native teardown.

  After a run has written and closed everything, the interpreter still tears
  down TensorFlow and Reverb: their C++ destructors (no Python frame left)
  took 0.1 s on an idle machine and 20 s with two other runs starting beside
  it (measured on harness-train exits in a sweep). The atexit handlers still
  run (logging, W&B) and the standard streams are flushed; then `os._exit`.
  """
  if code is None:
    status = 0
  elif isinstance(code, int):
    status = code
  else:  # sys.exit('message'): the message on stderr, status 1
    print(code, file=sys.stderr)
    status = 1
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  os._exit(status)  # pylint: disable=protected-access
