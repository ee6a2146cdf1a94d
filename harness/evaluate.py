"""`harness-eval`: plays a saved policy and reports its return, optionally as a video.

  harness-eval --policy_dir=runs/cartpole/policies/greedy_policy --episodes=10 \
      --video=cartpole.gif

The environment is rebuilt from the run's newest `config/operative_config-*.gin`
(env id and every other `make_env` binding, e.g. Atari preprocessing), so the
policy sees the observations it was trained on; `--env_id` swaps only the id.
"""

from __future__ import annotations

import glob
import os
import re
from typing import List, Optional

# pygame (CartPole's renderer) greets on import; keep stdout for our results.
os.environ.setdefault('PYGAME_HIDE_SUPPORT_PROMPT', '1')
# ... and SDL probes for a sound card, which servers lack (ALSA errors on stderr).
os.environ.setdefault('SDL_AUDIODRIVER', 'dummy')

from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging  # pylint: disable=g-import-not-at-top,wrong-import-position
import gin  # pylint: disable=g-import-not-at-top,wrong-import-position
import numpy as np  # pylint: disable=g-import-not-at-top,wrong-import-position

import harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from harness.base import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from harness.base import errors  # pylint: disable=g-import-not-at-top,wrong-import-position
from harness.base.errors import UsageError  # pylint: disable=g-import-not-at-top,wrong-import-position
from harness.rl import envs  # pylint: disable=g-import-not-at-top,wrong-import-position
from harness.run import video  # pylint: disable=g-import-not-at-top,wrong-import-position

_POLICY_DIR = flags.DEFINE_string(
    'policy_dir', None, 'A PolicySaver SavedModel, e.g. ROOT/policies/greedy_policy.')
_EPISODES = flags.DEFINE_integer('episodes', 10, 'Episodes to play.')
_ENV_ID = flags.DEFINE_string(
    'env_id', None, "Environment id; default: make_env.env_id of the run's operative config.")
_VIDEO = flags.DEFINE_string(
    'video', None, "Write the first episode to this .gif (or .mp4, with pip install -e '.[mp4]').")
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the first reset (later episodes follow on).')
_EPSILON = flags.DEFINE_float(
    'epsilon', 0.0, 'Probability of a uniformly random action (0 = the policy as saved).')
_FPS = flags.DEFINE_integer('fps', 30, 'Frames per second of the video.')
_VIDEO_WIDTH = flags.DEFINE_integer(
    'video_width', 320, 'Shrink video frames wider than this many pixels (0 = native size).')

_PROGRAM = 'harness-eval'
_ENV_ID_LINE = re.compile(r"^\s*make_env\.env_id\s*=\s*['\"]([^'\"]+)['\"]", re.MULTILINE)


def run_root(policy_dir: str) -> Optional[str]:
  """The run directory holding `policy_dir` (ROOT/policies/NAME), if it is one."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(policy_dir)))
  return root if os.path.isdir(os.path.join(root, 'config')) else None


def newest_operative_config(root: str) -> Optional[str]:
  """ROOT/config/operative_config-<train_step>.gin with the highest train step."""
  def step(path: str) -> int:
    match = re.search(r'operative_config-(\d+)\.gin$', path)
    return int(match.group(1)) if match else -1
  paths = glob.glob(os.path.join(root, 'config', 'operative_config-*.gin'))
  return max(paths, key=step) if paths else None


def configure_env(config_path: Optional[str]) -> Optional[str]:
  """Applies the run's gin config so `make_env()` builds the run's environment.

  Returns the configured env id. If gin cannot parse the file (a module it
  imports is gone), only the env id is read and `make_env` keeps its defaults.
  """
  gin.clear_config()
  if not config_path:
    return None
  with open(config_path) as f:
    text = f.read()
  match = _ENV_ID_LINE.search(text)
  env_id = match.group(1) if match else None
  try:
    # Configurables this program never imports (the agent's) are skipped.
    gin.parse_config(text, skip_unknown=True)
  except Exception as e:  # pylint: disable=broad-except
    logging.warning('Could not apply %s (%s); using make_env defaults with env id %s',
                    config_path, errors.first_line(e), env_id)
    gin.clear_config()
  return env_id


def load_policy(policy_dir: str):
  """The SavedModel as a py policy that takes unbatched time steps."""
  if not os.path.isfile(os.path.join(policy_dir, 'saved_model.pb')):
    raise UsageError(f'--policy_dir={policy_dir} holds no saved policy (saved_model.pb): '
                     'pass ROOT/policies/greedy_policy of a run')
  from tf_agents.policies import py_tf_eager_policy  # pylint: disable=g-import-not-at-top
  specs = os.path.join(policy_dir, 'policy_specs.pbtxt')
  return py_tf_eager_policy.SavedModelPyTFEagerPolicy(
      policy_dir, load_specs_from_pbtxt=os.path.isfile(specs), use_tf_function=True)


def _check_specs(policy, env, env_id: str) -> None:
  expected = policy.time_step_spec.observation
  got = env.observation_spec()
  if tuple(expected.shape) != tuple(got.shape):
    raise UsageError(f'{env_id} gives observations of shape {tuple(got.shape)} but the policy '
                     f'expects {tuple(expected.shape)}: pass the --env_id it was trained on')
  n_policy = int(policy.action_spec.maximum - policy.action_spec.minimum + 1)
  n_env = int(env.action_spec().maximum - env.action_spec().minimum + 1)
  if n_policy != n_env:
    raise UsageError(f'{env_id} has {n_env} actions but the policy has {n_policy}: '
                     'pass the --env_id it was trained on')


def main(argv: List[str]) -> None:
  if len(argv) > 1:
    raise UsageError(f'unexpected arguments {argv[1:]}: use --flag=value forms')
  policy_dir = _POLICY_DIR.value
  if not policy_dir:
    raise UsageError('--policy_dir is required: e.g. --policy_dir=runs/cartpole/policies/greedy_policy')
  if not os.path.isdir(policy_dir):
    raise UsageError(f'--policy_dir={policy_dir} does not exist: pass ROOT/policies/greedy_policy')
  if _EPISODES.value < 1:
    raise UsageError(f'--episodes={_EPISODES.value} must be at least 1')
  if not 0.0 <= _EPSILON.value <= 1.0:
    raise UsageError(f'--epsilon={_EPSILON.value} is outside [0, 1]')
  if _VIDEO.value:
    video.format_of(_VIDEO.value)  # .gif, or .mp4 with an ffmpeg
  harness.quiet_tensorflow_logs()

  root = run_root(policy_dir)
  config = newest_operative_config(root) if root else None
  with errors.held_output(replay_on_error=logging.get_verbosity() >= logging.DEBUG):
    configured_id = configure_env(config)
    env_id = _ENV_ID.value or configured_id
    if not env_id:
      raise UsageError(f'no operative config found for {policy_dir} (expected '
                       'ROOT/config/operative_config-*.gin): pass --env_id')
    env = envs.make_env(env_id=env_id, seed=_SEED.value,
                        render_mode='rgb_array' if _VIDEO.value else None)
    policy = load_policy(policy_dir)
    _check_specs(policy, env, env_id)
  logging.info('Playing %s with %s (config %s)', env_id, policy_dir, config or 'none')

  rng = np.random.default_rng(_SEED.value)
  returns, _, frames = video.play(lambda step: policy.action(step).action, env,
                                  _EPISODES.value, _EPSILON.value, rng,
                                  record_first=bool(_VIDEO.value))
  env.close()
  mean, std = float(np.mean(returns)), float(np.std(returns))
  print(f'{env_id}: return {mean:.2f} +- {std:.2f} over {len(returns)} episodes '
        f'(min {min(returns):.2f}, max {max(returns):.2f})')
  if _VIDEO.value:
    video.write(frames, _VIDEO.value, _FPS.value, _VIDEO_WIDTH.value)
    print(f'video of episode 1 ({len(frames)} frames, return {returns[0]:.2f}): {_VIDEO.value}')


def run() -> None:
  """Console-script entry point."""
  cli.run_app(_PROGRAM, main, cli.Command(
      program=_PROGRAM,
      summary='plays a saved policy, reports its return and can write an episode as a video.',
      usage='--policy_dir=ROOT/policies/NAME [--episodes=N] [--video=FILE.gif] [flags]',
      example='harness-eval --policy_dir=runs/cartpole/policies/greedy_policy --episodes=10 '
              '--video=cartpole.gif',
      module=__name__))


if __name__ == '__main__':
  run()
