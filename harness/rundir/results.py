"""`ROOT/results.json`: what a run achieved at its target.

Written once a run reaches `train_eval.num_env_steps` (also by a resumed run
that is already there). It holds the *final* greedy policy's mean return over
`train_eval.final_eval_episodes` episodes, and `best_policy` re-evaluated on the
same episodes: a learning claim rests on the final policy, while the best
evaluation so far is a lucky draw from a noisy curve. Sweeps read this file.

This module imports no TensorFlow: sweeps and plots read results with it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from harness.base import disk

RESULTS_FILE = 'results.json'

# The keys every results.json holds (DESIGN.md, "The run directory").
KEYS = ('final_return', 'final_return_std', 'best_policy_return', 'best_eval_return',
        'env_steps', 'train_step', 'wall_seconds', 'episodes')


def results_path(root_dir: str) -> str:
  return os.path.join(root_dir, RESULTS_FILE)


def write_results(root_dir: str, results: Dict[str, Any]) -> str:
  """Writes results.json atomically (temporary file + rename); returns its path.

  A failed write (full disk) raises `disk.WriteError` and leaves the old file.
  """
  missing = [k for k in KEYS if k not in results]
  if missing:
    raise ValueError(f'results lack {missing}')
  path = results_path(root_dir)
  tmp = path + '.tmp'
  with disk.writing(path, cleanup=lambda: os.remove(tmp)):
    with open(tmp, 'w') as f:
      json.dump(results, f, indent=2, sort_keys=True)
      f.write('\n')
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  return path


def read_results(root_dir: str) -> Optional[Dict[str, Any]]:
  """The run's results, or None when it has not reached its target (or the file is torn)."""
  try:
    with open(results_path(root_dir)) as f:
      results = json.load(f)
  except (OSError, ValueError):
    return None
  return results if isinstance(results, dict) and all(k in results for k in KEYS) else None
