"""ddqn-harness: a TF-Agents experiment harness for DQN-family agents."""

import contextlib
import io
import os

# TensorFlow's C++ start-up chatter (CUDA probing on a CPU machine) would bury
# our one-line errors on stderr; users can set TF_CPP_MIN_LOG_LEVEL themselves.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
# Rendering (videos): pygame greets on import, and SDL probes for a sound card,
# which servers lack (eight ALSA error lines on stderr).
os.environ.setdefault('PYGAME_HIDE_SUPPORT_PROMPT', '1')
os.environ.setdefault('SDL_AUDIODRIVER', 'dummy')

# tf-agents 0.19 imports the unmaintained `gym` (we use gymnasium), which prints
# a deprecation banner on stderr at import time: import it once, silently.
with contextlib.redirect_stderr(io.StringIO()):
  try:
    import gym  # pylint: disable=unused-import
  except ImportError:
    pass


def quiet_tensorflow_logs() -> None:
  """Keeps TensorFlow's and the other libraries' lines out of our log unless
  --verbosity asks for them (see `harness.quiet`); where the log goes is the
  entry point's choice (`errors.log_to_stdout`) or a Ray job's (its own file)."""
  from harness import quiet  # pylint: disable=g-import-not-at-top
  quiet.setup_log(to_stdout=False)
