"""Running a sweep's trials on Ray Tune: the grid, or Optuna's TPE with ASHA.

Tune schedules `sweep_trial.HarnessTrial` actors (one harness-train process per
seed); a callback keeps the `TrialTable` (and its files) up to date as trials
start and end. Resume is ours, not Tune's: each launch gives Tune only the
trials still to run, and the finished points of earlier launches to Optuna.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from gin import config_parser
import gin

from harness.sweeps import aggregate
from harness.sweeps import gate as sweep_gate
from harness.sweeps import spec as sweep_spec
from harness.sweeps.spec import Spec, Sweep
from harness.sweeps.table import TrialTable

# ASHA: halve the points at env-step rungs from a quarter of the run.
ASHA_REDUCTION = 2
ASHA_FIRST_RUNG = 0.25
SEARCH_SEED = 0
# train_eval's own defaults (harness/run/experiment.py), for ASHA's rungs when the
# gin files do not bind them.
_DEFAULT_NUM_ENV_STEPS = 50_000
_DEFAULT_EVAL_INTERVAL = 5_000


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
    from harness.sweeps.trial import iqm  # pylint: disable=g-import-not-at-top
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


def run_tune(root: str, spec: Spec, table: TrialTable, cpus_per_trial: float,
             max_concurrent: Optional[int], storage_path: str,
             track_group: Optional[str] = None,
             gate: Optional[sweep_gate.Gate] = None) -> None:
  """Runs the remaining trials on Ray Tune; the table records them as they end.

  Each trial reserves `cpus_per_trial` per seed it runs; at most
  `max_concurrent` run at once (None: as many as the CPUs allow). Tune keeps
  its own files in `storage_path` (outside SWEEP). With `track_group`
  (harness-sweep --track) every harness-train child runs with --track, in that
  W&B group. With `gate`, trials wait until it opens; a closed gate stops Tune
  and nothing is recorded.
  """
  from ray import train as ray_train  # pylint: disable=g-import-not-at-top
  from ray import tune  # pylint: disable=g-import-not-at-top
  from harness.sweeps import trial as sweep_trial  # pylint: disable=g-import-not-at-top

  scheduler = None
  if spec.search == 'grid':
    runs = [{'point': r['_point'], 'seeds': [r['seed']]} for r in table.remaining()]
    param_space: Dict[str, Any] = {'run': tune.grid_search(runs)}
    per_trial = cpus_per_trial
    tune_config = tune.TuneConfig(max_concurrent_trials=_max_concurrent(per_trial, max_concurrent),
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
    per_trial = cpus_per_trial * len(spec.seeds)
    tune_config = tune.TuneConfig(search_alg=searcher, scheduler=scheduler,
                                  num_samples=(spec.num_trials or 0) - len(finished),
                                  max_concurrent_trials=_max_concurrent(per_trial, max_concurrent),
                                  reuse_actors=True, trial_dirname_creator=lambda t: t.trial_id,
                                  trial_name_creator=lambda t: t.trial_id)
  trainable = tune.with_resources(
      tune.with_parameters(sweep_trial.HarnessTrial, sweep_dir=root, spec_json=spec.to_json(),
                           track_group=track_group, gate_dir=gate and gate.path),
      {'cpu': per_trial})
  callback = _table_callback(table, spec, scheduler, gate)
  tuner = tune.Tuner(trainable, param_space=param_space, tune_config=tune_config,
                     run_config=ray_train.RunConfig(
                         name='sweep', storage_path=storage_path, verbose=0,
                         callbacks=[callback], stop=_stop_when_closed(gate),
                         checkpoint_config=ray_train.CheckpointConfig(checkpoint_at_end=False),
                         failure_config=ray_train.FailureConfig(max_failures=0)))
  tuner.fit()


def _max_concurrent(per_trial: float, asked: Optional[int]) -> int:
  if asked:
    return asked
  return max(1, int((os.cpu_count() or 1) // per_trial))


def _stop_when_closed(gate: Optional[sweep_gate.Gate]):
  """A Tune stopper that ends the whole run once `gate` is closed (bad input)."""
  if gate is None:
    return None
  from ray import tune  # pylint: disable=g-import-not-at-top

  class StopWhenClosed(tune.Stopper):

    def __call__(self, trial_id, result) -> bool:
      return False

    def stop_all(self) -> bool:
      return gate.is_closed()

  return StopWhenClosed()


def _table_callback(table: TrialTable, spec: Spec, scheduler,
                    gate: Optional[sweep_gate.Gate] = None):
  """A Tune callback that keeps the trial table (and its files) up to date; it
  records nothing from trials that a closed gate failed (bad input: nothing in
  SWEEP)."""
  from ray import tune  # pylint: disable=g-import-not-at-top
  from harness.sweeps import trial as sweep_trial  # pylint: disable=g-import-not-at-top

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
      if gate is not None and not gate.is_open():
        return
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
