"""TensorFlow's thread pools: a gin binding, because the best size depends on the network.

TensorFlow sizes both pools to the machine's cores. For the (256, 256) MLPs of
the classic-control configs, splitting one small matmul over two threads costs
more than it saves: a MountainCar gradient step (batch 128, with Reverb
sampling) took 2.39 to 2.54 ms with one intra-op thread against 2.73 to 3.85 ms
with two, three runs each alternating (`docs/performance.md`). Atari's conv
layers gain from two in a gradient step alone (27 against 37 ms per Nature-CNN step,
STACK-FACTS), so the default leaves TensorFlow's choice. With acting overlapped with
learning, whole MinAtar runs were faster with one (gin/ddqn_minatar.gin sets it), and
so were whole Breakout and Pong runs, but there two of three soaks grew a step after
the table filled, so gin/ddqn_atari.gin keeps the default (docs/performance.md).
"""

from __future__ import annotations

from typing import Optional

from absl import logging
import gin
import tensorflow as tf

from harness.base.errors import UsageError


def _check(name: str, value) -> None:
  if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
    raise UsageError(f'configure_threads.{name}={value!r} must be a positive integer, or None '
                     "for TensorFlow's default (one thread per core): 1 for MLPs")


@gin.configurable
def configure_threads(intra_op_threads: Optional[int] = None,
                      inter_op_threads: Optional[int] = None) -> None:
  """Sizes TensorFlow's thread pools; call it before TensorFlow runs any op.

  Args:
    intra_op_threads: threads that one op (a matmul) may split over; None: one per core.
    inter_op_threads: ops that may run at once; None: one per core.
  """
  _check('intra_op_threads', intra_op_threads)
  _check('inter_op_threads', inter_op_threads)
  try:
    if intra_op_threads is not None:
      tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
    if inter_op_threads is not None:
      tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)
  except RuntimeError as e:  # TensorFlow already started in this process
    logging.warning('TensorFlow thread pools left as they are: %s', e)
