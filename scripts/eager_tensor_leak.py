"""What each eager TensorFlow result keeps for good, in this Python and TensorFlow.

On Python 3.11 with TensorFlow 2.15 every EagerTensor that an eager op or a
tf.function call returns leaves about one Python memory block and 48 bytes of
RSS behind, freed never (tensorflow/tensorflow#62551, "Python >=3.11 TF memory
leaks"): a variable read, a numpy array converted for a policy call, each output
of a compiled function. A training loop that makes some 35 such tensors per
16-step Atari iteration grows by about 1 MB per 10,000 agent steps from this
alone (docs/memory.md). This script prints blocks and RSS bytes per call for a
few kinds of call, after a warm-up, with gc and malloc_trim before each reading.

  python scripts/eager_tensor_leak.py [--calls=300000]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import sys
import time

import numpy as np
import psutil
import tensorflow as tf


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--calls', type=int, default=300_000)
  args = parser.parse_args()
  process = psutil.Process()
  libc = ctypes.CDLL(None)
  variable = tf.Variable(0, dtype=tf.int64)
  one_output = tf.function(lambda: variable + 1, autograph=False)
  three_outputs = tf.function(lambda: (variable + 1, variable * 2, variable - 3),
                              autograph=False)
  observation = np.zeros((4, 84, 84, 4), np.uint8)
  takes_numpy = tf.function(lambda x: tf.reduce_max(x), autograph=False)
  cases = {
      'variable.numpy()': variable.numpy,
      'tf.function, 1 output': one_output,
      'tf.function, 3 outputs': three_outputs,
      'tf.function(numpy array)': lambda: takes_numpy(observation),
      'numpy only (control)': lambda: np.int64(3) + 1,
  }
  print(f'Python {sys.version.split()[0]}, TensorFlow {tf.__version__}, {args.calls:,d} calls each')
  for name, call in cases.items():
    for _ in range(2000):
      call()
    gc.collect()
    libc.malloc_trim(0)
    blocks, rss, start = sys.getallocatedblocks(), process.memory_info().rss, time.time()
    for _ in range(args.calls):
      call()
    gc.collect()
    libc.malloc_trim(0)
    print(f'{name:26s} {(sys.getallocatedblocks() - blocks) / args.calls:+6.2f} blocks/call  '
          f'{(process.memory_info().rss - rss) / args.calls:+7.1f} RSS bytes/call  '
          f'{1e6 * (time.time() - start) / args.calls:6.0f} us/call', flush=True)


if __name__ == '__main__':
  main()
