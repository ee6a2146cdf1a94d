"""Reverb replay: the table, an embedded server, observers and the training dataset."""

from __future__ import annotations

import os
from typing import List, Optional

from absl import logging
import numpy as np
import reverb
import tensorflow as tf
from tf_agents.trajectories import trajectory as trajectory_lib
import tree

from harness.base import disk
from harness.base import quiet
from harness.base.errors import UsageError

TABLE = 'uniform_table'


def replay_dir(root_dir: str) -> str:
  """Reverb's checkpointer deletes everything else in its directory: own one."""
  return os.path.join(root_dir, 'replay')


# The scalar fields of a stored step, in this order, as float32: exact for step
# types, discount and reward (already float32) and discrete actions below 2**24.
META_FIELDS = ('step_type', 'action', 'reward', 'discount', 'next_step_type')
_MAX_EXACT_FLOAT32_INT = 2**24
# Observation dtypes that float32 holds exactly: they share the meta row's float32
# column (one column samples fastest). Binary and pixel observations too: Reverb
# compresses each chunk, so a MinAtar Seaquest transition (1,000 cells) costs about
# 1.8-2.0 KB of RSS whether stored as float32 or uint8 (scripts/bench_replay_memory.py),
# and the single column stepped faster (2,088 against 1,854 env steps/s).
_EXACT_IN_FLOAT32 = (tf.float16, tf.bfloat16, tf.float32, tf.bool, tf.uint8, tf.int8,
                     tf.uint16, tf.int16)


def meta_row(traj: trajectory_lib.Trajectory) -> np.ndarray:
  """The `META_FIELDS` of a (possibly batched) trajectory: [..., 5] float32."""
  return np.stack([np.asarray(getattr(traj, field), np.float32) for field in META_FIELDS],
                  axis=-1)


class StepCodec:
  """How one env step is stored in Reverb: as few columns as possible.

  Reverb's sampler and writer work per column: a Trajectory's six columns cost
  3.4 ms to sample a batch of 128 items of 4 steps here, one float32 column
  0.8 ms (scripts/profile_replay_columns.py), the largest part of a classic-control
  gradient step. So a step is one float32 row, `[observation..., step_type,
  action, reward, discount, next_step_type]`, where float32 holds the
  observation exactly (classic control, Box2D, uint8 and binary grids), and otherwise two columns: the
  observation in its own dtype, and the meta row. `encode` takes a batch of
  envs too ([num_envs, width] per column).
  """

  def __init__(self, collect_data_spec: trajectory_lib.Trajectory):
    if tree.flatten(collect_data_spec.policy_info):
      raise ValueError('the step replay stores agents without policy_info only')
    action = collect_data_spec.action
    if not action.dtype.is_integer or int(np.max(action.maximum)) >= _MAX_EXACT_FLOAT32_INT:
      raise ValueError(f'the step replay needs a small discrete action space; got {action}')
    self._spec = collect_data_spec
    observation = collect_data_spec.observation
    self._observation_shape = observation.shape.as_list()
    self._observation_size = int(np.prod(self._observation_shape, dtype=np.int64))
    self.packed = observation.dtype in _EXACT_IN_FLOAT32

  def columns(self) -> dict:
    """Tensor specs of one stored step (without the env batch)."""
    meta = tf.TensorSpec([len(META_FIELDS)], tf.float32)
    if self.packed:
      return {'step': tf.TensorSpec([self._observation_size + len(META_FIELDS)], tf.float32)}
    return {'observation': tf.TensorSpec(self._observation_shape, self._spec.observation.dtype),
            'meta': meta}

  def encode(self, traj: trajectory_lib.Trajectory) -> dict:
    """numpy columns of one (possibly batched) step, as `columns()` names them."""
    meta = meta_row(traj)
    observation = np.asarray(traj.observation)
    if not self.packed:
      return {'observation': observation, 'meta': meta}
    flat = observation.reshape(meta.shape[:-1] + (self._observation_size,))
    return {'step': np.concatenate([flat.astype(np.float32, copy=False), meta], axis=-1)}

  def decode(self, data: dict) -> trajectory_lib.Trajectory:
    """Trajectories of sampled columns ([B, T, width] each)."""
    if self.packed:
      step = data['step']
      observation, meta = step[..., :self._observation_size], step[..., self._observation_size:]
      observation = tf.reshape(observation, tf.concat(
          [tf.shape(step)[:-1], self._observation_shape], axis=0))
    else:
      observation, meta = data['observation'], data['meta']
    spec = self._spec
    field = lambda name: tf.cast(meta[..., META_FIELDS.index(name)], getattr(spec, name).dtype)
    return trajectory_lib.Trajectory(
        step_type=field('step_type'),
        observation=tf.cast(observation, spec.observation.dtype),
        action=field('action'),
        policy_info=(),
        next_step_type=field('next_step_type'),
        reward=field('reward'),
        discount=field('discount'))


def item_signature(codec: StepCodec, sequence_length: int) -> dict:
  """Tensor specs of one table item: `sequence_length` steps of one env, [T, width]."""
  return {name: tf.TensorSpec([sequence_length] + spec.shape.as_list(), spec.dtype, name)
          for name, spec in codec.columns().items()}


def check_table_layout(client: reverb.Client, signature: dict, table: str = TABLE) -> None:
  """A table restored from a checkpoint keeps its old layout: refuse a mismatch."""
  info = client.server_info().get(table)
  stored = info.signature if info is not None else None
  if stored is None:
    return
  same = (isinstance(stored, dict) and set(stored) == set(signature) and all(
      stored[k].shape == signature[k].shape and stored[k].dtype == signature[k].dtype
      for k in signature))
  if not same:
    raise UsageError(
        f'the replay table {table!r} holds items of another layout (from a run with other '
        'replay or observation settings, or an older harness): resume with the settings it '
        'was written with, or start a new --root_dir')


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
  """Items in the table (one transition each)."""
  return int(client.server_info()[TABLE].current_size)


class StepObserver:
  """Writes each (possibly batched) env step once; an item is one env's last
  `sequence_length` steps, created at every step.

  Items run across episode ends on purpose: every step starts one, so the last
  steps of an episode are trained on too (tf-agents' `ReverbAddTrajectoryObserver`
  closes the episode at its end, and with n-step targets its last n - 1 steps
  never start an item). The n-step targets stop at the episode's end
  (`harness.rl.nstep`), and an item that starts on the LAST -> FIRST boundary is
  masked by the loss.

  A batch of envs is appended as one Reverb step with a column per env, and
  each env's steps become items of their own, so a training batch samples its
  rows independently. (Until this round an item held the batch's steps for all
  envs at once, a quarter of the sampled items for 4 envs; but envs in
  lockstep, as CartPole's are once every episode runs to the 500-step limit,
  are near-copies of each other, and a batch of 64 then held about 16 distinct
  transitions: docs/benchmarks.md.)
  """

  def __init__(self, client: reverb.Client, codec: StepCodec, sequence_length: int,
               num_envs: int = 1):
    """`num_envs` > 1: the trajectories come from a batched env of that many."""
    self._writer = client.trajectory_writer(num_keep_alive_refs=sequence_length)
    self._codec = codec
    self._sequence_length = sequence_length
    self._num_envs = num_envs
    self._steps = 0
    self._priority = 1.0

  def update_priority(self, priority: float) -> None:
    """Priority of the items written from now on (prioritized replay: the max)."""
    self._priority = priority

  def __call__(self, traj: trajectory_lib.Trajectory) -> None:
    columns = self._codec.encode(traj)
    if self._num_envs > 1:
      self._writer.append([{name: column[i] for name, column in columns.items()}
                           for i in range(self._num_envs)])
    else:
      self._writer.append([columns])
    self._steps += 1
    if self._steps >= self._sequence_length:
      for env_history in self._writer.history:
        self._writer.create_item(
            TABLE, priority=self._priority,
            trajectory={name: env_history[name][-self._sequence_length:]
                        for name in env_history})

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class StepReplay:
  """Replay of whole steps: table, observer and dataset that fit together.

  An item is `sequence_length` consecutive steps of one env, whether the env
  is batched or not (`StepObserver` writes both). Each step is stored as
  `StepCodec` encodes it.
  """

  def __init__(self, collect_data_spec, sequence_length: int, num_envs: int = 1):
    self._codec = StepCodec(collect_data_spec)
    self._sequence_length = sequence_length
    self._num_envs = num_envs

  @property
  def rows_per_item(self) -> int:
    """Training rows (transitions) in one table item."""
    return 1

  def signature(self) -> dict:
    return item_signature(self._codec, self._sequence_length)

  def make_table(self, capacity: int, priority_exponent: Optional[float] = None,
                 rate_limiter: Optional[reverb.rate_limiters.RateLimiter] = None
                 ) -> reverb.Table:
    """`capacity` counts transitions."""
    return make_table(self.signature(), capacity, priority_exponent, rate_limiter)

  def make_observer(self, client: reverb.Client, num_envs: int) -> StepObserver:
    """The observer of whole steps, for one env or a batch of `num_envs` (fixed
    at construction); refuses a restored table of another layout."""
    del num_envs
    check_table_layout(client, self.signature())
    return StepObserver(client, self._codec, self._sequence_length, self._num_envs)

  def make_dataset(self, server_address: str, batch_size: int) -> tf.data.Dataset:
    """Batches of (Trajectory [B, sequence_length, ...], SampleInfo) with B = batch_size.

    A plain `reverb.TrajectoryDataset` rather than tf-agents' `ReverbReplayBuffer.
    as_dataset`: that one interleaves up to 32 single-sample pipelines and maps
    every sample, about 4x slower on two cores (234 vs 1,000 batches of 64 per
    second here). Batches keep a fixed shape (`drop_remainder`), so the train
    function never retraces.
    """
    signature = self.signature()
    dataset = reverb.TrajectoryDataset(
        server_address,
        TABLE,
        dtypes=tree.map_structure(lambda spec: spec.dtype, signature),
        shapes=tree.map_structure(lambda spec: spec.shape, signature),
        max_in_flight_samples_per_worker=max(16, 4 * batch_size),
        num_workers_per_iterator=2)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    dataset = dataset.map(lambda sample: (self._codec.decode(sample.data), sample.info))
    return dataset.prefetch(4)
