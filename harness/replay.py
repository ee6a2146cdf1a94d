"""Reverb replay: the table, an embedded server, observers and the training dataset."""

from __future__ import annotations

import os
from typing import List, Optional

from absl import logging
import reverb
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import trajectory as trajectory_lib
import tree

from harness import disk
from harness import quiet

TABLE = 'uniform_table'


def replay_dir(root_dir: str) -> str:
  """Reverb's checkpointer deletes everything else in its directory: own one."""
  return os.path.join(root_dir, 'replay')


def item_signature(collect_data_spec, sequence_length: int, num_envs: int = 1):
  """Tensor specs of one table item: [T, ...], or [T, num_envs, ...] when grouped."""
  spec = tensor_spec.from_spec(collect_data_spec)
  if num_envs > 1:
    spec = tensor_spec.add_outer_dim(spec, num_envs)
  return tensor_spec.add_outer_dim(spec, sequence_length)


def make_table(signature, max_items: int, priority_exponent: Optional[float] = None,
               rate_limiter: Optional[reverb.rate_limiters.RateLimiter] = None,
               name: str = TABLE) -> reverb.Table:
  """A FIFO table whose signature rejects inserts of the wrong structure.

  Uniform sampling, or prioritized with `priority_exponent` (alpha). Sampling
  may start with one item unless a `rate_limiter` says otherwise.
  """
  sampler = (reverb.selectors.Uniform() if priority_exponent is None
             else reverb.selectors.Prioritized(priority_exponent))
  return reverb.Table(
      name,
      max_size=max(1, max_items),
      sampler=sampler,
      remover=reverb.selectors.Fifo(),
      rate_limiter=rate_limiter or reverb.rate_limiters.MinSize(1),
      signature=signature)


# Where a Reverb checkpoint that could not be read back is kept: beside the
# checkpoint directory (`ROOT/replay-unreadable/`), out of Reverb's sight.
UNREADABLE_SUFFIX = '-unreadable'


def newest_checkpoint(checkpoint_dir: str) -> Optional[str]:
  """Name of the newest complete Reverb checkpoint (the one a server loads)."""
  if not os.path.isdir(checkpoint_dir):
    return None
  done = [d for d in os.listdir(checkpoint_dir)
          if os.path.isfile(os.path.join(checkpoint_dir, d, 'DONE'))]
  return max(done) if done else None


def start_server(tables: List[reverb.Table], checkpoint_dir: Optional[str],
                 port: Optional[int] = None) -> reverb.Server:
  """Starts a Reverb server on a free port; restores from `checkpoint_dir` if any.

  A newest checkpoint that Reverb cannot read is moved to
  `<checkpoint_dir>-unreadable/` (with a warning) and the server starts from the
  one before, or empty. Reverb
  marks a checkpoint complete even when a full disk cut its data short (seen on
  a full tmpfs: the empty DONE file still fits), and it keeps only its newest
  checkpoint, so the agent's checkpoint resumes with an empty table rather than
  not at all; the run refills it as it collects.
  """
  checkpointer = None
  if checkpoint_dir:
    with disk.writing(checkpoint_dir):
      os.makedirs(checkpoint_dir, exist_ok=True)
  while True:
    if checkpoint_dir:
      checkpointer = reverb.checkpointers.DefaultCheckpointer(path=checkpoint_dir)
    try:
      with quiet.native_stderr():  # Reverb's start and restore lines
        server = reverb.Server(tables, port=port, checkpointer=checkpointer)
      break
    except RuntimeError as e:
      newest = checkpoint_dir and newest_checkpoint(checkpoint_dir)
      if not newest or not _is_damaged_data(e):
        raise
      path = os.path.join(checkpoint_dir, newest)
      kept = os.path.join(checkpoint_dir.rstrip(os.sep) + UNREADABLE_SUFFIX, newest)
      with disk.writing(kept):
        os.makedirs(os.path.dirname(kept), exist_ok=True)
        os.replace(path, kept)
      logging.warning('Reverb checkpoint %s could not be read (%s): moved to %s; the replay '
                      'table starts without it', path, str(e).split('\n')[0], kept)
  logging.info('Reverb server listening on port %d', server.port)
  return server


def _is_damaged_data(error: Exception) -> bool:
  """Whether Reverb failed to read a checkpoint's records (not, say, a table mismatch)."""
  message = str(error).lower()
  return any(sign in message for sign in ('corrupted record', 'truncated record', 'data loss'))


def table_size(client: reverb.Client) -> int:
  """Items in the table (an item holds `num_envs` transitions when grouped)."""
  return int(client.server_info()[TABLE].current_size)


class StepObserver:
  """Writes each (possibly batched) env step once; an item is the last
  `sequence_length` steps, created at every step.

  Items run across episode ends on purpose: every step starts one, so the last
  steps of an episode are trained on too (tf-agents' `ReverbAddTrajectoryObserver`
  closes the episode at its end, and with n-step targets its last n - 1 steps
  never start an item). The n-step targets stop at the episode's end
  (`harness.nstep`), and an item that starts on the LAST -> FIRST boundary is
  masked by the loss.

  A batch of envs is written as one Reverb step: an item holds those steps for
  every env at once, so a batch of 64 from 8 envs costs 8 sampled items (per-item
  sampling overhead capped training near 1,000 batches/s on two cores with one
  item per transition).
  """

  def __init__(self, client: reverb.Client, sequence_length: int):
    self._writer = client.trajectory_writer(num_keep_alive_refs=sequence_length)
    self._sequence_length = sequence_length
    self._steps = 0
    self._priority = 1.0

  def update_priority(self, priority: float) -> None:
    """Priority of the items written from now on (prioritized replay: the max)."""
    self._priority = priority

  def __call__(self, traj: trajectory_lib.Trajectory) -> None:
    self._writer.append(traj)
    self._steps += 1
    if self._steps >= self._sequence_length:
      item = tree.map_structure(lambda column: column[-self._sequence_length:],
                                self._writer.history)
      self._writer.create_item(TABLE, priority=self._priority, trajectory=item)

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


def make_observer(client: reverb.Client, sequence_length: int, num_envs: int) -> StepObserver:
  """The observer of whole steps, for one env or a batch of `num_envs`."""
  del num_envs  # the same writer serves both: the batch is part of each step
  return StepObserver(client, sequence_length)


class StepReplay:
  """Replay of whole steps: table, observer and dataset that fit together.

  One env: an item is `sequence_length` consecutive steps. A batch of envs: an
  item holds those steps for every env at once, and the dataset splits it into
  rows again (`StepObserver` writes both).
  """

  def __init__(self, collect_data_spec, sequence_length: int, num_envs: int = 1):
    self._spec = collect_data_spec
    self._sequence_length = sequence_length
    self._num_envs = num_envs

  @property
  def rows_per_item(self) -> int:
    """Training rows (transitions) in one table item."""
    return self._num_envs

  def make_table(self, capacity: int, priority_exponent: Optional[float] = None,
                 rate_limiter: Optional[reverb.rate_limiters.RateLimiter] = None
                 ) -> reverb.Table:
    """`capacity` counts transitions."""
    return make_table(item_signature(self._spec, self._sequence_length, self._num_envs),
                      capacity // self._num_envs, priority_exponent, rate_limiter)

  def make_observer(self, client: reverb.Client, num_envs: int):
    del num_envs  # fixed at construction
    return make_observer(client, self._sequence_length, self._num_envs)

  def make_dataset(self, server_address: str, batch_size: int) -> tf.data.Dataset:
    return make_dataset(self._spec, server_address, self._sequence_length, batch_size,
                        self._num_envs)


def make_dataset(collect_data_spec, server_address: str, sequence_length: int,
                 batch_size: int, num_envs: int = 1) -> tf.data.Dataset:
  """Batches of (trajectory, SampleInfo) with `sequence_length` steps per item.

  A plain `reverb.TrajectoryDataset` rather than tf-agents' `ReverbReplayBuffer.
  as_dataset`: that one interleaves up to 32 single-sample pipelines and maps
  every sample, about 4x slower on two cores (234 vs 1,000 batches of 64 per
  second here). Batches keep a fixed shape (`drop_remainder`), so the train
  function never retraces.
  """
  signature = item_signature(collect_data_spec, sequence_length, num_envs)
  items_per_batch = batch_size // num_envs
  dataset = reverb.TrajectoryDataset(
      server_address,
      TABLE,
      dtypes=tree.map_structure(lambda spec: spec.dtype, signature),
      shapes=tree.map_structure(lambda spec: spec.shape, signature),
      max_in_flight_samples_per_worker=max(16, 4 * items_per_batch),
      num_workers_per_iterator=2)
  dataset = dataset.batch(items_per_batch, drop_remainder=True)
  if num_envs > 1:
    dataset = dataset.map(lambda sample: sample._replace(
        data=tree.map_structure(_ungroup, sample.data)))
  dataset = dataset.map(lambda sample: (sample.data, sample.info))
  return dataset.prefetch(4)


def _ungroup(column: tf.Tensor) -> tf.Tensor:
  """[items, T, envs, ...] -> [items * envs, T, ...]: one row per env sequence."""
  perm = [0, 2, 1] + list(range(3, column.shape.rank))
  column = tf.transpose(column, perm)
  return tf.reshape(column, [-1, column.shape[2]] + column.shape[3:].as_list())
