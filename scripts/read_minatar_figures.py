"""Read the DQN curves of MinAtar's README figures off their pixels, not by eye.

docs/benchmarks.md compares the harness with MinAtar's published DQN learning
curves (img/learning_curves.gif: mean of the last 100 training episodes against
frames, 30 seeds) and asks which step size drew them (img/sensitivity_curves.gif:
the same statistic at the end of training against log2 of the step size). This
script finds each panel's frame and tick marks, maps the DQN line's pixels
(its legend colour) to data values, and prints, per game, the learning curve at
a few frame counts and the sensitivity curve at each step size of the sweep.

The panel boxes and tick labels below were read once from the figures of
MinAtar's HEAD (4241f24); the tick positions are found in the pixels.

  git clone https://github.com/kenjyoung/MinAtar /tmp/MinAtar
  python scripts/read_minatar_figures.py --minatar=/tmp/MinAtar
"""

from __future__ import annotations

import argparse
import os
from typing import List, Sequence, Tuple

import numpy as np
from PIL import Image

DQN_RGB = np.array([44, 116, 179])  # the DQN legend box's colour
COLOUR_TOLERANCE = 60  # summed |RGB difference| that still counts as the DQN line
FRAMES_M = (0.25, 0.5, 0.75, 1.0, 2.0, 4.9)  # where the learning curves are read
LOG2_STEP_SIZES = tuple(range(-14, -6))

# game: (learning-curve panel box, its y tick labels top to bottom,
#        sensitivity panel box, its y tick labels, its x tick labels (log2 step size)).
# Boxes are (left, top, right, bottom) in the full-size GIFs; the learning
# curves' x ticks are 0..5 million frames in every panel.
PANELS = {
    'seaquest': ((450, 150, 1350, 700), (20, 15, 10, 5, 0),
                 (500, 180, 1380, 720), (20, 15, 10, 5, 0), (-13, -12, -11, -10, -9)),
    'breakout': ((1450, 150, 2300, 700), (15, 10, 5, 0),
                 (1500, 180, 2330, 720), (15, 10, 5), (-12, -10, -8)),
    'asterix': ((40, 900, 820, 1480), (20, 15, 10, 5, 0),
                (40, 960, 830, 1500), (20, 15, 10, 5, 0), (-13, -12, -11, -10, -9, -8)),
    'freeway': ((1100, 880, 1960, 1480), (50, 40, 30, 20, 10, 0),
                (1050, 960, 1900, 1500), (50, 40, 30, 20, 10, 0), (-12, -10, -8)),
    'space_invaders': ((2150, 880, 3038, 1480), (200, 150, 100, 50, 0),
                       (2100, 960, 3029, 1500), (150, 100, 50, 0), (-13, -12, -11, -10, -9)),
}


def _runs(indices: Sequence[int]) -> List[float]:
  """Centres of runs of consecutive indices."""
  if not len(indices):
    return []
  return [float(np.mean(r)) for r in np.split(indices, np.nonzero(np.diff(indices) > 1)[0] + 1)]


class Panel:
  """One axes box of a figure: pixel <-> data through its tick marks."""

  def __init__(self, image: np.ndarray, box: Tuple[int, int, int, int],
               y_labels: Sequence[float], x_labels: Sequence[float]):
    left, top, right, bottom = box
    pixels = image[top:bottom, left:right]
    dark = pixels.sum(axis=2) < 200
    height, width = dark.shape
    frame_rows = [y for y in range(height) if dark[y].sum() > 0.6 * width]
    frame_cols = [x for x in range(width) if dark[:, x].sum() > 0.6 * height]
    x0, y0, y1 = frame_cols[0], frame_rows[0], frame_rows[-1]
    # Tick marks: short dark strokes just outside the left and bottom frame lines.
    y_ticks = _runs([y for y in range(y0, y1 + 1) if dark[y, x0 - 8:x0 - 2].all()])
    x_ticks = _runs([x for x in range(x0, frame_cols[-1] + 1) if dark[y1 + 3:y1 + 8, x].all()])
    if len(y_ticks) != len(y_labels) or len(x_ticks) != len(x_labels):
      raise ValueError(f'panel {box}: found {len(y_ticks)} y and {len(x_ticks)} x ticks, '
                       f'expected {len(y_labels)} and {len(x_labels)}: not the figure '
                       'these boxes were read from')
    self._y = np.polyfit(y_ticks, y_labels, 1)  # value = a * row + b
    self._x = np.polyfit(x_labels, x_ticks, 1)  # column = a * value + b
    self._line = np.abs(pixels - DQN_RGB).sum(axis=2) < COLOUR_TOLERANCE

  def dqn_at(self, x_value: float) -> float:
    """The DQN line's value at `x_value` (median of its rows within 2 px), NaN if absent."""
    column = int(round(np.polyval(self._x, x_value)))
    if not 2 <= column < self._line.shape[1] - 2:
      return float('nan')
    rows = np.nonzero(self._line[:, column - 2:column + 3].any(axis=1))[0]
    return float(np.polyval(self._y, np.median(rows))) if len(rows) else float('nan')


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--minatar', required=True, help='a MinAtar checkout (its img/ folder)')
  args = parser.parse_args()
  images = {}
  for name in ('learning_curves', 'sensitivity_curves'):
    path = os.path.join(args.minatar, 'img', name + '.gif')
    if not os.path.isfile(path):
      parser.error(f'{path} not found; --minatar must be a MinAtar checkout')
    images[name] = np.asarray(Image.open(path).convert('RGB')).astype(int)

  print('| game | DQN learning curve at ' + ' / '.join(f'{f:g}M' for f in FRAMES_M)
        + ' frames | DQN at the end of training, by log2(step size): '
        + ', '.join(str(s) for s in LOG2_STEP_SIZES) + ' |')
  print('|---|---|---|')
  for game, (curve_box, curve_y, sweep_box, sweep_y, sweep_x) in PANELS.items():
    try:
      curve = Panel(images['learning_curves'], curve_box, curve_y, range(6))
      sweep = Panel(images['sensitivity_curves'], sweep_box, sweep_y, sweep_x)
    except ValueError as error:
      parser.error(f'{game}: {error}')
    along = ' / '.join(f'{curve.dqn_at(f):.1f}' for f in FRAMES_M)
    by_step = ', '.join('-' if np.isnan(v) else f'{v:.1f}'
                        for v in (sweep.dqn_at(s) for s in LOG2_STEP_SIZES))
    print(f'| {game} | {along} | {by_step} |')


if __name__ == '__main__':
  main()
