"""The parts every job of a run is built from: envs, the agent, the replay layout.

One set of parts for both layouts (one process, or replay / collect / learn /
eval jobs): a job builds what it needs from a `RunConfig` with these functions
and never wires components by hand.
"""

from __future__ import annotations

import random
from typing import Optional, Union

import numpy as np
import tensorflow as tf
from tf_agents.environments import py_environment
from tf_agents.specs import tensor_spec
from tf_agents.train.utils import train_utils

from harness.rl import agents
from harness.rl import collect
from harness.rl import envs
from harness.rl import exploration
from harness.rl import frame_replay
from harness.rl import learn
from harness.rl import replay
from harness.run.settings import RunConfig
from harness.rundir import checkpoints
from harness.rundir.checkpoints import AgentParts  # built here, checkpointed there

ReplayLayout = Union[replay.StepReplay, frame_replay.FrameReplay]


def seed_everything(seed: int) -> None:
  random.seed(seed)
  np.random.seed(seed)
  tf.random.set_seed(seed)


def make_collect_env(cfg: RunConfig, seed: int) -> py_environment.PyEnvironment:
  """`num_envs` envs as one batch (or one env); fails early on a bad env id."""
  if cfg.num_envs > 1:
    return envs.make_batched_env(cfg.num_envs, seed)
  return envs.make_env(seed=seed)


def build_agent(cfg: RunConfig, env: py_environment.PyEnvironment) -> AgentParts:
  """The gin-configured DdqnAgent for `env`'s specs, with fresh counters."""
  train_step = train_utils.create_train_step()
  run_state = checkpoints.RunState()
  built = agents.make_agent(tensor_spec.from_spec(env.time_step_spec()),
                            tensor_spec.from_spec(env.action_spec()),
                            train_step, run_state.env_steps)
  # Checks the frame_replay bindings now (before ROOT is touched) and puts them
  # into the operative config, which RunDirectory reads next.
  frame_replay.frame_replay(built.agent.collect_data_spec, built.sequence_length)
  exploration.Exploration()  # likewise
  return AgentParts(built, train_step, run_state)


def collect_policy(parts: AgentParts, env: py_environment.PyEnvironment, seed: int):
  """The py policy that collects on `env`: epsilon-greedy, or ez-greedy
  (`Exploration.temporally_extended`) around the greedy policy; both explore
  with the epsilon schedule and draw with `seed`."""
  settings = exploration.Exploration()
  if not settings.temporally_extended:
    return collect.py_policy_for(parts.agent.collect_policy, env, seed)
  return exploration.TemporallyExtendedPolicy(collect.py_policy_for(parts.agent.policy, env),
                                              parts.built.epsilon, env, settings, seed)


def replay_layout(cfg: RunConfig, parts: AgentParts) -> ReplayLayout:
  """How transitions are stored: whole steps (grouped per env batch), or each
  image frame once (`frame_replay.enabled`, Atari)."""
  frames = frame_replay.frame_replay(parts.agent.collect_data_spec, parts.sequence_length)
  if frames:
    return frames
  return replay.StepReplay(parts.agent.collect_data_spec, parts.sequence_length, cfg.num_envs)


def prioritized_settings(cfg: RunConfig) -> Optional[learn.PrioritizedReplay]:
  return learn.PrioritizedReplay() if cfg.prioritized_replay else None


def make_replay_table(cfg: RunConfig, layout: ReplayLayout, rate_limiter=None):
  per = prioritized_settings(cfg)
  return layout.make_table(cfg.replay_capacity,
                           priority_exponent=per.priority_exponent if per else None,
                           rate_limiter=rate_limiter)
