"""Atari preprocessing as one gymnasium wrapper for `make_env.wrappers`.

The standard DQN pipeline on top of an `ALE/<Game>-v5` env made with
`frameskip=1`: gymnasium's `AtariPreprocessing` (no-op starts, frame skip with a
max-pool over the last two frames, 84x84 grayscale) and `FrameStackObservation`
(padding a new episode with copies of its first frame), then the stack axis
moved last, because TF conv layers want channels-last (84, 84, 4).

`harness.rl.frame_replay` relies on exactly this layout: the newest frame is
`obs[..., -1]` and an episode starts with all channels equal.
"""

from __future__ import annotations

import gin
import gymnasium as gym
from gymnasium.wrappers import AtariPreprocessing
from gymnasium.wrappers import FrameStackObservation
import numpy as np

from harness.base.errors import UsageError


class ChannelsLast(gym.ObservationWrapper):
  """(stack, H, W) -> (H, W, stack), the layout of TF conv layers."""

  def __init__(self, env: gym.Env):
    super().__init__(env)
    space = env.observation_space
    self.observation_space = gym.spaces.Box(
        low=np.moveaxis(space.low, 0, -1), high=np.moveaxis(space.high, 0, -1),
        dtype=space.dtype)

  def observation(self, observation: np.ndarray) -> np.ndarray:
    # A contiguous copy: the replay observer and the policy both read it.
    return np.ascontiguousarray(np.moveaxis(observation, 0, -1))


@gin.configurable
def atari_preprocessing(env: gym.Env,
                        noop_max: int = 30,
                        frame_skip: int = 4,
                        screen_size: int = 84,
                        stack_size: int = 4) -> gym.Env:
  """Wraps an ALE env (made with `frameskip=1`) into stacked 84x84 grayscale frames.

  Args:
    env: the base env, e.g. `gymnasium.make('ALE/Breakout-v5', frameskip=1)`.
    noop_max: up to this many no-op actions after each reset (random starts).
    frame_skip: emulator frames per agent step; the last two are max-pooled.
    screen_size: side of the square grayscale frame.
    stack_size: frames per observation (channels of the network input).
  Returns:
    An env whose observations are uint8 arrays (screen_size, screen_size,
    stack_size), newest frame last.
  """
  if not hasattr(env.unwrapped, 'ale'):
    raise UsageError(f'atari_preprocessing wraps ALE games only, not {env.spec and env.spec.id}: '
                     "use make_env.env_id='ALE/<Game>-v5' or drop the wrapper")
  base_skip = getattr(env.unwrapped, '_frameskip', 1)
  if base_skip != 1:
    raise UsageError(
        f'atari_preprocessing does its own frame skipping but the base env skips '
        f"{base_skip} frames: add make_env.make_kwargs={{'frameskip': 1}}")
  for name, value, least in (('noop_max', noop_max, 0), ('frame_skip', frame_skip, 1),
                             ('screen_size', screen_size, 1), ('stack_size', stack_size, 1)):
    if value < least:
      raise UsageError(f'atari_preprocessing.{name}={value} must be at least {least}, '
                       'e.g. noop_max=30, frame_skip=4, screen_size=84, stack_size=4')
  env = AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip,
                           screen_size=screen_size, terminal_on_life_loss=False,
                           grayscale_obs=True, scale_obs=False)
  env = FrameStackObservation(env, stack_size, padding_type='reset')
  return ChannelsLast(env)
