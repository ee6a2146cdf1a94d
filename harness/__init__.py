"""ddqn-harness: a TF-Agents experiment harness for DQN-family agents."""

import os

# TensorFlow's C++ start-up chatter (CUDA probing on a CPU machine) would bury
# our one-line errors on stderr; users can set TF_CPP_MIN_LOG_LEVEL themselves.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
# Rendering (videos): pygame greets on import, and SDL probes for a sound card,
# which servers lack (eight ALSA error lines on stderr).
os.environ.setdefault('PYGAME_HIDE_SUPPORT_PROMPT', '1')
os.environ.setdefault('SDL_AUDIODRIVER', 'dummy')
# numpy's OpenBLAS on one thread: the harness's numpy work is tiny (the host
# policy's MLP on a few observations), and OpenBLAS's second thread contended
# with TensorFlow's for the two cores: a policy call took 0.42 ms in a run with
# it, 0.15 ms without, and the run 13 % less wall time (docs/performance.md).
# Read when numpy loads, so it takes effect where `harness` is imported first.
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')

# tf-agents 0.19 imports the unmaintained `gym` (we use gymnasium), whose import
# prints a deprecation notice on stderr, looked up in the `gym_notices` package:
# emptying that table silences it. (Importing gym here, inside a stderr redirect,
# did too, but cost every process 0.5 s and 33 MiB: the sweep driver and its
# Ray trial workers, which never import tf-agents, included.)
try:
  from gym_notices import notices as _gym_notices
  _gym_notices.notices.clear()
except ImportError:
  pass


def quiet_tensorflow_logs() -> None:
  """Keeps TensorFlow's and the other libraries' lines out of our log unless
  --verbosity asks for them (see `harness.base.quiet`); where the log goes is the
  entry point's choice (`errors.log_to_stdout`) or a Ray job's (its own file)."""
  from harness.base import quiet  # pylint: disable=g-import-not-at-top
  quiet.setup_log(to_stdout=False)
