"""Checkpoints of a run: TF state paired with the Reverb table, and exported policies."""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import tempfile
import time
from typing import Dict, List, Optional

from absl import logging
import numpy as np
import reverb
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.policies import policy_saver
from tf_agents.utils import common

from harness.base import disk
from harness.base import host_calls
from harness.base.errors import UsageError
from harness.rl import agents
from harness.rl import replay
from harness.rundir.metrics import EpisodeStats
from harness.rundir.metrics import TRAIN_RETURN_WINDOW


class RunState(tf.Module):
  """Counters and statistics that a resumed run must continue from."""

  def __init__(self, window: int = 10):
    super().__init__(name='run_state')
    self.env_steps = tf.Variable(0, dtype=tf.int64, name='env_steps')
    self.episodes = tf.Variable(0, dtype=tf.int64, name='episodes')
    self.recent_returns = tf.Variable(
        np.full(window, np.nan, np.float32), name='recent_returns')
    # A checkpoint from before this variable existed restores without it: the
    # window then starts again at the resume.
    self.last100_returns = tf.Variable(
        np.full(TRAIN_RETURN_WINDOW, np.nan, np.float32), name='last100_returns')
    self.best_eval_return = tf.Variable(-np.inf, dtype=tf.float32, name='best_eval_return')
    # Priority that new items enter the prioritized table with: the max so far.
    self.max_priority = tf.Variable(1.0, dtype=tf.float32, name='max_priority')
    # Name of the Reverb checkpoint written just before this TF checkpoint: the pair.
    self.replay_checkpoint = tf.Variable('', dtype=tf.string, name='replay_checkpoint')
    # Seconds the run's launches spent up to this checkpoint (results.json).
    self.wall_seconds = tf.Variable(0.0, dtype=tf.float64, name='wall_seconds')
    # Run loops touch these two every iteration: through HostCalls, which make no
    # EagerTensor (each one leaks ~48 bytes in TF 2.15 on Python 3.11).
    def assign_env_steps(value: tf.Tensor) -> None:
      self.env_steps.assign(value, read_value=False)
    self._assign_env_steps = host_calls.HostCall(assign_env_steps, [tf.TensorSpec([], tf.int64)],
                                                 name='set_env_steps')
    self._read_max_priority = host_calls.HostCall(lambda: self.max_priority.read_value(),
                                                  name='read_max_priority')

  def set_env_steps(self, env_steps: int) -> None:
    """Sets the env-step counter (it drives the epsilon decay); run loops call
    this every iteration, with a new value each time.

    Never as a Python int: TF 2.15 caches the tensor it makes from each distinct
    Python int or float, for good (~650 bytes of C memory each, measured with
    mallinfo2), which was +0.4 MB per 10,000 Breakout steps here; and through a
    HostCall, not an eager assign, whose argument tensor would leak too.
    """
    self._assign_env_steps(np.int64(env_steps))

  def max_priority_value(self) -> float:
    """The max priority so far, read without making an EagerTensor."""
    return float(self._read_max_priority())

  def save_stats(self, stats: EpisodeStats) -> None:
    self.set_env_steps(stats.env_steps)
    self.episodes.assign(stats.episodes)
    for variable, returns in ((self.recent_returns, stats.recent_returns),
                              (self.last100_returns, stats.last100_returns)):
      window = variable.shape[0]
      values = np.full(window, np.nan, np.float32)
      recent = list(returns)[-window:]
      values[:len(recent)] = recent
      variable.assign(values)

  def load_stats(self, stats: EpisodeStats) -> None:
    stats.env_steps = int(self.env_steps.numpy())
    stats.episodes = int(self.episodes.numpy())
    for variable, returns in ((self.recent_returns, stats.recent_returns),
                              (self.last100_returns, stats.last100_returns)):
      returns.clear()
      returns.extend(float(r) for r in variable.numpy() if np.isfinite(r))


@dataclasses.dataclass
class AgentParts:
  """The agent and the counters a run checkpoints with it."""
  built: agents.BuiltAgent
  train_step: tf.Variable
  run_state: RunState

  @property
  def agent(self):
    """The tf-agents DdqnAgent."""
    return self.built.agent

  @property
  def sequence_length(self) -> int:
    return self.built.sequence_length


class WallClock:
  """Wall seconds of a run over all its launches (time after a crash's last
  checkpoint is not counted: that work is done again)."""

  def __init__(self, run_state: RunState):
    """Make it after the restore: it continues from the restored seconds."""
    self._run_state = run_state
    self._started = time.time()
    self._before = float(run_state.wall_seconds.numpy())

  def total(self) -> float:
    return self._before + time.time() - self._started

  def record(self) -> None:
    """Puts the total into the run state, before a checkpoint is written."""
    self._run_state.wall_seconds.assign(np.float64(self.total()), read_value=False)


def train_dir(root_dir: str) -> str:
  return os.path.join(root_dir, 'train')


@dataclasses.dataclass
class Reapplied:
  """A setting that the restore overwrote and the harness set back."""
  name: str
  checkpoint_value: object
  value_now: object

  def line(self) -> str:
    return f'{self.name}: {self.checkpoint_value:.6g} -> {self.value_now:.6g}'


def _readable(path: str) -> bool:
  """True when every tensor of the checkpoint at `path` can be read back."""
  try:
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
    return True
  except (tf.errors.OpError, ValueError, OSError, IndexError):  # IndexError: torn data file
    return False


def _skip_damaged_checkpoints(directory: str) -> None:
  """Points the checkpoint state at the newest readable checkpoint.

  A damaged newest checkpoint (a crash or a full disk) would make every resume
  fail; we fall back to the previous one with a warning. Damaged files are left
  where they are.
  """
  state = tf.train.get_checkpoint_state(directory)
  if state is None:
    return
  paths = list(state.all_model_checkpoint_paths)
  while paths and not _readable(paths[-1]):
    logging.warning('Checkpoint %s is damaged or incomplete: falling back to the previous '
                    'one (its files are left in place)', paths[-1])
    paths.pop()
  if paths and paths[-1] != state.model_checkpoint_path:
    tf.compat.v1.train.update_checkpoint_state(directory, paths[-1], all_model_checkpoint_paths=paths)


class ResumableCheckpointer:
  """tf-agents' Checkpointer, plus new settings that survive the restore.

  `common.Checkpointer` restores in its constructor, which puts the checkpoint's
  learning-rate variable and epsilon variables back over the values this launch
  was configured with. `initialize_or_restore()` sets them back to this launch's
  values and returns what it changed, so that resuming with new bindings does
  what the user asked.
  """

  def __init__(self, root_dir: str, built: agents.BuiltAgent, run_state: RunState,
               max_to_keep: int = 3):
    self._built = built
    # This launch's settings, read before the restore can overwrite them.
    self._wanted = {name: schedule.values() for name, schedule in built.schedules().items()}
    directory = self._directory = train_dir(root_dir)
    _skip_damaged_checkpoints(directory)
    try:
      self._checkpointer = common.Checkpointer(
          ckpt_dir=directory, max_to_keep=max_to_keep, agent=built.agent,
          train_step=built.agent.train_step_counter, run_state=run_state,
          learning_rate_schedule=built.learning_rate_schedule)
    except ValueError as e:
      raise UsageError(
          f'the checkpoint in {directory} does not fit this agent ({str(e).splitlines()[0]}): '
          'resume with the network and environment it was trained with, or use a new '
          '--root_dir') from e

  @property
  def restored(self) -> bool:
    return self._checkpointer.checkpoint_exists

  def initialize_or_restore(self) -> List[Reapplied]:
    """Finishes the restore, then re-applies this launch's epsilon and learning-rate settings."""
    self._checkpointer.initialize_or_restore()
    if not self.restored:
      return []
    changes = []
    for name, schedule in self._built.schedules().items():
      restored = schedule.values()
      schedule.assign(*self._wanted[name])
      changes += [Reapplied(binding, before, after) for binding, before, after in
                  agents.schedule_changes(name, restored, self._wanted[name])]
    # Keras Adam keeps its learning rate in a variable that the restore brought
    # back; it follows the schedule from now on (beta_1/beta_2/epsilon/clipnorm
    # are plain attributes and are not restored).
    self._built.update_learning_rate()
    for change in changes:
      logging.info('Resume re-applied %s', change.line())
    return changes

  def save(self, global_step: tf.Variable) -> None:
    """Writes ckpt-<step>; a failed write (full disk) raises `disk.WriteError` and leaves
    the previous checkpoints as they were (its half-written `_temp` files are removed)."""
    with disk.writing(self._directory, cleanup=self._remove_partial_saves):
      self._checkpointer.save(global_step)

  def _remove_partial_saves(self) -> None:
    for partial in glob.glob(os.path.join(self._directory, 'ckpt-*_temp')):
      shutil.rmtree(partial, ignore_errors=True)

  def latest(self) -> Optional[str]:
    return self._checkpointer.manager.latest_checkpoint


def check_replay_pair(run_state: RunState, replay_dir: str) -> Optional[str]:
  """Warns when the restored replay is not the one saved with the agent state.

  Reverb keeps only its newest checkpoint, so after a crash between the two
  writes the table comes from a later save than the agent. The run goes on (the
  table only holds more recent experience) but says so.
  """
  paired = run_state.replay_checkpoint.numpy().decode()
  newest = replay.newest_checkpoint(replay_dir)
  if paired == (newest or ''):
    return None
  message = (f'replay checkpoint {newest or "(none)"} is not the one saved with the agent '
             f'checkpoint ({paired or "none"}): a launch stopped between the two writes; the '
             'replay table holds experience from a different point than the agent state')
  logging.warning('%s', message)
  return message


def save_pair(client: reverb.Client, checkpointer: ResumableCheckpointer,
              run_state: RunState, train_step: tf.Variable) -> None:
  """Writes the Reverb checkpoint, then the TF checkpoint that names it.

  The TF checkpoint is the commit point: a resume always starts from a TF
  checkpoint, and `check_replay_pair` tells whether the table matches it. A
  failed write raises `disk.WriteError`; a half-written Reverb checkpoint has no
  DONE file, so no server loads it, and the next one deletes it.
  """
  with disk.writing('the Reverb checkpoint'):
    path = client.checkpoint()
  run_state.replay_checkpoint.assign(os.path.basename(path.rstrip('/')))
  checkpointer.save(train_step)
  logging.info('Checkpoint at train_step %d with replay %s', int(train_step.numpy()), path)


class PolicyExporter:
  """Writes greedy, collect and best policies as SavedModels with PolicySaver.

  The first export of each policy in a launch writes a whole SavedModel; later
  ones write only its variables (`PolicySaver.save_checkpoint`) next to the graph
  files of the first. A whole `PolicySaver.save` serializes the traced
  functions anew every time and kept about 130 KiB of RSS per call in TF 2.15
  (a CartPole MLP, measured in one process over 20 calls); writing variables
  keeps nothing, and is ten times faster. The files are what a SavedModel is
  (graph in saved_model.pb, weights in variables/), so `tf.saved_model.load`
  and harness-eval read either.

  Each export goes to a temporary directory first and is swapped in by rename,
  so a crash mid-write never leaves a half-written policy in place; a failed
  write (full disk) removes the temporary directory and raises `disk.WriteError`.
  """

  def __init__(self, root_dir: str, agent: dqn_agent.DqnAgent):
    self._dir = os.path.join(root_dir, 'policies')
    step = agent.train_step_counter
    self._savers = {'greedy': policy_saver.PolicySaver(agent.policy, train_step=step),
                    'collect': policy_saver.PolicySaver(agent.collect_policy, train_step=step)}
    # Graph files (everything but variables/) of each saver's first export.
    self._graph_files: Dict[str, Dict[str, bytes]] = {}

  def prepare(self) -> None:
    """Writes each policy's whole SavedModel once, to a temporary directory, and
    keeps its graph files; every export of this launch then writes variables only.

    Called at start-up: the first whole save keeps ~5.6 MiB of RSS per policy
    (TensorFlow's graphs of the traced functions, measured on CartPole), which
    at the first evaluation and checkpoint showed as two steps in a long run's
    memory curve; at start-up they are part of its footprint. A policy that
    cannot be exported also fails at launch instead of at the first checkpoint.
    """
    for policy in self._savers:
      if policy not in self._graph_files:
        with tempfile.TemporaryDirectory(prefix='policy-graph-') as directory:
          with disk.writing(directory):
            self._write(policy, directory)

  def path(self, name: str) -> str:
    return os.path.join(self._dir, name)

  def _write(self, policy: str, directory: str) -> None:
    saver = self._savers[policy]
    graph = self._graph_files.get(policy)
    if graph is None:
      saver.save(directory)
      self._graph_files[policy] = _graph_files(directory)
      return
    for relative, content in graph.items():
      path = os.path.join(directory, relative)
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, 'wb') as f:
        f.write(content)
    saver.save_checkpoint(directory)

  def _save(self, policy: str, name: str) -> None:
    final = self.path(name)
    tmp, old = final + '.tmp', final + '.old'
    shutil.rmtree(tmp, ignore_errors=True)
    with disk.writing(tmp, cleanup=lambda: shutil.rmtree(tmp, ignore_errors=True)):
      self._write(policy, tmp)
      if os.path.exists(final):
        os.replace(final, old)
      os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)

  def save_current(self) -> None:
    self._save('greedy', 'greedy_policy')
    self._save('collect', 'collect_policy')

  def save_best(self) -> None:
    self._save('greedy', 'best_policy')


def _graph_files(saved_model_dir: str) -> Dict[str, bytes]:
  """The files of a SavedModel other than its variables (and its fingerprint,
  whose checkpoint hash would no longer match the variables written later)."""
  files = {}
  for folder, _, names in os.walk(saved_model_dir):
    relative_folder = os.path.relpath(folder, saved_model_dir)
    if relative_folder.split(os.sep)[0] == tf.saved_model.VARIABLES_DIRECTORY:
      continue
    for name in names:
      if name == 'fingerprint.pb':
        continue
      relative = os.path.normpath(os.path.join(relative_folder, name))
      with open(os.path.join(folder, name), 'rb') as f:
        files[relative] = f.read()
  return files
