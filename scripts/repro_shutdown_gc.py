"""Shows the Ray 2.40 crash that `ray_runtime.stop` avoids, and that it avoids it.

An ObjectRef in a reference cycle is freed by the garbage collector; if that
collection runs on another thread while `ray.shutdown()` is destroying the core
worker, the process dies on the spot (its Ray agents left running). A sweep's
driver died so (its Ray log ends with "The core worker process is not
initialized yet or already shutdown"): garbage from Tune's run, and
summary.png drawn on a thread while Ray stops.

Each round starts embedded Ray, leaves ObjectRefs in cycles (garbage, not yet
collected), starts a thread that collects garbage `delay` seconds later, and
stops Ray; the rounds step the delay across the time the stop takes:

  python scripts/repro_shutdown_gc.py --stop=ray      # plain ray.shutdown(): dies
  python scripts/repro_shutdown_gc.py --stop=harness  # ray_runtime.stop: survives

Prints one line per round; the process exits 0 only if it survived them all
(a crash ends it with no line after the round's `stopping` line).
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
from typing import List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags

from harness.base import ray_runtime

_STOP = flags.DEFINE_enum('stop', 'harness', ['ray', 'harness'],
                          'ray: plain ray.shutdown(); harness: ray_runtime.stop.')
_DELAYS = flags.DEFINE_list('delays', [f'{0.02 * i:.2f}' for i in range(1, 11)],
                            'Seconds after the stop begins at which the thread collects, '
                            'one round each.')


class _Cycle:
  """Refers to itself, so only the garbage collector frees it."""


def _leave_refs_in_cycles(ray, count: int = 2000) -> None:
  for _ in range(count):
    cycle = _Cycle()
    cycle.me, cycle.ref = cycle, ray.put(1)


def _collect_after(delay: float) -> threading.Thread:
  def collect() -> None:
    time.sleep(delay)
    gc.collect()

  thread = threading.Thread(target=collect, daemon=True)
  thread.start()
  return thread


def main(argv: List[str]) -> None:
  del argv
  for delay in (float(d) for d in _DELAYS.value):
    ray_runtime.start(None, num_cpus=1)
    import ray  # pylint: disable=g-import-not-at-top
    gc.disable()  # the cycles stay until a collection
    _leave_refs_in_cycles(ray)
    print(f'delay {delay:.2f} s: stopping', flush=True)
    collector = _collect_after(delay)
    if _STOP.value == 'ray':
      ray.shutdown()
    else:
      ray_runtime.stop(embedded=True, program='repro_shutdown_gc')
    collector.join()
    gc.enable()
    print(f'delay {delay:.2f} s: survived', flush=True)


if __name__ == '__main__':
  app.run(main)
