"""Where each agent's gradient step goes: op time summed per op type, beside DDQN's.

Builds each agent's compiled train call as `scripts/bench_throughput.py
--compare_agents` does (same gin file and bindings), runs `--calls` calls of each
under `tf.profiler`, and prints per op type the microseconds per gradient step of
each agent, largest differences from the first agent first. Op times are
executor-side (the ops' own kernels); the step's wall time is printed beside them.
No timing is asserted anywhere; this is for finding what to cut.

  python scripts/profile_agent_step.py --agents ddqn c51 --gin_file=gin/ddqn_cartpole.gin \\
      --gin_bindings train_eval.initial_collect_steps=2000 make_agent.min_q_value=0.0 \\
      make_agent.max_q_value=100.0
"""

import argparse
import collections
import glob
import os
import sys
import tempfile
import time
from typing import Dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_throughput  # pylint: disable=wrong-import-position  (builds the trainers)


def op_microseconds(trace_dir: str) -> Dict[str, float]:
  """Summed duration per op type over the host-thread events of one profile."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  space = xplane_pb2.XSpace()
  with open(glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'), recursive=True)[0], 'rb') as f:
    space.ParseFromString(f.read())
  totals: Dict[str, float] = collections.defaultdict(float)
  for plane in space.planes:
    if plane.name != '/host:CPU':
      continue
    names = {i: m.name for i, m in plane.event_metadata.items()}
    for line in plane.lines:
      # TensorFlow's own threads (tf_Compute, tf_inter_op...) and the executor's.
      if line.name.startswith('tf_') or 'Executor' in line.name:
        for event in line.events:
          name = names.get(event.metadata_id, '?')
          # Kernel events read "op_name:OpType"; keep the type.
          if ':' in name:
            totals[name.rsplit(':', 1)[1]] += event.duration_ps / 1e6
  return totals


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--gin_file', default=os.path.join(bench_throughput.REPO, 'gin',
                                                         'ddqn_cartpole.gin'))
  parser.add_argument('--gin_bindings', nargs='*', default=[])
  parser.add_argument('--agents', nargs='*', default=['ddqn', 'c51'])
  parser.add_argument('--calls', type=int, default=3)
  parser.add_argument('--top', type=int, default=25)
  args = parser.parse_args()
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  variants = {a: (args.agents[0], [f"make_agent.agent='{a}'"]) for a in args.agents}
  trainers = bench_throughput.build_trainers(args.gin_file, args.gin_bindings, variants)
  per_step: Dict[str, Dict[str, float]] = {}
  for label, (trainer, _, _, _) in trainers.items():
    trainer()  # warm
    trace_dir = tempfile.mkdtemp(prefix=f'profile-{label}-')
    tf.profiler.experimental.start(trace_dir)
    start = time.perf_counter()
    for _ in range(args.calls):
      trainer()
    wall = time.perf_counter() - start
    tf.profiler.experimental.stop()
    steps = args.calls * trainer.steps_per_call
    per_step[label] = {op: us / steps for op, us in op_microseconds(trace_dir).items()}
    print(f'{label}: {wall / steps * 1e3:.2f} ms per step under the profiler, '
          f'{sum(per_step[label].values()):.0f} us of op time', flush=True)
  base = args.agents[0]
  ops = set().union(*per_step.values())
  # Largest differences from the first agent first; with one agent, its largest ops.
  order = sorted(ops, key=lambda op: (
      -max(abs(per_step[a].get(op, 0.0) - per_step[base].get(op, 0.0)) for a in args.agents),
      -per_step[base].get(op, 0.0)))
  print('| op type | ' + ' | '.join(f'{a} us/step' for a in args.agents) + ' |')
  print('|---|' + '---|' * len(args.agents))
  for op in order[:args.top]:
    print(f'| {op} | ' + ' | '.join(f'{per_step[a].get(op, 0.0):.1f}' for a in args.agents) + ' |')
  for _, server, _, _ in trainers.values():
    server.stop()


if __name__ == '__main__':
  main()
