"""Reverb replay: the table, an embedded server, observers and the training dataset."""

from __future__ import annotations

import os
from typing import List, Optional

from absl import logging
import reverb
import tensorflow as tf
from tf_agents.replay_buffers import reverb_utils
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import trajectory as trajectory_lib
import tree

TABLE = 'uniform_table'


def replay_dir(root_dir: str) -> str:
  """Reverb's checkpointer deletes everything else in its directory: own one."""
  return os.path.join(root_dir, 'replay')


def make_table(collect_data_spec, sequence_length: int, capacity: int,
               min_size: int = 1) -> reverb.Table:
  """A uniform FIFO table whose signature rejects inserts of the wrong structure."""
  signature = tensor_spec.add_outer_dim(
      tensor_spec.from_spec(collect_data_spec), sequence_length)
  return reverb.Table(
      TABLE,
      max_size=capacity,
      sampler=reverb.selectors.Uniform(),
      remover=reverb.selectors.Fifo(),
      rate_limiter=reverb.rate_limiters.MinSize(min_size),
      signature=signature)


def start_server(tables: List[reverb.Table], checkpoint_dir: Optional[str],
                 port: Optional[int] = None) -> reverb.Server:
  """Starts a Reverb server on a free port; restores from `checkpoint_dir` if any."""
  checkpointer = None
  if checkpoint_dir:
    os.makedirs(checkpoint_dir, exist_ok=True)
    checkpointer = reverb.checkpointers.DefaultCheckpointer(path=checkpoint_dir)
  server = reverb.Server(tables, port=port, checkpointer=checkpointer)
  logging.info('Reverb server listening on port %d', server.port)
  return server


def table_size(client: reverb.Client) -> int:
  return int(client.server_info()[TABLE].current_size)


class BatchedTrajectoryObserver:
  """Writes a batch of per-env trajectories to Reverb, one writer per env.

  tf-agents' `ReverbAddTrajectoryObserver` accepts unbatched trajectories only;
  with several envs stepped as one batch each env keeps its own observer so that
  sequences never mix envs.
  """

  def __init__(self, client: reverb.Client, sequence_length: int, num_envs: int):
    self._batched = num_envs > 1
    self._observers = [
        reverb_utils.ReverbAddTrajectoryObserver(
            client, TABLE, sequence_length=sequence_length, stride_length=1)
        for _ in range(num_envs)]

  def __call__(self, traj: trajectory_lib.Trajectory) -> None:
    if not self._batched:
      self._observers[0](traj)
      return
    for i, observer in enumerate(self._observers):
      observer(tree.map_structure(lambda x, i=i: x[i], traj))

  def flush(self) -> None:
    for observer in self._observers:
      observer.flush()

  def close(self) -> None:
    for observer in self._observers:
      observer.close()


def make_dataset(collect_data_spec, server_address: str, sequence_length: int,
                 batch_size: int) -> tf.data.Dataset:
  """Batches of (trajectory, SampleInfo) with `sequence_length` steps per item.

  A plain `reverb.TrajectoryDataset` rather than tf-agents' `ReverbReplayBuffer.
  as_dataset`: that one interleaves up to 32 single-sample pipelines and maps
  every sample, about 4x slower on two cores (234 vs 1,000 batches of 64 per
  second here). Batches keep a fixed shape (`drop_remainder`), so the train
  function never retraces.
  """
  signature = tensor_spec.add_outer_dim(
      tensor_spec.from_spec(collect_data_spec), sequence_length)
  dataset = reverb.TrajectoryDataset(
      server_address,
      TABLE,
      dtypes=tree.map_structure(lambda spec: spec.dtype, signature),
      shapes=tree.map_structure(lambda spec: spec.shape, signature),
      max_in_flight_samples_per_worker=4 * batch_size,
      num_workers_per_iterator=2)
  dataset = dataset.batch(batch_size, drop_remainder=True)
  dataset = dataset.map(lambda sample: (sample.data, sample.info))
  return dataset.prefetch(4)
