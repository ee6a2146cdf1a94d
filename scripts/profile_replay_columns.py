"""What the number of Reverb columns costs: writing steps and sampling batches (no timing is
asserted anywhere).

Each row fills a table with 10,000 steps of items of 4 steps (MountainCar's 3-step targets)
through a `TrajectoryWriter`, as `replay.StepObserver` does, then times batches of 128 items
from a `reverb.TrajectoryDataset` with the harness's settings (2 workers, 512 in flight):

  - six columns: one per field of a tf-agents Trajectory (the step replay before
    `replay.StepCodec`);
  - two columns: the observation and the float32 meta row (StepCodec for observations that
    float32 cannot hold);
  - one column: the packed float32 row (StepCodec for classic control and Box2D).

    python scripts/profile_replay_columns.py [--observation_size 2] [--batch 128]
"""

import argparse
import time

import numpy as np
import reverb
import tensorflow as tf
import tree

from harness.base import quiet

STEPS, SEQUENCE = 10_000, 4


def profile(label: str, columns: dict, batch: int, batches: int = 400) -> None:
  spec = {name: tf.TensorSpec([SEQUENCE] + list(shape), dtype)
          for name, (shape, dtype) in columns.items()}
  table = reverb.Table('t', sampler=reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
                       max_size=STEPS, rate_limiter=reverb.rate_limiters.MinSize(1),
                       signature=spec)
  server = reverb.Server([table])
  client = server.localhost_client()
  step = {name: np.zeros(shape, dtype.as_numpy_dtype) for name, (shape, dtype) in columns.items()}
  start = time.perf_counter()
  with quiet.native_stderr(), client.trajectory_writer(num_keep_alive_refs=SEQUENCE) as writer:
    for i in range(STEPS):
      writer.append(step)
      if i >= SEQUENCE - 1:
        history = writer.history
        writer.create_item('t', 1.0, {name: history[name][-SEQUENCE:] for name in history})
    writer.flush()
  write_us = (time.perf_counter() - start) / STEPS * 1e6
  dataset = reverb.TrajectoryDataset(
      f'localhost:{server.port}', 't', dtypes=tree.map_structure(lambda s: s.dtype, spec),
      shapes=tree.map_structure(lambda s: s.shape, spec),
      max_in_flight_samples_per_worker=4 * batch, num_workers_per_iterator=2)
  iterator = iter(dataset.batch(batch, drop_remainder=True).prefetch(4))
  next(iterator)
  start = time.perf_counter()
  for _ in range(batches):
    next(iterator)
  sample_ms = (time.perf_counter() - start) / batches * 1e3
  print(f'{label:12s} write {write_us:6.1f} us/step   sample {sample_ms:5.2f} ms per batch '
        f'of {batch}', flush=True)
  server.stop()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--observation_size', type=int, default=2)
  parser.add_argument('--batch', type=int, default=128)
  args = parser.parse_args()
  obs = (args.observation_size,)
  profile('six columns', {'step_type': ((), tf.int32), 'observation': (obs, tf.float32),
                          'action': ((), tf.int64), 'next_step_type': ((), tf.int32),
                          'reward': ((), tf.float32), 'discount': ((), tf.float32)}, args.batch)
  profile('two columns', {'observation': (obs, tf.float32), 'meta': ((5,), tf.float32)},
          args.batch)
  profile('one column', {'step': ((args.observation_size + 5,), tf.float32)}, args.batch)


if __name__ == '__main__':
  main()
