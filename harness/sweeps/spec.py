"""What a sweep is: its `--sweep` values, its points and trials, and `SWEEP/sweep.json`.

A `--sweep` flag is `NAME=[v1, v2, ...]` (gin literals: the grid is the product
of all lists) or, for `--search=optuna`, a range: `NAME=loguniform(a, b)`,
`uniform(a, b)` or `choice([v1, v2])`. Values are kept as the text the user
wrote, which is what goes into the trial's `--gin_bindings`, so a string or a
tuple reaches gin exactly as written.

The spec (gin files and their text, common bindings, sweeps, seeds, search,
number of trials) is written to `SWEEP/sweep.json` on the first launch; a later
launch on the same SWEEP must have the same spec.

Trial ids are derived from the point and the seed only (not from the launch
order), so the same trial has the same directory on every launch:
`learning_rate=0.001,seed=2`. This module imports neither TensorFlow nor Ray.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import itertools
import json
import math
import os
import re
import tokenize
from typing import Any, Dict, List, Optional, Sequence, Tuple

import gin
from gin import config_parser

from harness.base.errors import UsageError, first_line

SPEC_FILE = 'sweep.json'
TRIALS_DIR = 'trials'
LOGS_DIR = 'logs'
SEED_BINDING = 'train_eval.seed'
RANGE_KINDS = ('loguniform', 'uniform', 'choice')
SEARCHES = ('grid', 'optuna')
# A binding name: optional scope(s), configurable (may be dotted), parameter.
_NAME = re.compile(r'^[A-Za-z_][\w]*(?:[./][A-Za-z_]\w*)*\.[A-Za-z_]\w*$')
_RANGE = re.compile(r'^(loguniform|uniform|choice)\s*\((.*)\)$', re.S)
_SAFE = re.compile(r'[^A-Za-z0-9._+-]+')
_MAX_ID = 120

# A point: swept name -> value text (a gin literal), in the order of the --sweep flags.
Point = Dict[str, str]


@dataclasses.dataclass(frozen=True)
class Range:
  """An Optuna search range: `loguniform`/`uniform` (low, high) or `choice` (values)."""
  kind: str
  low: float = 0.0
  high: float = 0.0
  choices: Tuple[str, ...] = ()

  def to_json(self) -> Dict[str, Any]:
    if self.kind == 'choice':
      return {'choice': list(self.choices)}
    return {self.kind: [self.low, self.high]}


@dataclasses.dataclass(frozen=True)
class Sweep:
  """One `--sweep` flag: a list of values (grid) or a range (Optuna)."""
  name: str
  values: Tuple[str, ...] = ()
  range: Optional[Range] = None

  def to_json(self) -> Any:
    return list(self.values) if self.range is None else self.range.to_json()

  @property
  def options(self) -> Tuple[str, ...]:
    """The values a point can take when they are finite (list or choice)."""
    return self.range.choices if self.range is not None else self.values


# --- parsing --------------------------------------------------------------------


def split_top_level(text: str, flag: str) -> List[str]:
  """Items of a bracketed list `[a, b, ...]`, split at its top-level commas.

  Python's tokenizer reads the text, so commas inside strings, tuples or calls
  stay inside their item: `['a,b', (1, 2)]` has two items.
  """
  text = text.strip()
  if not text.startswith('['):
    raise UsageError(f'--sweep {flag!r}: the values must be a bracketed list, e.g. '
                     "--sweep='make_agent.learning_rate=[1e-3, 3e-4]'")
  items, depth, start = [], 0, None
  lines = text.splitlines(keepends=True)
  offsets = [0]
  for line in lines:
    offsets.append(offsets[-1] + len(line))

  def position(row_col: Tuple[int, int]) -> int:
    return offsets[row_col[0] - 1] + row_col[1]

  try:
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
      if token.type != tokenize.OP:
        continue
      if token.string in '([{':
        depth += 1
        if depth == 1:
          start = position(token.end)
      elif token.string in ')]}':
        depth -= 1
        if depth == 0:
          items.append(text[start:position(token.start)])
          end = position(token.end)
          if text[end:].strip():
            raise UsageError(f'--sweep {flag!r}: unexpected text after the list: '
                             f'{text[end:].strip()!r}')
          break
      elif token.string == ',' and depth == 1:
        items.append(text[start:position(token.start)])
        start = position(token.end)
  except (tokenize.TokenError, IndentationError, SyntaxError) as e:
    raise UsageError(f'--sweep {flag!r}: cannot read the list ({e.args[0]}): an unclosed '
                     'bracket or quote?') from e
  if depth != 0 or start is None:
    raise UsageError(f'--sweep {flag!r}: unclosed bracket; close the list with ]')
  items = [item.strip() for item in items]
  if items and items[-1] == '':  # A trailing comma: [a, b,]
    items.pop()
  if not items:
    raise UsageError(f'--sweep {flag!r}: the list is empty; give at least one value')
  if any(item == '' for item in items):
    raise UsageError(f'--sweep {flag!r}: an empty value between commas')
  return items


def check_literal(name: str, value: str, flag: str) -> None:
  """Raises `UsageError` unless `value` reads as one gin value."""
  delegate = gin.config.ParserDelegate(skip_unknown=True)
  try:
    statements = list(config_parser.ConfigParser(f'{name} = {value}', delegate))
  except (SyntaxError, ValueError, tokenize.TokenError) as e:
    msg = getattr(e, 'msg', None) or (e.args[0] if e.args else type(e).__name__)
    msg = first_line(ValueError(msg)).rstrip('.')
    raise UsageError(f'--sweep {flag!r}: {value!r} is not a gin value ({msg}); strings need '
                     "quotes, e.g. \"make_env.env_id=['CartPole-v1', 'Acrobot-v1']\"") from e
  if len(statements) != 1:
    raise UsageError(f'--sweep {flag!r}: {value!r} is not one gin value')


def _number(text: str, flag: str) -> float:
  try:
    value = float(text)
  except ValueError as e:
    raise UsageError(f'--sweep {flag!r}: {text!r} is not a number') from e
  if not math.isfinite(value):
    raise UsageError(f'--sweep {flag!r}: {text!r} must be finite')
  return value


def parse_range(name: str, kind: str, inner: str, flag: str) -> Range:
  """`loguniform(a, b)`, `uniform(a, b)` or `choice([...])` (the text inside the parentheses)."""
  if kind == 'choice':
    choices = tuple(split_top_level(inner, flag))
    for value in choices:
      check_literal(name, value, flag)
    return Range('choice', choices=_unique(choices, flag))
  bounds = split_top_level(f'[{inner}]', flag)
  if len(bounds) != 2:
    raise UsageError(f'--sweep {flag!r}: {kind} takes two numbers, e.g. {kind}(1e-4, 1e-2)')
  low, high = (_number(b, flag) for b in bounds)
  if not low < high:
    raise UsageError(f'--sweep {flag!r}: the low end {low:g} must be below the high end {high:g}')
  if kind == 'loguniform' and low <= 0:
    raise UsageError(f'--sweep {flag!r}: loguniform needs a positive low end (it was {low:g})')
  return Range(kind, low, high)


def _unique(values: Sequence[str], flag: str) -> Tuple[str, ...]:
  seen = set()
  for value in values:
    if value in seen:
      raise UsageError(f'--sweep {flag!r}: {value} is listed twice')
    seen.add(value)
  return tuple(values)


def parse_sweep(flag: str) -> Sweep:
  """One `--sweep` flag value -> `Sweep`; bad syntax is a one-line `UsageError`."""
  if '=' not in flag:
    raise UsageError(f"--sweep {flag!r}: expected NAME=[v1, v2, ...], e.g. "
                     "--sweep='make_agent.learning_rate=[1e-3, 3e-4]'")
  name, text = (part.strip() for part in flag.split('=', 1))
  if not _NAME.match(name):
    raise UsageError(f'--sweep {flag!r}: {name!r} is not a binding name '
                     '(configurable.parameter, e.g. make_agent.learning_rate)')
  if name == SEED_BINDING or name.endswith('/' + SEED_BINDING):
    raise UsageError(f'--sweep {flag!r}: seeds are not swept with --sweep; use --seeds=N or '
                     '--seed_list=0,1,2')
  match = _RANGE.match(text)
  if match:
    return Sweep(name, range=parse_range(name, match.group(1), match.group(2).strip(), flag))
  if re.match(r'^[A-Za-z_]\w*\s*\(', text):
    raise UsageError(f'--sweep {flag!r}: unknown range {text.split("(")[0]!r}; use '
                     'loguniform(a, b), uniform(a, b) or choice([...])')
  values = split_top_level(text, flag)
  for value in values:
    check_literal(name, value, flag)
  return Sweep(name, values=_unique(values, flag))


def parse_sweeps(flags: Sequence[str], search: str) -> List[Sweep]:
  """All `--sweep` flags; a name may appear once, ranges need `--search=optuna`."""
  sweeps = [parse_sweep(flag) for flag in flags]
  names = [s.name for s in sweeps]
  for name in names:
    if names.count(name) > 1:
      raise UsageError(f'--sweep {name}: swept twice; give all its values in one list')
  if search == 'grid':
    for sweep, flag in zip(sweeps, flags):
      if sweep.range is not None:
        raise UsageError(f'--sweep {flag!r}: {sweep.range.kind} is a search range; use it '
                         'with --search=optuna --num_trials=K, or give a list of values')
  return sweeps


def parse_seeds(seeds: Optional[int], seed_list: Optional[str]) -> List[int]:
  """`--seeds=N` (0..N-1) or `--seed_list=0,1,2`; neither: seed 0."""
  if seeds is not None and seed_list is not None:
    raise UsageError('--seeds and --seed_list both given: use one (--seeds=3 means seeds 0,1,2)')
  if seed_list is not None:
    try:
      values = [int(s) for s in seed_list.split(',') if s.strip()]
    except ValueError as e:
      raise UsageError(f'--seed_list={seed_list}: expected integers separated by commas, '
                       'e.g. --seed_list=0,1,2') from e
    if not values or len(set(values)) != len(values) or min(values) < 0:
      raise UsageError(f'--seed_list={seed_list}: give distinct non-negative integers, e.g. '
                       '--seed_list=0,1,2')
    return values
  if seeds is None:
    return [0]
  if seeds < 1:
    raise UsageError(f'--seeds={seeds} must be at least 1')
  return list(range(seeds))


# --- points and trial ids ------------------------------------------------------------


def short_names(names: Sequence[str]) -> Dict[str, str]:
  """Parameter names for ids and progress lines: `learning_rate`, or the full
  name where two swept names share a parameter name."""
  params = [n.rsplit('.', 1)[-1] for n in names]
  return {n: (p if params.count(p) == 1 else n.replace('/', '.')) for n, p in zip(names, params)}


def _digest(text: str, length: int = 6) -> str:
  return hashlib.sha1(text.encode()).hexdigest()[:length]


def _safe(value: str) -> str:
  text = _SAFE.sub('-', value).rstrip('-')
  if not value.startswith('-'):  # Keep a minus sign, drop a bracket turned into '-'.
    text = text.lstrip('-')
  return text or 'v'


def value_ids(options: Sequence[str]) -> Dict[str, str]:
  """Filesystem-safe ids of values: `'CartPole-v1'` -> `CartPole-v1`, `(64, 64)` -> `64-64`.

  Values that would share an id get a short hash of their text appended.
  """
  safe = {v: _safe(v) for v in options}
  counts: Dict[str, int] = {}
  for s in safe.values():
    counts[s] = counts.get(s, 0) + 1
  return {v: (s if counts[s] == 1 else f'{s}-{_digest(v)}') for v, s in safe.items()}


def value_id(sweep: Sweep, value: str) -> str:
  if sweep.options:
    return value_ids(sweep.options)[value]
  return value_ids([value])[value]  # A float from a loguniform/uniform range.


def point_id(sweeps: Sequence[Sweep], point: Point) -> str:
  """`learning_rate=0.001,gamma=0.99`; `base` when nothing is swept."""
  if not sweeps:
    return 'base'
  shorts = short_names([s.name for s in sweeps])
  text = ','.join(f'{shorts[s.name]}={value_id(s, point[s.name])}' for s in sweeps)
  if len(text) > _MAX_ID:
    text = f'{text[:_MAX_ID - 8]}-{_digest(json.dumps(point, sort_keys=True), 7)}'
  return text


def trial_id(sweeps: Sequence[Sweep], point: Point, seed: int) -> str:
  pid = point_id(sweeps, point)
  return f'seed={seed}' if pid == 'base' else f'{pid},seed={seed}'


def grid_points(sweeps: Sequence[Sweep]) -> List[Point]:
  """The product of all value lists, first sweep slowest."""
  lists = [[(s.name, v) for v in s.values] for s in sweeps]
  return [dict(combo) for combo in itertools.product(*lists)]


def point_bindings(point: Point) -> List[str]:
  return [f'{name}={value}' for name, value in point.items()]


def describe_point(sweeps: Sequence[Sweep], point: Point) -> str:
  """`learning_rate=0.001 gamma=0.99` for progress lines."""
  shorts = short_names([s.name for s in sweeps])
  return ' '.join(f'{shorts[s.name]}={point[s.name]}' for s in sweeps)


@dataclasses.dataclass(frozen=True)
class Trial:
  """One harness-train run of a sweep: a point and a seed."""
  trial_id: str
  point_id: str
  point: Point
  seed: int


def make_trial(sweeps: Sequence[Sweep], point: Point, seed: int) -> Trial:
  return Trial(trial_id(sweeps, point, seed), point_id(sweeps, point), dict(point), seed)


def trial_bindings(common: Sequence[str], point: Point, seed: int) -> List[str]:
  """The trial's bindings: common, then its point, then its seed (later ones win)."""
  return list(common) + point_bindings(point) + [f'{SEED_BINDING}={seed}']


def float_text(value: float) -> str:
  """A float from a search range as a gin literal (exact: repr round-trips)."""
  return repr(float(value))


# --- the spec ------------------------------------------------------------------


@dataclasses.dataclass
class Spec:
  """Everything that decides what the trials of a sweep are."""
  gin_files: List[str]
  gin_texts: List[str]
  bindings: List[str]
  sweeps: List[Sweep]
  seeds: List[int]
  search: str
  num_trials: Optional[int]

  def to_json(self) -> Dict[str, Any]:
    return {
        'gin_files': [{'path': p, 'text': t} for p, t in zip(self.gin_files, self.gin_texts)],
        'gin_bindings': list(self.bindings),
        'sweeps': {s.name: s.to_json() for s in self.sweeps},
        'seeds': list(self.seeds),
        'search': self.search,
        'num_trials': self.num_trials,
    }

  def first_difference(self, stored: Dict[str, Any]) -> Optional[str]:
    """What differs between this spec and a stored `sweep.json`; None when equal."""
    mine = self.to_json()
    theirs_files = stored.get('gin_files', [])
    for i, entry in enumerate(mine['gin_files']):
      if i >= len(theirs_files):
        return f'gin file {entry["path"]} was not in it'
      if entry['path'] != theirs_files[i].get('path'):
        return f'gin file {i + 1} is {entry["path"]}, it was {theirs_files[i].get("path")}'
      if entry['text'] != theirs_files[i].get('text'):
        return f'gin file {entry["path"]} has changed since the sweep started'
    if len(theirs_files) > len(mine['gin_files']):
      return f'gin file {theirs_files[len(mine["gin_files"])].get("path")} is missing'
    for key, label in (('gin_bindings', '--gin_bindings'), ('sweeps', '--sweep'),
                       ('seeds', 'seeds'), ('search', '--search'),
                       ('num_trials', '--num_trials')):
      if mine[key] != stored.get(key):
        return _describe(label, mine[key], stored.get(key))
    return None


def _describe(label: str, now: Any, then: Any) -> str:
  if isinstance(now, dict) and isinstance(then, dict):
    for name in list(now) + [n for n in then if n not in now]:
      if now.get(name) != then.get(name):
        return (f'{label} {name}: {_text(now.get(name))} now, {_text(then.get(name))} '
                'in the sweep')
  if isinstance(now, list) and isinstance(then, list):
    for a, b in itertools.zip_longest(now, then):
      if a != b:
        return f'{label}: {_text(a)} now, {_text(b)} in the sweep'
  return f'{label}: {_text(now)} now, {_text(then)} in the sweep'


def _text(value: Any) -> str:
  return 'none' if value is None else json.dumps(value)


def sweep_from_json(name: str, data: Any) -> Sweep:
  if isinstance(data, list):
    return Sweep(name, values=tuple(data))
  kind, args = next(iter(data.items()))
  if kind == 'choice':
    return Sweep(name, range=Range('choice', choices=tuple(args)))
  return Sweep(name, range=Range(kind, float(args[0]), float(args[1])))


def spec_from_json(data: Dict[str, Any]) -> Spec:
  return Spec(gin_files=[f['path'] for f in data['gin_files']],
              gin_texts=[f['text'] for f in data['gin_files']],
              bindings=list(data['gin_bindings']),
              sweeps=[sweep_from_json(n, v) for n, v in data['sweeps'].items()],
              seeds=list(data['seeds']), search=data['search'], num_trials=data['num_trials'])


def spec_path(root: str) -> str:
  return os.path.join(root, SPEC_FILE)


def read_spec(root: str) -> Optional[Dict[str, Any]]:
  """The stored spec of SWEEP, or None when there is none."""
  try:
    with open(spec_path(root)) as f:
      return json.load(f)
  except FileNotFoundError:
    return None
  except (OSError, ValueError) as e:
    raise UsageError(f'{spec_path(root)} cannot be read ({e}): is --root_dir a sweep '
                     'directory?') from e


def write_spec(root: str, spec: Spec) -> None:
  atomic_write(spec_path(root), json.dumps(spec.to_json(), indent=2) + '\n')


def atomic_write(path: str, text: str) -> None:
  """Writes `text` to a temporary file beside `path`, then renames it over `path`."""
  tmp = f'{path}.tmp{os.getpid()}'
  with open(tmp, 'w') as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def read_gin_files(paths: Sequence[str]) -> Tuple[List[str], List[str]]:
  """Absolute paths and texts of the gin files; a missing one is a `UsageError`."""
  absolute, texts = [], []
  for path in paths:
    if not os.path.isfile(path):
      raise UsageError(f'gin file {path!r} does not exist: check the --gin_file path '
                       '(relative paths start at the current directory)')
    absolute.append(os.path.abspath(path))
    with open(path) as f:
      texts.append(f.read())
  return absolute, texts


def trial_dir(root: str, tid: str) -> str:
  return os.path.join(root, TRIALS_DIR, tid)


def log_path(root: str, tid: str) -> str:
  return os.path.join(root, LOGS_DIR, f'{tid}.log')
