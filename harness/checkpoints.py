"""Checkpoints of a run: TF state, the Reverb table, and exported policies."""

from __future__ import annotations

import os
import shutil
from typing import Optional

from absl import logging
import numpy as np
import reverb
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.policies import policy_saver
from tf_agents.utils import common

from harness.metrics import EpisodeStats


class RunState(tf.Module):
  """Counters and statistics that a resumed run must continue from."""

  def __init__(self, window: int = 10):
    super().__init__(name='run_state')
    self.env_steps = tf.Variable(0, dtype=tf.int64, name='env_steps')
    self.episodes = tf.Variable(0, dtype=tf.int64, name='episodes')
    self.recent_returns = tf.Variable(
        np.full(window, np.nan, np.float32), name='recent_returns')
    self.best_eval_return = tf.Variable(-np.inf, dtype=tf.float32, name='best_eval_return')

  def save_stats(self, stats: EpisodeStats) -> None:
    self.env_steps.assign(stats.env_steps)
    self.episodes.assign(stats.episodes)
    window = self.recent_returns.shape[0]
    values = np.full(window, np.nan, np.float32)
    recent = list(stats.recent_returns)[-window:]
    values[:len(recent)] = recent
    self.recent_returns.assign(values)

  def load_stats(self, stats: EpisodeStats) -> None:
    stats.env_steps = int(self.env_steps.numpy())
    stats.episodes = int(self.episodes.numpy())
    stats.recent_returns.clear()
    stats.recent_returns.extend(
        float(r) for r in self.recent_returns.numpy() if np.isfinite(r))


def train_dir(root_dir: str) -> str:
  return os.path.join(root_dir, 'train')


def make_checkpointer(root_dir: str, agent: dqn_agent.DqnAgent,
                      run_state: RunState) -> common.Checkpointer:
  """tf-agents' Checkpointer over agent (with optimizer and epsilon) and counters.

  Note: it restores the newest checkpoint inside its constructor.
  """
  return common.Checkpointer(
      ckpt_dir=train_dir(root_dir),
      max_to_keep=3,
      agent=agent,
      train_step=agent.train_step_counter,
      run_state=run_state)


def save_replay(client: reverb.Client) -> str:
  """Writes the Reverb checkpoint (into the server's own `ROOT/replay/`)."""
  path = client.checkpoint()
  logging.info('Reverb checkpoint written to %s', path)
  return path


class PolicyExporter:
  """Writes greedy, collect and best policies as SavedModels with PolicySaver.

  Each export goes to a temporary directory first and is swapped in by rename,
  so a crash mid-write never leaves a half-written policy in place.
  """

  def __init__(self, root_dir: str, agent: dqn_agent.DqnAgent):
    self._dir = os.path.join(root_dir, 'policies')
    step = agent.train_step_counter
    self._greedy = policy_saver.PolicySaver(agent.policy, train_step=step)
    self._collect = policy_saver.PolicySaver(agent.collect_policy, train_step=step)

  def path(self, name: str) -> str:
    return os.path.join(self._dir, name)

  def _save(self, saver: policy_saver.PolicySaver, name: str) -> None:
    final = self.path(name)
    tmp, old = final + '.tmp', final + '.old'
    shutil.rmtree(tmp, ignore_errors=True)
    saver.save(tmp)
    if os.path.exists(final):
      os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)

  def save_current(self) -> None:
    self._save(self._greedy, 'greedy_policy')
    self._save(self._collect, 'collect_policy')

  def save_best(self) -> None:
    self._save(self._greedy, 'best_policy')


def latest_checkpoint(root_dir: str) -> Optional[str]:
  return tf.train.latest_checkpoint(train_dir(root_dir))
