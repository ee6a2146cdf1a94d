"""What the machine's arithmetic units are good at, for settings that depend on it.

bfloat16 pays only where the hardware has bfloat16 units: on a CPU with
AVX512_BF16 or AMX (the Nature-CNN step is about a quarter cheaper on this
project's AVX512_BF16 machine, docs/performance.md); elsewhere oneDNN converts in
software and the step gets slower. On a GPU it is compute capability 8.0
(Ampere) or later.
"""

from __future__ import annotations

from typing import Iterable

import tensorflow as tf

# /proc/cpuinfo flags of CPUs with bfloat16 dot-product units.
BFLOAT16_CPU_FLAGS = frozenset({'avx512_bf16', 'amx_bf16'})


def cpu_flags(cpuinfo_path: str = '/proc/cpuinfo') -> frozenset:
  """The CPU's feature flags (Linux), or none where /proc/cpuinfo is missing."""
  try:
    with open(cpuinfo_path, encoding='utf-8') as f:
      for line in f:
        if line.startswith('flags'):
          return frozenset(line.split(':', 1)[1].split())
  except OSError:
    pass
  return frozenset()


def cpu_has_bfloat16_units(flags: Iterable[str]) -> bool:
  """True for a CPU with AVX512_BF16 or AMX among these /proc/cpuinfo flags."""
  return bool(BFLOAT16_CPU_FLAGS & frozenset(flags))


def has_bfloat16_units() -> bool:
  """True where bfloat16 math runs on hardware units: every visible GPU is
  Ampere or later, or (no GPU) this machine's CPU has AVX512_BF16 or AMX."""
  gpus = tf.config.list_physical_devices('GPU')
  if gpus:
    return all(tuple(tf.config.experimental.get_device_details(gpu).get(
        'compute_capability', (0, 0))) >= (8, 0) for gpu in gpus)
  return cpu_has_bfloat16_units(cpu_flags())
