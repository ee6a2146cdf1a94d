"""MinAtar (Young & Tian, 2019): five Atari games as 10x10xC boolean grids.

`make_env.env_id='MinAtar/<Game>-v1'` (the game's minimal action set) or
`-v0` (all six actions, as in the paper's curves) for Asterix, Breakout,
Freeway, Seaquest and SpaceInvaders. The `minatar` package (the `minatar`
extra) registers those ids with gymnasium only when asked, so `harness.rl.envs`
calls `register()` here whenever an id's namespace is `MinAtar`: no gin import
is needed. Frames are env steps (MinAtar has no frame skip); sticky actions
(10%) and difficulty ramping are the package's defaults, as in the paper.
"""

from __future__ import annotations

import warnings

import gymnasium as gym

from harness.base.errors import UsageError

GAMES = ('Asterix', 'Breakout', 'Freeway', 'Seaquest', 'SpaceInvaders')
ENV_IDS = tuple(f'MinAtar/{game}-v{version}' for game in GAMES for version in (0, 1))


def register() -> None:
  """Registers the `MinAtar/...` ids with gymnasium, once."""
  if all(env_id in gym.registry for env_id in ENV_IDS):
    return
  try:
    import minatar.gym  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise UsageError(f'MinAtar ids need the minatar package ({e}): '
                     "pip install -e '.[minatar]'") from e
  # -v0 is the published curves' action set: gymnasium's "v0 is out of date" warning
  # on every make would only be noise.
  warnings.filterwarnings('ignore', message=r'.*MinAtar/.*-v0 is out of date')
  minatar.gym.register_envs()
