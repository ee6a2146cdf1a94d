"""scripts/read_minatar_figures.py's pixel reading, on a drawn panel with known values.

The real figures are MinAtar's README GIFs, not in the package; this panel is
drawn as matplotlib draws theirs (a black frame, tick strokes outside it, the DQN
line in its legend colour), so the calibration and the line reading are checked
against values chosen here.
"""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                'scripts'))
import read_minatar_figures as figures  # pylint: disable=wrong-import-position

# A 400 x 300 canvas, axes frame from (50, 20) to (350, 260); y 0..20 bottom to top,
# x 0..5 left to right.
LEFT, TOP, RIGHT, BOTTOM = 50, 20, 350, 260


def _row(value: float) -> int:
  return int(round(BOTTOM - (BOTTOM - TOP) * value / 20.0))


def _column(x: float) -> int:
  return int(round(LEFT + (RIGHT - LEFT) * x / 5.0))


def _panel(line) -> np.ndarray:
  image = np.full((300, 400, 3), 255, dtype=int)
  image[TOP:BOTTOM + 1, LEFT - 1:LEFT + 2] = 0  # frame: left, right, top, bottom
  image[TOP:BOTTOM + 1, RIGHT - 1:RIGHT + 2] = 0
  image[TOP - 1:TOP + 2, LEFT:RIGHT + 1] = 0
  image[BOTTOM - 1:BOTTOM + 2, LEFT:RIGHT + 1] = 0
  for value in (20, 15, 10, 5, 0):  # y ticks: strokes to the left of the frame
    image[_row(value):_row(value) + 2, LEFT - 12:LEFT - 1] = 0
  for x in range(6):  # x ticks: strokes below the frame
    image[BOTTOM + 1:BOTTOM + 12, _column(x):_column(x) + 2] = 0
  for column in range(LEFT + 3, RIGHT - 2):
    row = _row(line((column - LEFT) / (RIGHT - LEFT) * 5.0))
    image[row - 1:row + 2, column] = figures.DQN_RGB
  return image


def test_the_dqn_line_reads_back_its_values():
  panel = figures.Panel(_panel(lambda x: 2.0 + 2.0 * x), (0, 0, 400, 300),
                        (20, 15, 10, 5, 0), range(6))
  for x in (0.25, 1.0, 2.0, 4.9):
    # One pixel is 20 / 240 of a return here.
    assert panel.dqn_at(x) == pytest.approx(2.0 + 2.0 * x, abs=0.1)
  assert np.isnan(panel.dqn_at(-1.0))  # left of the axes: no reading


def test_a_panel_whose_ticks_do_not_match_its_labels_is_refused():
  with pytest.raises(ValueError, match='not the figure'):
    figures.Panel(_panel(lambda x: 10.0), (0, 0, 400, 300), (20, 10, 0), range(6))
