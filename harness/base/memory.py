"""Process memory: glibc allocator settings that keep long runs flat, and RSS.

What grew on long Atari runs was not a leak but the C heap. Every gradient step
allocates and frees tensors of a few MiB (a batch of 32 stacked 84x84x4
observations, the conv activations). glibc serves blocks above its mmap
threshold with mmap and returns them at free, but it raises that threshold to
the largest block ever freed (up to 32 MiB), after which those tensors come
from the heap arenas and freed pages stay with the process. Measured on
Breakout with a full table (1,000 training calls of 4 gradient steps each, in
one process): RSS +95 MiB with glibc's defaults, +14 MiB with a fixed 128 KiB
threshold; after a `malloc_trim`, within a few MiB of where it started.

So a run pins the threshold at start-up and hands free heap pages back to the
operating system at each metrics row (a `malloc_trim` takes milliseconds).
Both are no-ops where the C library is not glibc.

The threshold is a trade of speed for flatness, so it is a gin binding
(`configure_allocator.mmap_threshold_kib`). The default, 512 KiB, suits the MLP
configs: every block above the threshold costs an mmap, page faults on first
touch and an munmap each time, and at 128 KiB the 256 KiB gradients and
optimizer temporaries of a (256, 256) MLP were mmapped at every gradient step:
a CartPole learner spent ~25 % of its CPU in page faults and munmap (perf), a
quarter of harness-launch's speed. `gin/ddqn_atari.gin` pins 128 KiB: there the
conv layers' gradients and activations (128 to 512 KiB each) would otherwise be
recycled through the arenas between long-lived replay blocks, and a Breakout
soak read +1.22 MB per 10,000 steps at 512 KiB against +0.90 and +0.95 at 128
KiB, while the mmaps cost little beside the conv work itself.

The number of malloc arenas is a second binding (`configure_allocator.max_arenas`).
glibc gives each new thread an arena of its own at its first malloc, up to 8
per core, and an arena keeps its freed pages in holes between live blocks.
On MinAtar (a 100,000-item table turning over, the acting, trainer and Reverb
threads all allocating) RSS settled upward over the first table turnovers:
+4.1 MB per 100,000 frames over a 1M-frame soak with the default arenas, +1.7
with two, +0.7 with two and TensorFlow's pool (`tf_cpu_pool`, which the MinAtar
file also sets; docs/memory.md, "MinAtar").
The limit is set with mallopt at start-up, before TensorFlow or Reverb start
their threads, so no environment variable or re-exec is needed.

The third takes TensorFlow's tensors out of malloc altogether
(`configure_allocator.tf_cpu_pool`): TensorFlow's own best-fit pool (BFC, as on
GPUs) then serves every CPU tensor from regions it keeps, so the tensors that
come and go at every gradient step leave no holes between malloc's long-lived
blocks. The pool grows to the run's peak and keeps it. On Breakout with
prioritized replay and the 128 KiB pin for the rest of malloc: 143 agent
steps/s against 137 with the pin alone (side by side, three pairs), and a
100,000-step soak +0.56 MB per 10,000 steps from outside (docs/performance.md).
TensorFlow reads the switch when it makes its CPU device, at its first op, so
it is set before then, as the thread pools are.
"""

from __future__ import annotations

import ctypes
import os
from typing import Optional

from absl import logging
import gin
import psutil

from harness.base.errors import UsageError

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

# Blocks at least this large are mmapped and unmapped at free. A fixed value
# also stops glibc's dynamic raising of the threshold (see the module doc).
DEFAULT_MMAP_THRESHOLD_KIB = 512
_MAX_KIB = 32 * 1024  # glibc's HEAP_MAX on 64-bit: mallopt refuses more
_MAX_ARENAS = 1024  # far above glibc's own 8 per core; a typo guard, not a tuning limit
# TensorFlow's switch for its BFC pool on the CPU (read when its CPU device is made).
TF_CPU_POOL_VARIABLE = 'TF_CPU_ALLOCATOR_USE_BFC'


def _glibc() -> Optional[ctypes.CDLL]:
  # The C library this process already runs on: no search for a file by name.
  libc = ctypes.CDLL(None)
  if not (hasattr(libc, 'mallopt') and hasattr(libc, 'malloc_trim')):
    return None  # musl, macOS: a different allocator with its own behaviour
  return libc


_LIBC = _glibc()


@gin.configurable
def configure_allocator(mmap_threshold_kib: Optional[int] = DEFAULT_MMAP_THRESHOLD_KIB,
                        max_arenas: Optional[int] = None, tf_cpu_pool: bool = False) -> bool:
  """Pins glibc's mmap and trim thresholds, caps its arenas and moves TensorFlow's
  tensors to its own pool; True where a malloc setting was asked for and took effect.

  Call it before TensorFlow runs an op and before Reverb starts its threads:
  arenas that exist already stay, and TensorFlow picks its CPU allocator once.

  Args:
    mmap_threshold_kib: blocks of at least this many KiB are mmapped and go back
      to the operating system at free; the heap is trimmed above it too. None
      leaves glibc's adaptive thresholds (and any allocator put in by
      LD_PRELOAD, e.g. jemalloc or tcmalloc) as they are.
    max_arenas: at most this many malloc arenas for all threads (glibc's
      `M_ARENA_MAX`, as the `MALLOC_ARENA_MAX` environment variable); None keeps
      glibc's default of 8 per core.
    tf_cpu_pool: TensorFlow's CPU tensors from its BFC pool instead of malloc
      (the `TF_CPU_ALLOCATOR_USE_BFC` environment variable, which wins where a
      user has set it).
  """
  _check_settings(mmap_threshold_kib, max_arenas, tf_cpu_pool)
  if tf_cpu_pool:
    _use_tf_cpu_pool()
  if mmap_threshold_kib is None and max_arenas is None:
    logging.info('malloc settings left to the C library (configure_allocator.'
                 'mmap_threshold_kib=None, max_arenas=None)')
    return False
  if _LIBC is None:
    logging.info('Not glibc: allocator settings left as they are')
    return False
  ok = True
  if mmap_threshold_kib is not None:
    threshold = mmap_threshold_kib * 1024
    ok = (_LIBC.mallopt(_M_MMAP_THRESHOLD, threshold) == 1 and
          _LIBC.mallopt(_M_TRIM_THRESHOLD, threshold) == 1)
    if not ok:
      logging.warning('mallopt refused the mmap/trim thresholds: RSS may creep on long runs')
  else:
    logging.info('mmap threshold left adaptive (configure_allocator.mmap_threshold_kib=None)')
  if max_arenas is not None:
    if _LIBC.mallopt(_M_ARENA_MAX, max_arenas) != 1:
      logging.warning('mallopt refused max_arenas=%d: RSS may creep on long runs', max_arenas)
      ok = False
  return ok


def _use_tf_cpu_pool() -> None:
  # Imported here, so that this module (which harness.base.errors imports) loads
  # TensorFlow only where the pool is asked for.
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
  if context.context()._initialized:  # pylint: disable=protected-access
    logging.warning('configure_allocator.tf_cpu_pool=True came after TensorFlow made its CPU '
                    'device: tensors stay in malloc for this process')
    return
  os.environ.setdefault(TF_CPU_POOL_VARIABLE, 'true')
  logging.info('TensorFlow CPU tensors from its BFC pool (%s=%s)', TF_CPU_POOL_VARIABLE,
               os.environ[TF_CPU_POOL_VARIABLE])


def _check_settings(mmap_threshold_kib: Optional[int], max_arenas: Optional[int],
                    tf_cpu_pool: bool) -> None:
  def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

  if mmap_threshold_kib is not None and not (is_int(mmap_threshold_kib) and
                                             16 <= mmap_threshold_kib <= _MAX_KIB):
    raise UsageError(f'configure_allocator.mmap_threshold_kib={mmap_threshold_kib!r} must be an '
                     f'integer from 16 to {_MAX_KIB} (KiB; glibc\'s limit is 32 MiB), or None '
                     'for glibc\'s adaptive threshold: 512 for MLPs, 128 for Atari')
  if max_arenas is not None and not (is_int(max_arenas) and 1 <= max_arenas <= _MAX_ARENAS):
    raise UsageError(f'configure_allocator.max_arenas={max_arenas!r} must be an integer from 1 '
                     f'to {_MAX_ARENAS}, or None for glibc\'s default (8 per core): 2 for MinAtar')
  if not isinstance(tf_cpu_pool, bool):
    raise UsageError(f'configure_allocator.tf_cpu_pool={tf_cpu_pool!r} must be True or False')


def release_free_memory() -> None:
  """Returns free pages of all heap arenas to the operating system (glibc)."""
  if _LIBC is not None:
    _LIBC.malloc_trim(0)


def rss_mb() -> float:
  """Resident set size of this process in MiB."""
  return psutil.Process().memory_info().rss / 2**20
