"""scripts/soak.py's report on a metrics.csv with known growth (no training run)."""

import csv
import os
import re
import subprocess
import sys

from harness.rundir import metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# soak.py defines absl flags that clash with harness.train's: report in a child.
_REPORT = """
import sys
sys.path.insert(0, 'scripts')
from absl import flags
import soak
flags.FLAGS(['soak'])
ok = soak.report(sys.argv[1], capacity=1000, max_slope=1.0, event_intervals=[5000])
print('on target' if ok else 'off target')
"""


def _write_metrics(path: str, event_mib: float) -> None:
  """Rows every 1,000 steps; RSS flat except `event_mib` after each evaluation at 5,000."""
  rss = 700.0
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=metrics.METRICS_COLUMNS)
    writer.writeheader()
    for steps in range(1000, 30001, 1000):
      writer.writerow({'env_steps': steps, 'replay_size': min(steps, 1000), 'rss_mb': rss,
                       'steps_per_sec': 90, 'train_traces': 1, 'policy_traces': 1})
      if steps % 5000 == 0:
        rss += event_mib  # the evaluation + checkpoint runs after this row


def _report(path: str) -> str:
  result = subprocess.run([sys.executable, '-c', _REPORT, path], capture_output=True,
                          text=True, cwd=REPO, timeout=120)
  assert result.returncode == 0, result.stderr[-2000:]
  return result.stdout


def test_report_splits_event_cost_from_the_slope(tmp_path):
  path = str(tmp_path / 'metrics.csv')
  _write_metrics(path, event_mib=2.0)
  out = _report(path)
  # 5 events inside rows 1,000..30,000 (the one at 30,000 has no row after it).
  assert 'mean +2.00 MiB over 5' in out, out
  slope = float(re.search(r'slope ([-+][\d.]+) MB per 10,000', out).group(1))
  assert 3 < slope < 5 and 'off target' in out, out  # a staircase of 2 MiB per 5,000 steps
  assert "train ['1'], policy ['1'] (constant)" in out


def test_report_flat_run_is_on_target(tmp_path):
  path = str(tmp_path / 'metrics.csv')
  _write_metrics(path, event_mib=0.0)
  out = _report(path)
  assert 'slope +0.00' in out and 'on target' in out, out
