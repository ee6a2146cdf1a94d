"""`harness-sweep`: seeds x settings (grid) or an Optuna search, as harness-train runs on Ray.

```
harness-sweep --root_dir=SWEEP --gin_file=F [--gin_bindings=B ...]
              [--sweep='NAME=[v1, v2]' ...] [--seeds=N | --seed_list=0,1,2]
              [--search=grid|optuna] [--num_trials=K] [--max_concurrent=C]
              [--cpus_per_trial=1] [--ray_address=auto|host:port]
```

Every trial is one `harness-train` process in `SWEEP/trials/<trial_id>/`, a
normal run directory; Ray Tune schedules them (see `sweep_trial`). The driver
checks the input first (bad input: one line on stderr, exit 2, nothing in SWEEP
written), keeps `SWEEP/trials.csv` and `SWEEP/summary.csv` up to date as trials
finish, and draws `SWEEP/summary.png` at the end.

Resume is ours, not Tune's: every launch derives all trials from the spec and
the run directories. A trial with results.json is done; a failed trial runs
again while it has failed fewer than `MAX_FAILURES` times; any other trial is
(re)submitted, and harness-train resumes it from its own checkpoint.

The sweep never imports TensorFlow or the training code: it validates the
common configuration with `harness-train --check_only` in a subprocess.
"""

from __future__ import annotations

import logging as std_logging
from logging import handlers as log_handlers
import math
import os
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from absl import flags
from absl import logging
from gin import config_parser
import gin

from harness import aggregate
from harness import cli
from harness import errors
from harness import results
from harness import sweep_spec
from harness.errors import UsageError
from harness.sweep_spec import Spec, Sweep

_ROOT_DIR = flags.DEFINE_string('root_dir', None, 'Sweep directory; an existing sweep there '
                                'is resumed.')
_GIN_FILE = flags.DEFINE_multi_string('gin_file', [], 'Gin files of every trial, in order.')
_GIN_BINDINGS = flags.DEFINE_multi_string('gin_bindings', [], 'Bindings of every trial.')
_SWEEP = flags.DEFINE_multi_string(
    'sweep', [], "NAME=[v1, v2, ...] (gin values; the grid is the product of all lists), or "
    'for --search=optuna NAME=loguniform(a, b) | uniform(a, b) | choice([...]).')
_SEEDS = flags.DEFINE_integer('seeds', None, 'Seeds 0..N-1 of every point (default: 1).')
_SEED_LIST = flags.DEFINE_string('seed_list', None, 'Seeds of every point, e.g. 0,1,2.')
_SEARCH = flags.DEFINE_enum('search', 'grid', list(sweep_spec.SEARCHES),
                            'grid: every combination; optuna: TPE with ASHA early stopping.')
_NUM_TRIALS = flags.DEFINE_integer('num_trials', None, '--search=optuna: points to try.')
_MAX_CONCURRENT = flags.DEFINE_integer(
    'max_concurrent', None, 'Tune trials running at once (default: as many as the CPUs allow).')
_CPUS_PER_TRIAL = flags.DEFINE_float('cpus_per_trial', 1.0,
                                     'CPUs Ray reserves for each harness-train process.')
_RAY_ADDRESS = flags.DEFINE_string(
    'ray_address', None, 'auto or host:port of a running Ray cluster; default: start Ray '
    'here, on localhost only, for this sweep.')

_TRACK = flags.DEFINE_bool(
    'track', False, 'Pass --track to every trial: one W&B run per trial, one W&B group per '
    "sweep (the sweep directory's name). Needs pip install -e '.[wandb]'.")

_PROGRAM = 'harness-sweep'
MAX_FAILURES = 2  # A failed trial is retried once: run again while failures < 2.
TUNE_DIR = '.tune'
RAY_LOG = 'ray.log'
# ASHA: halve the points at env-step rungs from a quarter of the run.
ASHA_REDUCTION = 2
ASHA_FIRST_RUNG = 0.25
SEARCH_SEED = 0
# train_eval's own defaults (harness/experiment.py), for ASHA's rungs when the
# gin files do not bind them.
_DEFAULT_NUM_ENV_STEPS = 50_000
_DEFAULT_EVAL_INTERVAL = 5_000


# --- input ----------------------------------------------------------------------------


def read_spec_from_flags() -> Spec:
  """The spec of this launch, from the flags; bad input is a `UsageError`."""
  if not _GIN_FILE.value:
    raise UsageError('--gin_file is required: e.g. --gin_file=gin/ddqn_cartpole.gin')
  search = _SEARCH.value
  sweeps = sweep_spec.parse_sweeps(_SWEEP.value, search)
  seeds = sweep_spec.parse_seeds(_SEEDS.value, _SEED_LIST.value)
  for binding in _GIN_BINDINGS.value:
    name = binding.split('=', 1)[0].strip()
    if name == sweep_spec.SEED_BINDING:
      raise UsageError(f'--gin_bindings "{binding}": a sweep sets train_eval.seed itself; '
                       'use --seeds=N or --seed_list=0,1,2')
  num_trials = _NUM_TRIALS.value
  if search == 'optuna':
    if num_trials is None or num_trials < 1:
      raise UsageError('--search=optuna needs --num_trials=K (K >= 1): the number of points '
                       'to try')
    if not sweeps:
      raise UsageError("--search=optuna needs at least one --sweep range, e.g. "
                       "--sweep='make_agent.learning_rate=loguniform(1e-4, 1e-2)'")
  elif num_trials is not None:
    raise UsageError('--num_trials goes with --search=optuna; a grid runs every combination')
  if _MAX_CONCURRENT.value is not None and _MAX_CONCURRENT.value < 1:
    raise UsageError(f'--max_concurrent={_MAX_CONCURRENT.value} must be at least 1')
  if not _CPUS_PER_TRIAL.value > 0:
    raise UsageError(f'--cpus_per_trial={_CPUS_PER_TRIAL.value} must be positive')
  paths, texts = sweep_spec.read_gin_files(_GIN_FILE.value)
  return Spec(paths, texts, list(_GIN_BINDINGS.value), sweeps, seeds, search, num_trials)


def check_root(root: Optional[str]) -> str:
  """The absolute sweep directory; a file, or a directory that is no sweep, is refused."""
  if not root:
    raise UsageError('--root_dir is required: e.g. --root_dir=runs/sweep')
  path = os.path.abspath(root)
  if os.path.exists(path) and not os.path.isdir(path):
    raise UsageError(f'--root_dir={root} is a file, not a directory')
  if (os.path.isdir(path) and os.listdir(path) and
      not os.path.exists(sweep_spec.spec_path(path))):
    raise UsageError(f'--root_dir={root} is a directory without {sweep_spec.SPEC_FILE}: not '
                     'a sweep; pass a new or empty directory, or an existing sweep')
  existing = path
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.access(existing, os.W_OK | os.X_OK):
    raise UsageError(f'--root_dir={root} is not writable ({existing})')
  return path


def check_same_spec(root: str, spec: Spec) -> bool:
  """True when SWEEP already holds this spec; False when it is new; `UsageError` otherwise."""
  stored = sweep_spec.read_spec(root)
  if stored is None:
    return False
  difference = spec.first_difference(stored)
  if difference:
    raise UsageError(f'--root_dir={_ROOT_DIR.value} holds another sweep: {difference}; run '
                     'its own command to resume it, or pass a new --root_dir')
  return True


def start_check(spec: Spec) -> subprocess.Popen:
  """Starts `harness-train --check_only` on the common config and the swept names.

  Values of single points are not checked here: a bad one fails its own
  trials, and the others go on. It runs while Ray starts (`finish_check`).
  """
  cmd = [sys.executable, '-m', 'harness.train', '--check_only']
  cmd += [f'--gin_file={p}' for p in spec.gin_files]
  cmd += [f'--gin_bindings={b}' for b in spec.bindings]
  cmd += [f'--check_names={s.name}' for s in spec.sweeps]
  return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          stdin=subprocess.DEVNULL)


def finish_check(check: subprocess.Popen) -> None:
  """Waits for the check; its error line becomes ours (exit 2)."""
  try:
    _, stderr = check.communicate(timeout=600)
  except subprocess.TimeoutExpired as e:
    check.kill()
    check.communicate()
    raise UsageError('harness-train --check_only did not finish in 600 s') from e
  if check.returncode == 0:
    return
  lines = [l for l in stderr.splitlines() if l.strip()]
  prefix = 'harness-train: error:'
  message = next((l[len(prefix):].strip() for l in reversed(lines) if l.startswith(prefix)),
                 lines[-1] if lines else f'exit status {check.returncode}')
  if check.returncode == UsageError.exit_code:
    raise UsageError(message)
  raise RuntimeError(f'harness-train --check_only failed (exit {check.returncode}): {message}')


def bound_int(spec: Spec, name: str, default: int) -> int:
  """The value of `name` in the gin files and bindings (last one wins; swept: the
  largest value), read with gin's parser without importing the configurables."""
  value = default
  delegate = gin.config.ParserDelegate(skip_unknown=True)
  for text in list(spec.gin_texts) + list(spec.bindings):
    try:
      for statement in config_parser.ConfigParser(text, delegate):
        if (isinstance(statement, config_parser.BindingStatement) and not statement.scope
            and f'{statement.selector}.{statement.arg_name}' == name
            and isinstance(statement.value, int)):
          value = statement.value
    except (SyntaxError, ValueError):
      continue
  for sweep in spec.sweeps:
    if sweep.name == name and sweep.values:
      numbers = [int(v) for v in sweep.values if v.strip().isdigit()]
      value = max(numbers) if numbers else value
  return value


# --- the record of trials -------------------------------------------------------------


class TrialTable:
  """Rows of trials.csv, kept in memory and rewritten (with summary.csv) on change."""

  def __init__(self, root: str, spec: Spec):
    self.root = root
    self.spec = spec
    self.swept = [s.name for s in spec.sweeps]
    self.rows: Dict[str, Dict[str, Any]] = {}
    self._summary_cache: Dict[Tuple, Dict[str, Any]] = {}
    stored = aggregate.read_csv(os.path.join(root, aggregate.TRIALS_FILE))
    if spec.search == 'grid':
      for point in sweep_spec.grid_points(spec.sweeps):
        for seed in spec.seeds:
          self._add(sweep_spec.make_trial(spec.sweeps, point, seed))
    else:  # Optuna: the points tried so far are those in trials.csv.
      for row in stored:
        point = {name: row.get(name, '') for name in self.swept}
        self._add(sweep_spec.make_trial(spec.sweeps, point, int(row['seed'])))
    by_id = {row['trial_id']: row for row in stored}
    for tid, row in self.rows.items():
      self._restore(row, by_id.get(tid))

  @property
  def total(self) -> int:
    if self.spec.search == 'optuna':
      return (self.spec.num_trials or 0) * len(self.spec.seeds)
    return len(self.rows)

  def _add(self, trial: sweep_spec.Trial) -> Dict[str, Any]:
    if trial.trial_id not in self.rows:
      self.rows[trial.trial_id] = {
          'trial_id': trial.trial_id, **trial.point, 'seed': trial.seed, 'status': 'pending',
          'error': '', 'attempts': 0, 'failures': 0, 'wall_seconds': 0.0,
          '_point': trial.point, '_point_id': trial.point_id}
    return self.rows[trial.trial_id]

  def _restore(self, row: Dict[str, Any], stored: Optional[Dict[str, str]]) -> None:
    """A row's state from trials.csv and its run directory."""
    if stored:
      row['attempts'] = int(aggregate.number(stored.get('attempts')) or 0)
      failures = aggregate.number(stored.get('failures'))
      row['failures'] = int(failures) if math.isfinite(failures) else 0
      wall = aggregate.number(stored.get('wall_seconds'))
      row['wall_seconds'] = wall if math.isfinite(wall) else 0.0
      if stored.get('status') in ('failed', 'stopped'):
        row['status'] = stored['status']
        row['error'] = stored.get('error', '')
    res = results.read_results(sweep_spec.trial_dir(self.root, row['trial_id']))
    if res is not None:
      self._set_results(row, res)
      if not row['wall_seconds']:
        row['wall_seconds'] = res.get('wall_seconds')

  def _set_results(self, row: Dict[str, Any], res: Dict[str, Any]) -> None:
    row.update(status='done', error='', final_return=res.get('final_return'),
               best_policy_return=res.get('best_policy_return'),
               env_steps=res.get('env_steps'))

  def to_run(self, row: Dict[str, Any]) -> bool:
    """Whether this launch runs the trial."""
    if row['status'] == 'done' or row['status'] == 'stopped':
      return False
    return not (row['status'] == 'failed' and row['failures'] >= MAX_FAILURES)

  def remaining(self) -> List[Dict[str, Any]]:
    return [row for row in self.rows.values() if self.to_run(row)]

  def finished_count(self) -> int:
    return sum(1 for r in self.rows.values() if r['status'] in ('done', 'failed', 'stopped'))

  def points(self) -> List[Tuple[sweep_spec.Point, List[Dict[str, Any]]]]:
    """(point, its rows) in first-seen order."""
    groups: Dict[str, Tuple[sweep_spec.Point, List[Dict[str, Any]]]] = {}
    for row in self.rows.values():
      groups.setdefault(row['_point_id'], (row['_point'], []))[1].append(row)
    return list(groups.values())

  # Tune events.

  def started(self, point: sweep_spec.Point, seeds: Sequence[int]) -> None:
    for seed in seeds:
      row = self._add(sweep_spec.make_trial(self.spec.sweeps, point, seed))
      if row['status'] != 'done':
        row['status'] = 'running'
        row['attempts'] += 1
    self.write()

  def finished(self, point: sweep_spec.Point, children: Sequence[Dict[str, Any]],
               stopped: bool) -> None:
    """Records the children's outcomes and logs one line per trial that ended now."""
    for child in children:
      row = self.rows.get(child['trial_id'])
      if row is None:
        continue
      was = row['status']
      row['wall_seconds'] = (row.get('wall_seconds') or 0.0) + child.get('wall_seconds', 0.0)
      if child['status'] == 'done':
        res = results.read_results(sweep_spec.trial_dir(self.root, row['trial_id']))
        if res is not None:
          self._set_results(row, res)
        else:
          row.update(status='failed', error='no results.json after the run')
      elif child['status'] in ('running', 'waiting', 'stopped') and stopped:
        row.update(status='stopped', error='stopped early by ASHA (objective below the rung)')
      elif child['status'] in ('running', 'waiting', 'stopped', 'pending'):
        row.update(status='pending')  # Interrupted: the next launch resumes it.
        continue
      else:
        row.update(status='failed', error=child.get('error') or 'failed')
      if row['status'] == 'failed':
        row['failures'] += 1
      if was != 'done' or child.get('launches'):
        self._log_line(row, child)
    self.write()

  def errored(self, point: sweep_spec.Point, seeds: Sequence[int], message: str) -> None:
    """A Tune trial that raised (not a failed child): its rows failed with `message`."""
    for seed in seeds:
      row = self._add(sweep_spec.make_trial(self.spec.sweeps, point, seed))
      if row['status'] != 'done':
        row.update(status='failed', error=message)
        row['failures'] += 1
        self._log_line(row, {})
    self.write()

  def interrupted(self) -> int:
    """Rows still running after Tune returned (Ctrl-C): back to pending."""
    count = 0
    for row in self.rows.values():
      if row['status'] == 'running':
        row['status'] = 'pending'
        count += 1
    return count

  def _log_line(self, row: Dict[str, Any], child: Dict[str, Any]) -> None:
    what = sweep_spec.describe_point(self.spec.sweeps, row['_point'])
    what = f'{what} seed={row["seed"]}'.strip()
    count = f'trial {self.finished_count()}/{self.total}'
    took = format_seconds(child.get('wall_seconds') or row.get('wall_seconds') or 0.0)
    if row['status'] == 'done':
      logging.info('%s done: %s final %.1f (%s)', count, what, row['final_return'], took)
    elif row['status'] == 'stopped':
      logging.info('%s stopped early: %s (%s)', count, what, took)
    else:
      logging.info('%s failed: %s: %s', count, what, row['error'])

  # Files.

  def write(self) -> None:
    """Rewrites trials.csv and summary.csv (atomic renames)."""
    os.makedirs(self.root, exist_ok=True)
    aggregate.write_csv(os.path.join(self.root, aggregate.TRIALS_FILE),
                        aggregate.trial_columns(self.swept), list(self.rows.values()))
    aggregate.write_csv(os.path.join(self.root, aggregate.SUMMARY_FILE),
                        aggregate.summary_columns(self.swept), self.summary())

  def summary(self) -> List[Dict[str, Any]]:
    rows = []
    for point, trials in self.points():
      key = (tuple(point.items()), tuple(
          (t['status'], t.get('final_return'), t.get('best_policy_return')) for t in trials))
      if key not in self._summary_cache:  # Bootstraps take a second: only new data.
        self._summary_cache[key] = aggregate.summarize([(point, trials)])[0]
      rows.append(self._summary_cache[key])
    return rows

  def failed(self) -> List[Dict[str, Any]]:
    return [r for r in self.rows.values() if r['status'] == 'failed']


def format_seconds(seconds: float) -> str:
  seconds = int(round(seconds))
  if seconds < 60:
    return f'{seconds}s'
  if seconds < 3600:
    return f'{seconds // 60}m{seconds % 60:02d}s'
  return f'{seconds // 3600}h{seconds % 3600 // 60:02d}m'


# --- Ray ------------------------------------------------------------------------------


def _quiet_ray_environment() -> None:
  """Before Ray is imported: no progress tables, no result files, no usage stats."""
  os.environ.setdefault('RAY_AIR_NEW_OUTPUT', '0')  # verbose=0 is silent only in the old output
  os.environ.setdefault('TUNE_DISABLE_AUTO_CALLBACK_LOGGERS', '1')  # Tune's json/csv/tb files
  os.environ.setdefault('RAY_USAGE_STATS_ENABLED', '0')
  os.environ.setdefault('TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S', '1000')
  # Ray's processes wait 5 s for the GCS by default; on a machine at load
  # average 50 ray.init timed out getting the cluster id and segfaulted.
  os.environ.setdefault('RAY_gcs_rpc_server_connect_timeout_s', '60')


def _route_library_logs(handler: std_logging.Handler) -> None:
  """Ray's and Optuna's Python log records go to `handler`, not to the terminal."""
  for name in ('ray', 'optuna'):
    logger = std_logging.getLogger(name)
    for old in list(logger.handlers):
      logger.removeHandler(old)
    logger.addHandler(handler)
    logger.propagate = False


def _ray_log_file(root: str) -> std_logging.Handler:
  """SWEEP/logs/ray.log, for Ray's and Optuna's log records."""
  handler = std_logging.FileHandler(os.path.join(root, sweep_spec.LOGS_DIR, RAY_LOG))
  handler.setFormatter(std_logging.Formatter('%(asctime)s %(levelname)s %(name)s: %(message)s'))
  return handler


def start_ray(cpus_needed: float) -> None:
  """Embedded Ray on localhost, or a connection to the cluster of --ray_address."""
  import ray  # pylint: disable=g-import-not-at-top
  common = dict(log_to_driver=False, configure_logging=False)
  if _RAY_ADDRESS.value:
    try:
      ray.init(address=_RAY_ADDRESS.value, **common)
    except (ConnectionError, ValueError, RuntimeError) as e:
      raise UsageError(f'--ray_address={_RAY_ADDRESS.value}: cannot connect to a Ray cluster '
                       f'({errors.first_line(e)}); start one with `ray start --head`') from e
    return
  # Every Ray process listens on 127.0.0.1 only (checked with `ss -ltnp`), and
  # there is no dashboard UI: a sweep on a laptop opens nothing to the network.
  ray.init(num_cpus=max(os.cpu_count() or 1, math.ceil(cpus_needed)), include_dashboard=False,
           _node_ip_address='127.0.0.1', **common)


def make_asha(spec: Spec):
  """ASHA on the objective against env steps, rungs from a quarter of the run."""
  from ray.tune.schedulers import ASHAScheduler  # pylint: disable=g-import-not-at-top
  from ray.tune.schedulers import TrialScheduler  # pylint: disable=g-import-not-at-top

  class RecordingASHA(ASHAScheduler):
    """ASHA that remembers which trials it stopped (Tune reports them as completed)."""

    def __init__(self, **kwargs):
      super().__init__(**kwargs)
      self.stopped: Set[str] = set()

    def on_trial_result(self, tune_controller, trial, result):
      decision = super().on_trial_result(tune_controller, trial, result)
      if decision == TrialScheduler.STOP and not result.get('finished'):
        self.stopped.add(trial.trial_id)
      return decision

  target = bound_int(spec, 'train_eval.num_env_steps', _DEFAULT_NUM_ENV_STEPS)
  interval = bound_int(spec, 'train_eval.eval_interval', _DEFAULT_EVAL_INTERVAL)
  grace = min(max(interval, int(target * ASHA_FIRST_RUNG)), max(target - 1, 1))
  # max_t just below the target and stop_last_trials=False: ASHA's rungs all lie
  # before the end, and a trial that reaches its last evaluation is not stopped
  # while it writes results.json (ASHA's default stops a trial at max_t).
  return RecordingASHA(time_attr='env_steps', metric='objective', mode='max',
                       max_t=max(target - 1, grace), grace_period=grace,
                       reduction_factor=ASHA_REDUCTION, stop_last_trials=False)


def optuna_points(table: TrialTable) -> Tuple[List[Tuple[Dict[str, Any], Optional[float], bool]],
                                              List[Dict[str, Any]]]:
  """(finished points with their objective and whether ASHA stopped them, unfinished points)
  as Tune configs `{p0: ..., p1: ...}`."""
  finished, unfinished = [], []
  for point, rows in table.points():
    params = {}
    for i, sweep in enumerate(table.spec.sweeps):
      text = point[sweep.name]
      params[f'p{i}'] = text if sweep.options else float(text)
    if any(table.to_run(r) for r in rows):
      unfinished.append(params)
      continue
    done = [aggregate.number(r.get('final_return')) for r in rows if r['status'] == 'done']
    from harness.sweep_trial import iqm  # pylint: disable=g-import-not-at-top
    value = iqm(done) if done else None
    finished.append((params, value, any(r['status'] == 'stopped' for r in rows)))
  return finished, unfinished


def optuna_space(sweeps: Sequence[Sweep]) -> Dict[str, Any]:
  """Optuna distributions of the swept names, keyed p0, p1, ... (dots and slashes in
  gin names would be read as nesting by Tune)."""
  import optuna  # pylint: disable=g-import-not-at-top
  space = {}
  for i, sweep in enumerate(sweeps):
    if sweep.options:
      space[f'p{i}'] = optuna.distributions.CategoricalDistribution(list(sweep.options))
    else:
      space[f'p{i}'] = optuna.distributions.FloatDistribution(
          sweep.range.low, sweep.range.high, log=sweep.range.kind == 'loguniform')
  return space


def run_tune(root: str, spec: Spec, table: TrialTable, track_group: Optional[str] = None) -> None:
  """Runs the remaining trials on Ray Tune; the table records them as they end."""
  from ray import train as ray_train  # pylint: disable=g-import-not-at-top
  from ray import tune  # pylint: disable=g-import-not-at-top
  from harness import sweep_trial  # pylint: disable=g-import-not-at-top

  scheduler = None
  if spec.search == 'grid':
    runs = [{'point': r['_point'], 'seeds': [r['seed']]} for r in table.remaining()]
    param_space: Dict[str, Any] = {'run': tune.grid_search(runs)}
    per_trial = _CPUS_PER_TRIAL.value
    tune_config = tune.TuneConfig(max_concurrent_trials=_max_concurrent(per_trial),
                                  reuse_actors=True, trial_dirname_creator=lambda t: t.trial_id,
                                  trial_name_creator=lambda t: t.trial_id)
  else:
    import optuna  # pylint: disable=g-import-not-at-top
    from ray.tune.search.optuna import OptunaSearch  # pylint: disable=g-import-not-at-top
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    finished, unfinished = optuna_points(table)
    searcher = OptunaSearch(space=optuna_space(spec.sweeps), metric='objective', mode='max',
                            seed=SEARCH_SEED, points_to_evaluate=unfinished or None)
    for params, value, pruned in finished:
      # Finished points of earlier launches: the sampler learns from them.
      searcher.add_evaluated_point(params, value, error=value is None and not pruned,
                                   pruned=pruned)
    scheduler = make_asha(spec)
    param_space = {'seeds': list(spec.seeds)}
    per_trial = _CPUS_PER_TRIAL.value * len(spec.seeds)
    tune_config = tune.TuneConfig(search_alg=searcher, scheduler=scheduler,
                                  num_samples=(spec.num_trials or 0) - len(finished),
                                  max_concurrent_trials=_max_concurrent(per_trial),
                                  reuse_actors=True, trial_dirname_creator=lambda t: t.trial_id,
                                  trial_name_creator=lambda t: t.trial_id)
  trainable = tune.with_resources(
      tune.with_parameters(sweep_trial.HarnessTrial, sweep_dir=root, spec_json=spec.to_json(),
                           track_group=track_group),
      {'cpu': per_trial})
  callback = _table_callback(table, spec, scheduler)
  tuner = tune.Tuner(trainable, param_space=param_space, tune_config=tune_config,
                     run_config=ray_train.RunConfig(
                         name='sweep', storage_path=os.path.join(root, TUNE_DIR), verbose=0,
                         callbacks=[callback],
                         checkpoint_config=ray_train.CheckpointConfig(checkpoint_at_end=False),
                         failure_config=ray_train.FailureConfig(max_failures=0)))
  tuner.fit()


def _max_concurrent(per_trial: float) -> int:
  if _MAX_CONCURRENT.value:
    return _MAX_CONCURRENT.value
  return max(1, int((os.cpu_count() or 1) // per_trial))


def _table_callback(table: TrialTable, spec: Spec, scheduler):
  """A Tune callback that keeps the trial table (and its files) up to date."""
  from ray import tune  # pylint: disable=g-import-not-at-top
  from harness import sweep_trial  # pylint: disable=g-import-not-at-top

  def point_and_seeds(trial) -> Tuple[sweep_spec.Point, List[int]]:
    config = trial.config.get('run', trial.config)
    return sweep_trial.config_point(spec, config), list(config['seeds'])

  class TableCallback(tune.Callback):
    """Rows go running when Tune starts a trial, and to their outcome when it ends."""

    def on_trial_start(self, iteration, trials, trial, **info):
      table.started(*point_and_seeds(trial))

    def on_trial_complete(self, iteration, trials, trial, **info):
      point, _ = point_and_seeds(trial)
      result = trial.last_result or {}
      stopped = scheduler is not None and trial.trial_id in scheduler.stopped
      table.finished(point, result.get('children', []), stopped=stopped)

    def on_trial_error(self, iteration, trials, trial, **info):
      point, seeds = point_and_seeds(trial)
      table.errored(point, seeds, _trial_error(trial))

  return TableCallback()


def _trial_error(trial) -> str:
  """The last line of a Tune trial's error (the exception), for trials.csv."""
  try:
    with open(trial.error_file) as f:
      lines = [l.strip() for l in f.read().splitlines() if l.strip()]
    return lines[-1][:300] if lines else 'the Tune trial failed'
  except (OSError, TypeError):
    return 'the Tune trial failed'


# --- main -----------------------------------------------------------------------------


def finish(root: str, table: TrialTable) -> int:
  """summary.csv, summary.png and the table on stdout; returns the exit status."""
  table.write()
  png = os.path.join(root, aggregate.SUMMARY_PNG)
  aggregate.plot_sweep(root, png)
  print(aggregate.format_table(table.summary(), table.swept), flush=True)
  failed = table.failed()
  unfinished = [r for r in table.rows.values() if r['status'] in ('pending', 'running')]
  logging.info('%s: %d done, %d failed, %d stopped early, %d unfinished; %s, %s, %s',
               root, sum(r['status'] == 'done' for r in table.rows.values()), len(failed),
               sum(r['status'] == 'stopped' for r in table.rows.values()), len(unfinished),
               aggregate.TRIALS_FILE, aggregate.SUMMARY_FILE, aggregate.SUMMARY_PNG)
  if unfinished:
    logging.info('%d trials unfinished: the same command resumes them', len(unfinished))
  return 1 if failed or unfinished else 0


def nothing_left(table: TrialTable) -> bool:
  if table.spec.search == 'grid':
    return not table.remaining()
  finished, unfinished = optuna_points(table)
  return not unfinished and len(finished) >= (table.spec.num_trials or 0)


def main(argv: List[str]) -> None:
  if len(argv) > 1:
    raise UsageError(f'unexpected arguments {argv[1:]}: use --flag=value forms')
  root = check_root(_ROOT_DIR.value)
  if _TRACK.value:
    from harness import tracking  # pylint: disable=g-import-not-at-top  (an optional extra)
    tracking.check_ready()
  spec = read_spec_from_flags()
  resuming = check_same_spec(root, spec)
  table = TrialTable(root, spec)
  if resuming and nothing_left(table):
    logging.info('Nothing left to run in %s: writing the summary', root)
    sys.exit(finish(root, table))
  check = start_check(spec)
  _quiet_ray_environment()
  import ray  # pylint: disable=g-import-not-at-top
  # Ray's log records wait in memory until the input is known to be good.
  held = log_handlers.MemoryHandler(capacity=100_000, flushLevel=std_logging.CRITICAL + 1)
  _route_library_logs(held)
  per_trial = _CPUS_PER_TRIAL.value * (len(spec.seeds) if spec.search == 'optuna' else 1)
  try:
    try:
      start_ray(per_trial * (_MAX_CONCURRENT.value or 1))  # while the check runs
    finally:
      finish_check(check)  # Bad input: exit 2 before anything in SWEEP is written.
    # From here on SWEEP is written, sweep.json first (a directory without it is no sweep).
    os.makedirs(root, exist_ok=True)
    if not resuming:
      sweep_spec.write_spec(root, spec)
    os.makedirs(os.path.join(root, sweep_spec.TRIALS_DIR), exist_ok=True)
    os.makedirs(os.path.join(root, sweep_spec.LOGS_DIR), exist_ok=True)
    held.setTarget(_ray_log_file(root))
    held.flush()
    _route_library_logs(held.target)
    table.write()
    logging.info('Sweep %s: %d trials, %s to run%s', root, table.total,
                 len(table.remaining()) if spec.search == 'grid' else 'points of the search',
                 f' (max {_MAX_CONCURRENT.value} at once)' if _MAX_CONCURRENT.value else '')
    run_tune(root, spec, table,
             track_group=os.path.basename(os.path.abspath(root)) if _TRACK.value else None)
  finally:
    if check.poll() is None:
      check.kill()
      check.wait()
    # Stops the Ray we started; on a cluster it only disconnects this driver.
    ray.shutdown()
    shutil.rmtree(os.path.join(root, TUNE_DIR), ignore_errors=True)
  if table.interrupted():
    logging.info('Interrupted: running trials go back to pending')
  sys.exit(finish(root, table))


def _main_with_clean_errors(argv: List[str]) -> None:
  errors.log_to_stdout()
  try:
    main(argv)
  except UsageError as e:
    errors.report(_PROGRAM, e, logging.get_verbosity() >= logging.DEBUG)
    sys.exit(UsageError.exit_code)


COMMAND = cli.Command(
    program=_PROGRAM,
    summary='runs seeds x settings (a grid, or an Optuna search) as harness-train trials on '
            'Ray; the same command resumes a sweep.',
    usage="--root_dir=SWEEP --gin_file=FILE [--sweep='NAME=[v1, v2]' ...] [--seeds=N] [flags]",
    example="harness-sweep --root_dir=runs/sweep_lr --gin_file=gin/ddqn_cartpole.gin "
            "--sweep='make_agent.learning_rate=[1e-3, 3e-3]' --seeds=3",
    module=__name__)

def run() -> None:
  """Console-script entry point."""
  from absl import app  # pylint: disable=g-import-not-at-top
  app.run(_main_with_clean_errors, flags_parser=cli.flags_parser(COMMAND))


if __name__ == '__main__':
  run()
