"""Experiment tracking on Weights & Biases: `harness-train --track`.

An optional extra (`pip install -e '.[wandb]'`, wandb 0.19.11: 0.20 and later
cannot be resolved next to tf-agents 0.19). The `Reporter` calls a `Tracker`
when the run's settings say `track` (the flag is read by `harness-train` only):

- metrics rows as `train/<column>` and evaluations as `eval/<column>`, all
  plotted against `env_steps`; videos (`train_eval.video_interval`) as `video`;
  `results.json` as the run's summary; the operative gin config as the run's
  config (`gin`) and as a file of the run.
- W&B's files go under `ROOT/wandb/`; the run's id is kept in `ROOT/wandb/run_id`,
  so a resumed run continues the same W&B run.
- `WANDB_MODE=offline` keeps everything under `ROOT/wandb/` (no network; upload
  later with `wandb sync ROOT/wandb/offline-run-*`). `WANDB_PROJECT` names the
  project (default `ddqn-harness`); `WANDB_RUN_GROUP` the group (`harness-sweep
  --track` sets one group per sweep).

TensorBoard stays on either way.
"""

from __future__ import annotations

import math
import os
from typing import Mapping, Optional

from absl import logging

from harness.base.errors import UsageError

EXTRA = "pip install -e '.[wandb]'"
DEFAULT_PROJECT = 'ddqn-harness'
_OFFLINE_MODES = ('offline', 'dryrun', 'disabled')


def folder(root_dir: str) -> str:
  return os.path.join(root_dir, 'wandb')


def run_id_path(root_dir: str) -> str:
  return os.path.join(folder(root_dir), 'run_id')


def check_ready() -> None:
  """Raises a one-line `UsageError` when `--track` cannot work: the extra is not
  installed, or W&B is online without a login."""
  try:
    import wandb  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise UsageError(f'--track needs Weights & Biases, an optional extra: {EXTRA}') from e
  if _offline():
    return
  from wandb.sdk.lib import apikey  # pylint: disable=g-import-not-at-top
  try:
    key = apikey.api_key()
  except Exception:  # pylint: disable=broad-except
    key = None
  if not key:
    raise UsageError('--track streams to Weights & Biases, which needs a login: run '
                     '`wandb login` (or set WANDB_API_KEY), or set WANDB_MODE=offline to keep '
                     'the run under ROOT/wandb/ and upload it later with `wandb sync`')


def _offline() -> bool:
  return os.environ.get('WANDB_MODE', 'online').lower() in _OFFLINE_MODES


def _number(value) -> Optional[float]:
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    return None
  return value if not (isinstance(value, float) and math.isnan(value)) else None


class Tracker:
  """One W&B run per run directory, continued by every launch on it."""

  def __init__(self, root_dir: str, config: Mapping[str, object], gin_config: str,
               group: Optional[str] = None):
    import wandb  # pylint: disable=g-import-not-at-top
    self._wandb = wandb
    os.makedirs(folder(root_dir), exist_ok=True)
    path = run_id_path(root_dir)
    resumed = os.path.isfile(path)
    if resumed:
      with open(path) as f:
        run_id = f.read().strip()
    else:
      run_id = wandb.util.generate_id()
      with open(path + '.partial', 'w') as f:
        f.write(run_id + '\n')
      os.replace(path + '.partial', path)
    settings = wandb.Settings(silent=True, console='off', disable_git=True, save_code=False,
                              disable_job_creation=True, x_disable_stats=True)
    self.run = wandb.init(
        project=os.environ.get('WANDB_PROJECT', DEFAULT_PROJECT), dir=root_dir, id=run_id,
        name=os.path.basename(os.path.abspath(root_dir)),
        group=group or os.environ.get('WANDB_RUN_GROUP'), config=dict(config, gin=gin_config),
        # Offline, W&B ignores `resume` (with a warning) and keeps the id: the
        # offline run directories of one ROOT share it, and `wandb sync` joins them.
        resume=None if _offline() else 'allow', allow_val_change=True, settings=settings)
    self.run.define_metric('env_steps')
    self.run.define_metric('*', step_metric='env_steps')
    gin_path = os.path.join(folder(root_dir), 'operative_config.gin')
    with open(gin_path, 'w') as f:
      f.write(gin_config)
    self.run.save(gin_path, base_path=folder(root_dir), policy='now')
    logging.info('Tracking on W&B: run %s (%s) in project %s%s', run_id,
                 'continued' if resumed else 'new', self.run.project,
                 f', offline under {folder(root_dir)}' if self.run.offline else '')

  def log(self, prefix: str, row: Mapping[str, object]) -> None:
    """Logs the numeric values of a metrics or eval row as `<prefix>/<column>`."""
    values = {f'{prefix}/{k}': v for k, v in ((k, _number(v)) for k, v in row.items())
              if v is not None and k != 'env_steps'}
    self.run.log({'env_steps': int(row['env_steps']), **values})

  def video(self, env_steps: int, path: str) -> None:
    video_format = os.path.splitext(path)[1].lstrip('.').lower()
    self.run.log({'env_steps': env_steps,
                  'video': self._wandb.Video(path, format=video_format)})

  def summary(self, results: Mapping[str, object]) -> None:
    self.run.summary.update({k: v for k, v in results.items() if _number(v) is not None})

  def close(self) -> None:
    self.run.finish()
