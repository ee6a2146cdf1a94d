"""Gymnasium environments as tf-agents `PyEnvironment`s.

tf-agents 0.19 only knows the old `gym` API (one `done` flag), so this module
holds our own adapter for gymnasium's `terminated` / `truncated` pair:
`terminated` ends the episode with discount 0 (no bootstrap), `truncated` ends it
with discount 1 so that the TD target still bootstraps from the last observation.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any, Callable, Optional, Sequence

import gin
import gymnasium as gym
import numpy as np
from tf_agents.environments import batched_py_environment
from tf_agents.environments import py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from harness.base import quiet
from harness.base.errors import UsageError

_MID = np.asarray(ts.StepType.MID, np.int32)
_LAST = np.asarray(ts.StepType.LAST, np.int32)
_ZERO = np.asarray(0.0, np.float32)
_ONE = np.asarray(1.0, np.float32)

# Gymnasium wrappers applied around the base env, innermost first. Atari
# preprocessing plugs in here (see gin/ddqn_atari.gin).
EnvWrapper = Callable[[gym.Env], gym.Env]


def _observation_spec(space: gym.Space) -> array_spec.ArraySpec:
  if not isinstance(space, gym.spaces.Box):
    raise UsageError(
        f'observation space {space} is not supported; use an environment with a '
        'Box observation space (or wrap it with gymnasium.wrappers.FlattenObservation)')
  dtype = np.dtype(space.dtype)
  low, high = np.asarray(space.low), np.asarray(space.high)
  if np.all(np.isfinite(low)) and np.all(np.isfinite(high)):
    # Scalar bounds when uniform keep the spec (and the gin-printed config) small.
    low = low.flat[0] if np.all(low == low.flat[0]) else low
    high = high.flat[0] if np.all(high == high.flat[0]) else high
    return array_spec.BoundedArraySpec(space.shape, dtype, low, high, name='observation')
  return array_spec.ArraySpec(space.shape, dtype, name='observation')


def _action_spec(space: gym.Space, env_id: str) -> array_spec.BoundedArraySpec:
  if not isinstance(space, gym.spaces.Discrete):
    raise UsageError(
        f'{env_id} has a {type(space).__name__} action space {space}; DDQN needs a '
        'Discrete action space: pick a discrete environment (e.g. CartPole-v1) or '
        'discretize its actions with a gymnasium wrapper')
  start = int(space.start)
  return array_spec.BoundedArraySpec(
      (), np.int64, start, start + int(space.n) - 1, name='action')


class GymnasiumPyEnvironment(py_environment.PyEnvironment):
  """Adapts one gymnasium env to the tf-agents `PyEnvironment` API.

  Auto-reset is left to `PyEnvironment` (`handle_auto_reset=True`): the step
  after a LAST time step resets the env and returns a FIRST time step.

  With `life_loss_as_terminal`, a step that loses a life (read from
  `info['lives']`) keeps its MID step type but gets discount 0: the TD target
  does not bootstrap across a lost life (the classic DQN trick), while the
  episode, and so the reported return, still covers the whole game.
  """

  def __init__(self, env: gym.Env, env_id: str = '', seed: Optional[int] = None,
               life_loss_as_terminal: bool = False):
    super().__init__(handle_auto_reset=True)
    # Set by `truncate_first_episode`: steps left in the first episode.
    self._first_episode_steps_left: Optional[int] = None
    self._env = env
    self._life_loss_as_terminal = life_loss_as_terminal
    self._lives: Optional[int] = None
    self._env_id = env_id or str(env.spec.id if env.spec else env)
    self._observation_spec = _observation_spec(env.observation_space)
    self._action_spec = _action_spec(env.action_space, self._env_id)
    self._seed = seed
    self._last_info: dict = {}

  @property
  def gym_env(self) -> gym.Env:
    return self._env

  @property
  def env_id(self) -> str:
    return self._env_id

  def observation_spec(self) -> array_spec.ArraySpec:
    return self._observation_spec

  def action_spec(self) -> array_spec.BoundedArraySpec:
    return self._action_spec

  def get_info(self) -> dict:
    return self._last_info

  @property
  def max_episode_steps(self) -> Optional[int]:
    """The env's time limit in steps (gymnasium's `TimeLimit`), if it has one."""
    return self._env.spec.max_episode_steps if self._env.spec else None

  def truncate_first_episode(self, steps: int) -> None:
    """Ends the first episode after `steps` steps as a time limit would (discount 1)."""
    self._first_episode_steps_left = steps

  def should_reset(self, current_time_step: ts.TimeStep) -> bool:
    """PyEnvironment's auto-reset test without `TimeStep.is_last()`, which first
    asks `tf.is_tensor`: about 50 us per env step on a numpy step type here."""
    return bool(current_time_step.step_type == _LAST)

  def _observation(self, obs: Any) -> np.ndarray:
    return np.asarray(obs, dtype=self._observation_spec.dtype)

  def _reset(self) -> ts.TimeStep:
    # Seed only the first reset: later resets continue the env's own RNG, so a
    # seeded run is reproducible without repeating the same episode.
    seed, self._seed = self._seed, None
    obs, self._last_info = self._env.reset(seed=seed)
    self._lives = self._last_info.get('lives')
    return ts.restart(self._observation(obs))

  def _step(self, action: np.ndarray) -> ts.TimeStep:
    obs, reward, terminated, truncated, self._last_info = self._env.step(
        int(np.asarray(action)))
    obs = self._observation(obs)
    reward = np.asarray(reward, dtype=np.float32)
    if self._first_episode_steps_left is not None:
      self._first_episode_steps_left -= 1
      if self._first_episode_steps_left <= 0 or terminated or truncated:
        truncated, self._first_episode_steps_left = True, None
    # TimeSteps are built directly: ts.termination() and friends run tf.nest
    # checks that cost more than a CartPole step itself.
    if terminated or truncated:
      return ts.TimeStep(_LAST, reward, _ZERO if terminated else _ONE, obs)
    discount = _ONE
    lives = self._last_info.get('lives')
    if self._life_loss_as_terminal and lives is not None and self._lives is not None:
      if lives < self._lives:
        discount = _ZERO  # no bootstrap across a lost life
    self._lives = lives
    return ts.TimeStep(_MID, reward, discount, obs)

  def render(self, mode: str = 'rgb_array') -> Optional[np.ndarray]:
    return self._env.render()

  def close(self) -> None:
    self._env.close()


def _register_optional_envs(env_id: str) -> None:
  """Registers the ALE and MinAtar namespaces on demand (imported lazily: each
  pulls in a package that most runs do not need)."""
  if env_id.startswith('ALE/'):
    import ale_py  # pylint: disable=g-import-not-at-top
    gym.register_envs(ale_py)
    quiet.quiet_ale()  # no banner on stderr for every new game
  elif env_id.startswith('MinAtar/'):
    from harness.rl import minatar  # pylint: disable=g-import-not-at-top
    minatar.register()


class BinaryAsUint8(gym.ObservationWrapper):
  """Boolean observations (MinAtar's 10x10xC grids) as uint8 0/1.

  The conv layers want a numeric dtype; the network casts uint8 0/1 to 0.0/1.0
  without the 1/255 scaling that pixel frames get (`networks.q_network` scales
  by the spec's maximum).
  """

  def __init__(self, env: gym.Env):
    super().__init__(env)
    self.observation_space = gym.spaces.Box(0, 1, env.observation_space.shape, np.uint8)

  def observation(self, observation: np.ndarray) -> np.ndarray:
    return np.asarray(observation, dtype=np.uint8)


def _is_binary(space: gym.Space) -> bool:
  return isinstance(space, gym.spaces.Box) and np.dtype(space.dtype) == np.bool_


def check_env_id(env_id: str) -> None:
  """Raises `UsageError` with close matches when `env_id` is not registered."""
  _register_optional_envs(env_id)
  if env_id in gym.registry:
    return
  close = difflib.get_close_matches(env_id, list(gym.registry.keys()), n=3, cutoff=0.5)
  hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else (
      'check the id, or import the module that registers it at the top of your gin file')
  raise UsageError(f"unknown environment id {env_id!r} in make_env.env_id: {hint}")


@gin.configurable
def make_env(env_id: str = 'CartPole-v1',
             seed: Optional[int] = None,
             make_kwargs: Optional[dict] = None,
             wrappers: Sequence[EnvWrapper] = (),
             render_mode: Optional[str] = None,
             life_loss_as_terminal: bool = False) -> GymnasiumPyEnvironment:
  """Builds one environment.

  Args:
    env_id: any registered gymnasium id, including `ALE/<Game>-v5`,
      `MinAtar/<Game>-v0` / `-v1` (the `minatar` extra) and ids registered by a
      module that a gin file imports. Boolean observations reach the agent as
      uint8 0/1 (`BinaryAsUint8`).
    seed: seed of the first reset.
    make_kwargs: extra keyword arguments for `gymnasium.make`.
    wrappers: gymnasium wrappers (callables env -> env), innermost first.
    render_mode: passed to `gymnasium.make` (`rgb_array` for videos).
    life_loss_as_terminal: discount 0 on a step that loses a life (learning
      target only; the episode goes on). Needs `info['lives']` (Atari).
  """
  check_env_id(env_id)
  kwargs = dict(make_kwargs or {})
  if render_mode:
    kwargs['render_mode'] = render_mode
  env = gym.make(env_id, **kwargs)
  if life_loss_as_terminal and not hasattr(env.unwrapped, 'ale'):
    raise UsageError(
        f'make_env.life_loss_as_terminal=True needs a game with lives (an ALE/... id); '
        f'{env_id} has none: remove the binding')
  for wrap in wrappers:
    env = wrap(env)
  if _is_binary(env.observation_space):
    env = BinaryAsUint8(env)
  return GymnasiumPyEnvironment(env, env_id=env_id, seed=seed,
                                life_loss_as_terminal=life_loss_as_terminal)


def configured_env_id() -> str:
  """The env id that `make_env()` builds: its gin binding, or the default."""
  try:
    return gin.query_parameter('make_env.env_id')
  except ValueError:
    return inspect.signature(make_env).parameters['env_id'].default


@gin.configurable(allowlist=['stagger_first_episodes'])
def make_batched_env(num_envs: int, seed: int,
                     stagger_first_episodes: bool = False) -> py_environment.PyEnvironment:
  """`num_envs` copies of `make_env()` stepped as one batch, seeds seed..seed+n-1.

  Stepping in the calling thread: on two cores threads only add contention, and
  the batch exists to amortise one policy call over several env steps.

  Args:
    num_envs: envs in the batch.
    seed: seed of the first env's first reset; env i gets seed + i.
    stagger_first_episodes: env i's first episode ends (as a truncation, so it
      is bootstrapped) after i / num_envs of the env's time limit, so the envs'
      episodes start at different times. Without it, on a task whose episodes
      all run to the time limit (MountainCar before the goal is found) the envs
      stay in lockstep for good: every wave of N episodes starts at once under
      one greedy policy from similar states, N near-identical tries where one
      env makes N successive tries under N policies. Off by default: the
      shipped benchmarks other than MountainCar were measured without it, and
      on MountainCar it helped the collect policy find the goal (5 of 5 seeds
      against 2 of 5) more than the final policy (docs/benchmarks.md).
      Evaluation always plays whole episodes.
  """
  envs = [make_env(seed=seed + i) for i in range(num_envs)]
  if stagger_first_episodes:
    for i, env in enumerate(envs[1:], start=1):
      if env.max_episode_steps:
        env.truncate_first_episode(env.max_episode_steps * i // num_envs)
  return batched_py_environment.BatchedPyEnvironment(envs, multithreading=False)
