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
"""

from __future__ import annotations

import ctypes
from typing import Optional

from absl import logging
import gin
import psutil

from harness.base.errors import UsageError

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

# Blocks at least this large are mmapped and unmapped at free. A fixed value
# also stops glibc's dynamic raising of the threshold (see the module doc).
DEFAULT_MMAP_THRESHOLD_KIB = 512
_MAX_KIB = 32 * 1024  # glibc's HEAP_MAX on 64-bit: mallopt refuses more


def _glibc() -> Optional[ctypes.CDLL]:
  # The C library this process already runs on: no search for a file by name.
  libc = ctypes.CDLL(None)
  if not (hasattr(libc, 'mallopt') and hasattr(libc, 'malloc_trim')):
    return None  # musl, macOS: a different allocator with its own behaviour
  return libc


_LIBC = _glibc()


@gin.configurable
def configure_allocator(mmap_threshold_kib: Optional[int] = DEFAULT_MMAP_THRESHOLD_KIB) -> bool:
  """Pins glibc's mmap and trim thresholds; True where that took effect.

  Args:
    mmap_threshold_kib: blocks of at least this many KiB are mmapped and go back
      to the operating system at free; the heap is trimmed above it too. None
      leaves glibc's adaptive thresholds (and any allocator put in by
      LD_PRELOAD, e.g. jemalloc or tcmalloc) as they are.
  """
  if mmap_threshold_kib is None:
    logging.info('Allocator thresholds left to the C library (configure_allocator.'
                 'mmap_threshold_kib=None)')
    return False
  if (isinstance(mmap_threshold_kib, bool) or not isinstance(mmap_threshold_kib, int) or
      not 16 <= mmap_threshold_kib <= _MAX_KIB):
    raise UsageError(f'configure_allocator.mmap_threshold_kib={mmap_threshold_kib!r} must be an '
                     f'integer from 16 to {_MAX_KIB} (KiB; glibc\'s limit is 32 MiB), or None '
                     'for glibc\'s adaptive threshold: 512 for MLPs, 128 for Atari')
  if _LIBC is None:
    logging.info('Not glibc: allocator settings left as they are')
    return False
  threshold = mmap_threshold_kib * 1024
  ok = (_LIBC.mallopt(_M_MMAP_THRESHOLD, threshold) == 1 and
        _LIBC.mallopt(_M_TRIM_THRESHOLD, threshold) == 1)
  if not ok:
    logging.warning('mallopt refused the mmap/trim thresholds: RSS may creep on long runs')
  return ok


def release_free_memory() -> None:
  """Returns free pages of all heap arenas to the operating system (glibc)."""
  if _LIBC is not None:
    _LIBC.malloc_trim(0)


def rss_mb() -> float:
  """Resident set size of this process in MiB."""
  return psutil.Process().memory_info().rss / 2**20
