"""Videos of episodes: play one with frames, write them as a GIF or an MP4.

Shared by `harness-eval --video` and the training runs' video trigger
(`train_eval.video_interval`, files `ROOT/videos/<env_steps>.gif` or `.mp4`).
Frames are `env.render()` of an env made with `render_mode='rgb_array'`: for
Atari that is ALE's native 210x160 RGB screen, not the 84x84 observation.

GIFs need only Pillow. MP4s need an ffmpeg binary, which the optional extra
`pip install -e '.[mp4]'` brings as a wheel (imageio-ffmpeg).
"""

from __future__ import annotations

import os
from typing import Callable, List, Optional, Tuple

import numpy as np

from harness.base.errors import UsageError

FORMATS = ('gif', 'mp4')
MP4_EXTRA = "pip install -e '.[mp4]'"


def check_format(video_format: str, setting: str = 'train_eval.video_format') -> None:
  """Raises `UsageError` for an unknown format, or mp4 without an ffmpeg."""
  if video_format not in FORMATS:
    raise UsageError(f"{setting}={video_format!r} must be 'gif' or 'mp4'")
  if video_format == 'mp4' and not ffmpeg_available():
    raise UsageError(f'{setting}: mp4 videos need an ffmpeg binary: {MP4_EXTRA} '
                     "(imageio-ffmpeg), or use 'gif'")


def format_of(path: str) -> str:
  """'gif' or 'mp4' from a file name; raises `UsageError` for other names."""
  extension = os.path.splitext(path)[1].lower().lstrip('.')
  if extension not in FORMATS:
    raise UsageError(f'--video={path} must end in .gif or .mp4')
  check_format(extension, f'--video={path}')
  return extension


def ffmpeg_available() -> bool:
  try:
    import imageio_ffmpeg  # pylint: disable=g-import-not-at-top
    return bool(imageio_ffmpeg.get_ffmpeg_exe())
  except (ImportError, RuntimeError):
    return False


def play(action: Callable[[object], np.ndarray], env, episodes: int = 1,
         epsilon: float = 0.0, rng: Optional[np.random.Generator] = None,
         record_first: bool = True) -> Tuple[List[float], List[int], List[np.ndarray]]:
  """Plays `episodes` episodes of an unbatched py env with `action(time_step)`.

  Returns the episodes' returns, their lengths (steps) and the first one's
  frames when `record_first`: the reset frame, then one per step, so
  `len(frames) == lengths[0] + 1`. With `epsilon` > 0 a uniformly random
  action (from `rng`) replaces the policy's with that probability.
  """
  rng = rng if rng is not None else np.random.default_rng(0)
  returns, lengths, frames = [], [], []
  spec = env.action_spec()
  for episode in range(episodes):
    record = record_first and episode == 0
    time_step = env.reset()
    if record:
      frames.append(np.asarray(env.render()))
    total, length = 0.0, 0
    while not time_step.is_last():
      if epsilon > 0 and rng.random() < epsilon:
        chosen = np.asarray(rng.integers(spec.minimum, spec.maximum + 1), spec.dtype)
      else:
        chosen = action(time_step)
      time_step = env.step(chosen)
      total += float(time_step.reward)
      length += 1
      if record:
        frames.append(np.asarray(env.render()))
    returns.append(total)
    lengths.append(length)
  return returns, lengths, frames


def write(frames: List[np.ndarray], path: str, fps: int = 30, max_width: int = 0) -> str:
  """Writes RGB frames to `path` (.gif: a looping animated GIF; .mp4: H.264);
  frames wider than `max_width` (0 = never) are shrunk. Returns `path`.

  In a GIF, identical consecutive frames (a cart that moved less than a pixel)
  become one frame shown that much longer (`read_gif` counts them again).
  """
  if not frames:
    raise ValueError('no frames to write')
  video_format = format_of(path)
  from PIL import Image  # pylint: disable=g-import-not-at-top
  images = []
  for frame in frames:
    image = Image.fromarray(np.asarray(frame, np.uint8))
    if max_width and image.width > max_width:
      image = image.resize((max_width, round(image.height * max_width / image.width)),
                           Image.BILINEAR)
    images.append(image)
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  stem, extension = os.path.splitext(path)
  partial = f'{stem}.partial{extension}'  # a stopped run leaves no half-written video
  if video_format == 'gif':
    images[0].save(partial, format='GIF', save_all=True, append_images=images[1:], loop=0,
                   duration=frame_ms(fps), optimize=False)
  else:
    import imageio.v2 as imageio  # pylint: disable=g-import-not-at-top
    # H.264 wants even sizes; macro_block_size=2 pads by at most one pixel.
    with imageio.get_writer(partial, format='FFMPEG', fps=fps, codec='libx264',
                            macro_block_size=2, ffmpeg_log_level='error') as writer:
      for image in images:
        writer.append_data(np.asarray(image))
  os.replace(partial, path)
  return path


def frame_ms(fps: int) -> int:
  """How long a GIF shows each frame: GIF counts in units of 10 ms, and viewers
  slow down frames shorter than 20 ms."""
  return max(20, round(100 / fps) * 10)


def read_gif(path: str, fps: int = 30) -> List[np.ndarray]:
  """The frames of a GIF written at `fps`, as RGB arrays (for checks and tests).

  A GIF writer (Pillow) stores identical consecutive frames once, shown for
  their summed duration; each is repeated here by its duration, so a video of
  an episode of n steps reads back as its n + 1 frames.
  """
  from PIL import Image, ImageSequence  # pylint: disable=g-import-not-at-top
  frames = []
  with Image.open(path) as image:
    for frame in ImageSequence.Iterator(image):
      repeats = max(1, round(frame.info.get('duration', frame_ms(fps)) / frame_ms(fps)))
      frames += [np.asarray(frame.convert('RGB'))] * repeats
  return frames


class Recorder:
  """Records one greedy episode of a training run to ROOT/videos/<env_steps>.<format>.

  `policy_for(env)` gives the run's greedy policy compiled for the recorder's
  env (an unbatched env made with `render_mode='rgb_array'`); with `epsilon` > 0
  a random action replaces the policy's with that probability, as in the
  run's evaluations (`train_eval.eval_epsilon`).
  """

  def __init__(self, root_dir: str, make_env: Callable[..., object],
               policy_for: Callable[[object], object], seed: int, video_format: str = 'gif',
               fps: int = 30, epsilon: float = 0.0):
    self.folder = os.path.join(root_dir, 'videos')
    self._env = make_env(seed=seed, render_mode='rgb_array')
    self._policy = policy_for(self._env)
    self._epsilon = epsilon
    self._rng = np.random.default_rng(seed)
    self._format = video_format
    self._fps = fps

  def path(self, env_steps: int) -> str:
    return os.path.join(self.folder, f'{env_steps}.{self._format}')

  def record(self, env_steps: int) -> Tuple[str, float, int]:
    """Plays one episode; returns the video's path, the episode's return and length."""
    self._policy.refresh()  # the weights trained since the last video
    returns, lengths, frames = play(lambda step: self._policy.action(step).action, self._env,
                                    epsilon=self._epsilon, rng=self._rng)
    return write(frames, self.path(env_steps), self._fps), returns[0], lengths[0]

  def close(self) -> None:
    self._env.close()
