"""Replay that stores each stacked-image frame once and rebuilds stacks when sampling.

Naive storage of Atari observations keeps every (84, 84, 4) stack, so each
frame is stored four times (about 5.9 KB of RSS per step in Reverb). Here every
env step appends only its newest frame plus a small `meta` row (step type,
action, reward, discount, next step type) to a Reverb `TrajectoryWriter`; an item
is a reference to the last `stack_size - 1 + sequence_length` steps of that
writer, so consecutive items share the same chunks. The training dataset
rebuilds the `[B, sequence_length, H, W, stack_size]` observations in the graph.

A stack never reaches across an episode start: frames before the most recent
FIRST step are replaced by the FIRST frame, which is exactly gymnasium's
`FrameStackObservation(padding_type='reset')`. The observer checks that every
observation it sees has that layout, so a sampled stack always equals the
observation the agent saw.
"""

from __future__ import annotations

from typing import List, Optional

from absl import logging
import gin
import numpy as np
import reverb
import tensorflow as tf
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory as trajectory_lib
import tree

from harness.base.errors import UsageError
from harness.rl import replay

_FIRST = int(ts.StepType.FIRST)
_LAST = int(ts.StepType.LAST)
_MAX_EXACT_FLOAT32_INT = 2**24


class FrameReplay:
  """Table, observer and dataset of the frame-once replay for one agent.

  Same interface as `replay.StepReplay`, so `experiment.replay_layout` can hand
  out either. One item per env step (one writer per env of a batch).

  Args:
    collect_data_spec: the agent's `collect_data_spec` (a Trajectory of specs);
      its observation must be uint8 (H, W, stack_size), newest frame last.
    sequence_length: steps per sampled trajectory (n_step_update + 1).
    clip_reward: if set, sampled rewards are clipped to [-clip, clip] for the
      learning target; stored rewards (and reported returns) stay raw.
    chunk_length: steps per Reverb chunk; larger compresses better, but items
      reach the table up to this many steps late.
  """

  def __init__(self, collect_data_spec: trajectory_lib.Trajectory, sequence_length: int,
               clip_reward: Optional[float] = None, chunk_length: int = 32):
    obs = collect_data_spec.observation
    if (not isinstance(obs, tf.TensorSpec) or obs.dtype != tf.uint8
        or obs.shape.rank != 3):
      raise UsageError(
          f'frame_replay.enabled=True needs uint8 stacked frames (H, W, stack) as '
          f'observations, e.g. make_env.wrappers=[@atari_preprocessing]; got {obs}')
    if tree.flatten(collect_data_spec.policy_info):
      raise UsageError('frame_replay.enabled=True supports agents without policy_info only')
    action = collect_data_spec.action
    if not action.dtype.is_integer or int(np.max(action.maximum)) >= _MAX_EXACT_FLOAT32_INT:
      raise UsageError(f'frame_replay.enabled=True needs a small discrete action space; got {action}')
    if clip_reward is not None and clip_reward <= 0:
      raise UsageError(f'frame_replay.clip_reward={clip_reward} must be positive (or None)')
    if chunk_length < 1:
      raise UsageError(f'frame_replay.chunk_length={chunk_length} must be at least 1')
    self.spec = collect_data_spec
    self.frame_shape = tuple(obs.shape[:2])
    self.stack_size = int(obs.shape[2])
    self.sequence_length = sequence_length
    # Steps an item spans: the padding frames of its first stack, then the sequence.
    self.window = self.stack_size - 1 + sequence_length
    self.clip_reward = clip_reward
    self.chunk_length = chunk_length

  def signature(self) -> dict:
    return {'frame': tf.TensorSpec((self.window,) + self.frame_shape, tf.uint8, 'frame'),
            'meta': tf.TensorSpec((self.window, len(replay.META_FIELDS)), tf.float32, 'meta')}

  @property
  def rows_per_item(self) -> int:
    """Training rows (transitions) in one table item."""
    return 1

  def make_table(self, capacity: int, priority_exponent: Optional[float] = None,
                 rate_limiter: Optional[reverb.rate_limiters.RateLimiter] = None
                 ) -> reverb.Table:
    """The FIFO replay table (`replay.make_table`) for frame items; `capacity` counts transitions."""
    logging.info('Frame-once replay: %d-frame stacks rebuilt from items of %d steps',
                 self.stack_size, self.window)
    return replay.make_table(self.signature(), capacity, priority_exponent, rate_limiter)

  def make_observer(self, client: reverb.Client, num_envs: int,
                    table: str = replay.TABLE) -> 'FrameObserver':
    return FrameObserver(self, client, num_envs, table)

  def make_dataset(self, server_address: str, batch_size: int) -> tf.data.Dataset:
    """Batches of (Trajectory with [B, sequence_length, H, W, stack] observations, SampleInfo).

    Stacks are rebuilt after batching (one gather per batch); batches keep a
    fixed shape (`drop_remainder`), so the train function never retraces.
    """
    signature = self.signature()
    dataset = reverb.TrajectoryDataset(
        server_address, replay.TABLE,
        dtypes=tree.map_structure(lambda s: s.dtype, signature),
        shapes=tree.map_structure(lambda s: s.shape, signature),
        max_in_flight_samples_per_worker=max(16, 4 * batch_size),
        num_workers_per_iterator=2)
    dataset = dataset.batch(batch_size, drop_remainder=True)
    dataset = dataset.map(lambda sample: (self.stacked_trajectory(sample.data), sample.info))
    return dataset.prefetch(4)

  def stacked_trajectory(self, data: dict) -> trajectory_lib.Trajectory:
    """Rebuilds the agent's trajectories from a batch of items ([B, window, ...])."""
    frames, meta = data['frame'], data['meta']
    window, stack = self.window, self.stack_size
    step_type = tf.cast(meta[..., 0], tf.int32)
    # Index of the most recent FIRST step at or before each step (0 when none
    # is in the window): a running max over the window, done as a masked max.
    first_index = tf.where(step_type == _FIRST, tf.range(window)[None, :], 0)
    at_or_before = tf.linalg.band_part(tf.ones((window, window), tf.int32), -1, 0)
    last_first = tf.reduce_max(first_index[:, None, :] * at_or_before[None], axis=-1)
    # Frame q of the stack ending at step p is max(p - stack + 1 + q, last_first[p]):
    # before an episode start the agent saw copies of the FIRST frame.
    positions = tf.range(stack - 1, window)
    wanted = positions[:, None] + tf.range(-(stack - 1), 1)[None, :]   # [seq, stack]
    index = tf.maximum(wanted[None], tf.gather(last_first, positions, axis=1)[..., None])
    stacks = tf.gather(frames, index, batch_dims=1)                    # [B, seq, stack, H, W]
    observation = tf.transpose(stacks, [0, 1, 3, 4, 2])

    seq = meta[:, stack - 1:]
    spec = self.spec
    reward = seq[..., 2]
    if self.clip_reward is not None:
      reward = tf.clip_by_value(reward, -self.clip_reward, self.clip_reward)
    return trajectory_lib.Trajectory(
        step_type=tf.cast(seq[..., 0], spec.step_type.dtype),
        observation=observation,
        action=tf.cast(seq[..., 1], spec.action.dtype),
        policy_info=(),
        next_step_type=tf.cast(seq[..., 4], spec.next_step_type.dtype),
        reward=tf.cast(reward, spec.reward.dtype),
        discount=tf.cast(seq[..., 3], spec.discount.dtype))


class _EnvWriter:
  """Appends one env's steps (newest frame + meta) and creates one item per step."""

  def __init__(self, replay_: FrameReplay, client: reverb.Client, table: str):
    self._replay = replay_
    self._table = table
    keep = max(replay_.window, replay_.chunk_length)
    self._writer = client.trajectory_writer(num_keep_alive_refs=keep)
    for column in ('frame', 'meta'):
      self._writer.configure((column,), num_keep_alive_refs=keep,
                             max_chunk_length=replay_.chunk_length)
    self.priority = 1.0
    self._appended = 0      # steps in the writer's history, padding included
    self._real = 0          # steps observed
    # Steps since the last episode end (LAST step), capped: an item's first
    # n = sequence_length - 1 steps must not contain one, or its n-step target
    # would run into the next episode (tf-agents' observer ends items there too).
    self._since_last = 0
    self._previous: Optional[np.ndarray] = None

  def _check_stack(self, observation: np.ndarray, first: bool) -> None:
    """Refuses observations whose stack is not (previous frames, new frame)."""
    if first:
      ok = np.all(observation == observation[..., -1:])
    elif self._previous is not None:
      ok = np.array_equal(observation[..., :-1], self._previous[..., 1:])
    else:
      ok = True
    if not ok:
      raise ValueError(
          'frame_replay: an observation is not a frame stack padded with the first frame '
          "at episode start (FrameStackObservation(padding_type='reset'), newest frame "
          'last); stored frames could not rebuild it: use @atari_preprocessing or '
          'disable frame_replay')
    self._previous = observation

  def append(self, traj: trajectory_lib.Trajectory) -> None:
    observation = np.asarray(traj.observation)
    first = int(traj.step_type) == _FIRST
    self._check_stack(observation, first)
    step = {'frame': np.ascontiguousarray(observation[..., -1]),
            'meta': replay.meta_row(traj)}
    if self._appended == 0 and first:
      # Padding steps so that the first items of a fresh writer span a full
      # window; marked FIRST, they are never used as anything but padding.
      for _ in range(self._replay.stack_size - 1):
        self._writer.append(step)
        self._appended += 1
    self._writer.append(step)
    self._appended += 1
    self._real += 1
    n = self._replay.sequence_length - 1
    within_episode = self._since_last >= n
    self._since_last = 0 if int(traj.step_type) == _LAST else min(self._since_last + 1, n)
    if (within_episode and self._appended >= self._replay.window
        and self._real >= self._replay.sequence_length):
      window = self._replay.window
      history = self._writer.history
      self._writer.create_item(
          self._table, priority=self.priority,
          trajectory={'frame': history['frame'][-window:], 'meta': history['meta'][-window:]})

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class FrameObserver:
  """Observer of (possibly batched) trajectories; one writer per env."""

  def __init__(self, replay_: FrameReplay, client: reverb.Client, num_envs: int,
               table: str = replay.TABLE):
    replay.check_table_layout(client, replay_.signature(), table)
    self._batched = num_envs > 1
    self._writers: List[_EnvWriter] = [
        _EnvWriter(replay_, client, table) for _ in range(num_envs)]

  def update_priority(self, priority: float) -> None:
    """Priority of the items written from now on (prioritized replay: the max)."""
    for writer in self._writers:
      writer.priority = priority

  def __call__(self, traj: trajectory_lib.Trajectory) -> None:
    if not self._batched:
      self._writers[0].append(traj)
      return
    for i, writer in enumerate(self._writers):
      writer.append(tree.map_structure(lambda x, i=i: x[i], traj))

  def flush(self) -> None:
    for writer in self._writers:
      writer.flush()

  def close(self) -> None:
    for writer in self._writers:
      writer.close()


@gin.configurable
def frame_replay(collect_data_spec: trajectory_lib.Trajectory, sequence_length: int,
                 enabled: bool = False, clip_reward: Optional[float] = None,
                 chunk_length: int = 32) -> Optional[FrameReplay]:
  """The frame-once replay when `enabled` (gin: `frame_replay.enabled = True`), else None.

  Args:
    collect_data_spec, sequence_length: as for `FrameReplay`.
    enabled: store each frame once instead of whole observations.
    clip_reward: clip sampled rewards to [-clip_reward, clip_reward] for the
      TD target (Atari: 1.0); returns are reported unclipped.
    chunk_length: Reverb chunk length in steps.
  """
  if not enabled:
    if clip_reward is not None:
      raise UsageError('frame_replay.clip_reward needs frame_replay.enabled=True')
    return None
  return FrameReplay(collect_data_spec, sequence_length, clip_reward, chunk_length)
