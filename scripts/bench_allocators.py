"""Learning-phase agent steps/s of an Atari run under each memory allocator, alternating.

Issue 29's comparison: glibc with the mmap threshold pinned at 128 KiB and
TensorFlow's tensors from its own pool (what gin/ddqn_atari.gin ships) against
the alternatives that leave glibc's adaptive threshold alone or replace malloc. Each setting is a `harness-train` run of
--gin_file (default: gin/ddqn_atari.gin as shipped, overlap on) with its own
environment and bindings; the settings take turns for `--pairs` rounds, one run
at a time on an otherwise idle machine.
Beside each run's rate it prints the system CPU seconds of the run (page faults,
mmap and munmap show up there). The slope of each under a 100,000-step soak is
`scripts/soak.py` with the same environment (docs/performance.md).

  python scripts/bench_allocators.py --pairs=2 --steps=7000
  python scripts/bench_allocators.py --allocators=pin128 --allocators=tcmalloc

jemalloc and tcmalloc are Debian's `libjemalloc2` and `libtcmalloc-minimal4`
(`apt-get install`); a setting whose library is missing is left out with a line.
"""

from __future__ import annotations

import functools
import os
import resource
import statistics
import sys
from typing import Dict, List

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_overlap  # pylint: disable=g-import-not-at-top  (the scripts share its flags)

_LIB = '/usr/lib/x86_64-linux-gnu'
# name -> (environment added, bindings added, library that must exist or None).
# Every setting says whether TensorFlow's pool is on, whatever the gin file ships, and
# where malloc is replaced or left adaptive, the harness's mallopt pin is turned off.
_POOL = ['configure_allocator.tf_cpu_pool=True']
_NO_POOL = ['configure_allocator.tf_cpu_pool=False']
_ADAPTIVE = ['configure_allocator.mmap_threshold_kib=None'] + _NO_POOL
_ARENAS2 = ['configure_allocator.max_arenas=2']
ALLOCATORS = {
    # The 128 KiB pin with TensorFlow's BFC pool (configure_allocator.tf_cpu_pool): as shipped.
    'pool_pin128': ({}, _POOL, None),
    'pin128': ({}, _NO_POOL, None),  # the pin alone (shipped until the pool)
    'glibc_arena2': ({'MALLOC_ARENA_MAX': '2'}, _ADAPTIVE, None),
    # The same two arenas set by the harness itself (mallopt at start-up).
    'adaptive_arenas2': ({}, _ADAPTIVE + _ARENAS2, None),
    'pool_adaptive_arenas2': ({}, ['configure_allocator.mmap_threshold_kib=None'] + _ARENAS2 +
                              _POOL, None),
    # The pool by TensorFlow's own environment variable (the same switch as pool_pin128).
    'tf_bfc': ({'TF_CPU_ALLOCATOR_USE_BFC': 'true'}, [], None),
    'jemalloc': ({'LD_PRELOAD': f'{_LIB}/libjemalloc.so.2',
                  'MALLOC_CONF': 'background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0'},
                 _ADAPTIVE, f'{_LIB}/libjemalloc.so.2'),
    'tcmalloc': ({'LD_PRELOAD': f'{_LIB}/libtcmalloc_minimal.so.4'}, _ADAPTIVE,
                 f'{_LIB}/libtcmalloc_minimal.so.4'),
}

_WHICH = flags.DEFINE_multi_string('allocators', list(ALLOCATORS),
                                   f'Settings to compare, of {", ".join(ALLOCATORS)}.')

_system_seconds: Dict[str, List[float]] = {}


def run_once(name: str, out_dir: str) -> float:
  """One run under allocator `name`; returns its learning-phase agent steps/s."""
  environment, bindings, _ = ALLOCATORS[name]
  before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime
  rate = bench_overlap.run_harness(name, out_dir, bindings, environment)
  _system_seconds.setdefault(name, []).append(
      resource.getrusage(resource.RUSAGE_CHILDREN).ru_stime - before)
  return rate


def main(argv: List[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments {argv[1:]}: name each as --allocators=NAME')
  names = []
  for name in _WHICH.value:
    if name not in ALLOCATORS:
      raise app.UsageError(f'unknown allocator {name!r}: one of {", ".join(ALLOCATORS)}')
    library = ALLOCATORS[name][2]
    if library and not os.path.exists(library):
      print(f'{name}: {library} is missing (apt-get install it): left out')
      continue
    names.append(name)
  medians = bench_overlap.alternate({n: functools.partial(run_once, n) for n in names})
  for name in names:
    seconds = _system_seconds[name]
    print(f'{name}: {medians[name] / medians[names[0]]:.2f}x {names[0]}, system CPU '
          f'{statistics.median(seconds):.0f} s a run (median of {len(seconds)})')


if __name__ == '__main__':
  app.run(main)
