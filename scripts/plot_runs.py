"""Plots learning curves of runs: the same program as `harness-plot`.

  python scripts/plot_runs.py runs/cartpole runs/cartpole_lr3e-4 --out curves.png
"""

import os
import sys

# Runnable from a checkout without installing: the repository root holds `harness`.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from harness import plot  # pylint: disable=g-import-not-at-top,wrong-import-position

if __name__ == '__main__':
  plot.run()
