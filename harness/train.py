"""`harness-train`: the one entry point (`python -m harness.train` is the same).

Parses flags and gin, then hands over to `experiment.train_eval`. Bad input ends
with one line on stderr and exit status 2; `--verbosity=1` adds the traceback.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import List, Sequence

from absl import app
from absl import flags
from absl import logging
import gin

from harness import experiment  # pylint: disable=unused-import  (registers configurables)
from harness.errors import UsageError
import harness

_ROOT_DIR = flags.DEFINE_string('root_dir', None, 'Run directory; an existing run there is resumed.')
_GIN_FILE = flags.DEFINE_multi_string('gin_file', [], 'Gin files, applied in order.')
_GIN_BINDINGS = flags.DEFINE_multi_string(
    'gin_bindings', [], 'Gin bindings, applied after the files (so they win).')
_JOB = flags.DEFINE_enum('job', 'all', ['all', 'replay', 'collect', 'learn', 'eval'],
                         'Which job this process runs; `all` runs everything in one process.')
_REPLAY_ADDRESS = flags.DEFINE_string(
    'replay_address', None, 'host:port of a Reverb server for the connecting jobs.')


def parse_gin(gin_files: Sequence[str], gin_bindings: Sequence[str]) -> None:
  """Parses gin files then bindings; errors become `UsageError`s."""
  for path in gin_files:
    if not os.path.isfile(path):
      raise UsageError(f'gin file {path!r} does not exist: check the --gin_file path')
    # A gin file may `import my_envs` from its own folder.
    folder = os.path.dirname(os.path.abspath(path))
    if folder not in sys.path:
      sys.path.insert(0, folder)
  try:
    gin.parse_config_files_and_bindings(list(gin_files), list(gin_bindings),
                                        finalize_config=True)
  except (ValueError, SyntaxError, ImportError, KeyError) as e:
    first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UsageError(f'bad gin configuration: {first_line}') from e


def main(argv: List[str]) -> None:
  if len(argv) > 1:
    raise UsageError(f'unexpected arguments {argv[1:]}: use --flag=value forms')
  if not _ROOT_DIR.value:
    raise UsageError('--root_dir is required: e.g. --root_dir=runs/cartpole')
  if _JOB.value != 'all':
    raise UsageError(f'--job={_JOB.value} is not available yet: use --job=all')
  harness.quiet_tensorflow_logs()
  parse_gin(_GIN_FILE.value, _GIN_BINDINGS.value)
  experiment.train_eval(root_dir=_ROOT_DIR.value, replay_address=_REPLAY_ADDRESS.value)


def _main_with_clean_errors(argv: List[str]) -> None:
  try:
    main(argv)
  except UsageError as e:
    if logging.get_verbosity() >= logging.DEBUG:
      traceback.print_exc()
    print(f'harness-train: error: {e}', file=sys.stderr)
    sys.exit(UsageError.exit_code)


def run() -> None:
  """Console-script entry point."""
  app.run(_main_with_clean_errors)


if __name__ == '__main__':
  run()
