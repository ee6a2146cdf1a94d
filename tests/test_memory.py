"""What keeps long runs flat: allocator settings (harness/base/memory.py) and leak-free counters."""

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

from harness.base import memory
from harness.base.errors import UsageError
from harness.rundir import checkpoints

# Runs in a fresh interpreter so this test's own heap history does not matter.
# Freeing every other block leaves holes no top-of-heap trim can return; with
# glibc's defaults (after one 8 MiB block raised its threshold) none of the
# 100 MiB goes back on its own. Prints the MiB that went back to the OS.
_FREE_EVERY_OTHER_BLOCK = textwrap.dedent("""
    import sys
    import numpy as np
    from harness.base import memory
    pin, release = sys.argv[1] == 'pin', sys.argv[2] == 'release'
    if pin:
      assert memory.configure_allocator()
    big = np.ones(8 * 2**20, np.uint8); del big
    blocks = [np.ones(512 * 1024, np.uint8) for _ in range(400)]  # 200 MiB of 512 KiB tensors
    held = memory.rss_mb()
    del blocks[::2]
    if release:
      memory.release_free_memory()
    print(held - memory.rss_mb())
""")


def _returned_mib(pin: bool, release: bool) -> float:
  out = subprocess.run([sys.executable, '-c', _FREE_EVERY_OTHER_BLOCK,
                        'pin' if pin else 'default', 'release' if release else 'keep'],
                       check=True, capture_output=True, text=True).stdout
  return float(out)


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc allocator settings')
def test_freed_tensor_sized_blocks_return_to_the_os():
  returned = _returned_mib(pin=True, release=False)
  assert returned > 90, f'only {returned:.0f} of 100 MiB freed went back to the OS'


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='glibc malloc_trim')
def test_release_free_memory_returns_freed_heap_pages():
  returned = _returned_mib(pin=False, release=True)
  assert returned > 90, f'only {returned:.0f} of 100 MiB freed went back after malloc_trim'


# Blocks of 256 KiB, between the MLP default and the Atari config's value: the
# gin binding decides whether glibc mmaps them. Prints the mmapped MiB held.
_MMAPPED_256K_BLOCKS = textwrap.dedent("""
    import ctypes, sys
    import gin
    from harness.base import memory
    gin.parse_config(sys.argv[1])
    assert memory.configure_allocator() == ('None' not in sys.argv[1])
    class MallInfo2(ctypes.Structure):
      _fields_ = [(n, ctypes.c_size_t) for n in ('arena', 'ordblks', 'smblks', 'hblks',
                  'hblkhd', 'usmblks', 'fsmblks', 'uordblks', 'fordblks', 'keepcost')]
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = MallInfo2
    libc.malloc.restype = ctypes.c_void_p
    blocks = [libc.malloc(256 * 1024) for _ in range(40)]
    print(libc.mallinfo2().hblkhd / 2**20)
""")


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), 'mallinfo2'), reason='glibc >= 2.33 mallinfo2')
@pytest.mark.parametrize('binding, mmapped', [('', False),
                                              ('configure_allocator.mmap_threshold_kib = 128', True),
                                              # glibc's own threshold starts at 128 KiB
                                              ('configure_allocator.mmap_threshold_kib = None', True)])
def test_the_mmap_threshold_is_a_gin_binding(binding, mmapped):
  out = subprocess.run([sys.executable, '-c', _MMAPPED_256K_BLOCKS, binding],
                       check=True, capture_output=True, text=True).stdout
  held_mib = float(out)
  assert (held_mib >= 10) == mmapped, f'{held_mib:.1f} MiB of 40 256-KiB blocks mmapped'


# Threads that allocate at the same time, each of which glibc would give an arena
# of its own; prints how many arenas malloc_info then reports.
_ARENAS_OF_BUSY_THREADS = textwrap.dedent("""
    import ctypes, re, sys, tempfile, threading
    import gin
    from harness.base import memory
    gin.parse_config(sys.argv[1])
    memory.configure_allocator()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.fopen.restype = ctypes.c_void_p
    start = threading.Barrier(8)
    def allocate():
      start.wait()
      for _ in range(2000):
        libc.free(libc.malloc(1000))
    workers = [threading.Thread(target=allocate) for _ in range(8)]
    for worker in workers: worker.start()
    for worker in workers: worker.join()
    with tempfile.NamedTemporaryFile('r') as report:
      stream = libc.fopen(report.name.encode(), b'w')
      libc.malloc_info(0, ctypes.c_void_p(stream))
      libc.fclose(ctypes.c_void_p(stream))
      print(len(re.findall('<heap nr=', report.read())))
""")


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), 'malloc_info'), reason='glibc malloc_info')
def test_max_arenas_caps_the_arenas_that_threads_get():
  def arenas(binding: str) -> int:
    return int(subprocess.run([sys.executable, '-c', _ARENAS_OF_BUSY_THREADS, binding],
                              check=True, capture_output=True, text=True).stdout)

  assert arenas('configure_allocator.max_arenas = 2') <= 2
  # Without the cap the same threads spread over more: the test can tell the two apart.
  assert arenas('') > 2


@pytest.mark.parametrize('value', [0, -1, 2.5, True])
def test_max_arenas_out_of_range_is_refused(value):
  with pytest.raises(UsageError, match=f'max_arenas={value!r} must be'):
    memory.configure_allocator(max_arenas=value)


# TensorFlow imported first, as harness-train does, then the allocator settings,
# then a 16 MiB tensor. The pool is capped at 1 MiB here, so the op fails where
# TensorFlow's tensors come from the pool and runs where they come from malloc.
_TENSOR_UNDER_A_1_MIB_POOL = textwrap.dedent("""
    import sys
    import gin
    import tensorflow as tf
    from harness.base import memory
    gin.parse_config(sys.argv[1])
    memory.configure_allocator()
    try:
      tf.reduce_sum(tf.ones([2**22]) * 2.0).numpy()
      print('malloc')
    except tf.errors.ResourceExhaustedError:
      print('pool')
""")


@pytest.mark.parametrize('binding, source', [('', 'malloc'),
                                             ('configure_allocator.tf_cpu_pool = True', 'pool')])
def test_tf_cpu_pool_serves_tensorflows_tensors(binding, source):
  env = {k: v for k, v in os.environ.items() if k != memory.TF_CPU_POOL_VARIABLE}
  env['TF_CPU_BFC_MEM_LIMIT_IN_MB'] = '1'
  out = subprocess.run([sys.executable, '-c', _TENSOR_UNDER_A_1_MIB_POOL, binding], env=env,
                       check=True, capture_output=True, text=True).stdout
  assert out.split()[-1] == source


def test_tf_cpu_pool_must_be_a_bool():
  with pytest.raises(UsageError, match="tf_cpu_pool='yes' must be True or False"):
    memory.configure_allocator(tf_cpu_pool='yes')


def test_a_mmap_threshold_out_of_range_is_refused():
  with pytest.raises(UsageError, match='mmap_threshold_kib=4 must be'):
    memory.configure_allocator(mmap_threshold_kib=4)


def test_rss_is_measured():
  assert 10 < memory.rss_mb() < 100_000


def _live_malloc_bytes() -> int:
  """Bytes in use in all malloc arenas plus mmapped blocks (glibc mallinfo2)."""

  class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        'arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks', 'uordblks',
        'fordblks', 'keepcost')]

  mallinfo2 = ctypes.CDLL(None).mallinfo2
  mallinfo2.restype = MallInfo2
  info = mallinfo2()
  return info.uordblks + info.hblkhd


@pytest.mark.skipif(not hasattr(ctypes.CDLL(None), 'mallinfo2'), reason='glibc >= 2.33 mallinfo2')
def test_setting_the_env_step_counter_every_iteration_keeps_no_memory():
  # Run loops set the counter once per iteration with a new value each time.
  # Assigning a Python int keeps ~650 bytes per new value in TF 2.15 (its cache
  # of tensors made from Python scalars): 12.6 MiB here.
  # Values far from any other test's, so none is cached already whatever ran
  # before in this process.
  first = 7_000_000_000
  run_state = checkpoints.RunState()
  for step in range(first, first + 1_000):
    run_state.set_env_steps(step)
  before = _live_malloc_bytes()
  for step in range(first + 1_000, first + 21_000):
    run_state.set_env_steps(step)
  kept = (_live_malloc_bytes() - before) / 2**20
  assert int(run_state.env_steps.numpy()) == first + 20_999
  assert kept < 2, f'{kept:.1f} MiB kept by 20,000 counter updates'
