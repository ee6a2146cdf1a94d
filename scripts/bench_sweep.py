"""The overhead of `harness-sweep` on this machine.

Runs a 2 x 2 grid (two learning rates x two seeds) of 5,000-step CartPole runs
(`gin/ddqn_cartpole.gin`) at `--max_concurrent=2` and compares:

- the sweep's wall time (the command, start to exit: input check, Ray start,
  scheduling, summaries) against
- the sum of the trials' own wall times (each harness-train process, start to
  exit, from trials.csv) / 2, what the four runs cost two at a time with no
  sweep around them;

and samples, every 0.25 s, the CPU seconds of every process the sweep started
(where a fixed cost on two cores comes from), and the resident memory of the driver plus Ray's own
processes (gcs_server, raylet, Ray workers, dashboard and log monitor
processes...), that is every process the sweep started except the
harness-train children. Targets: overhead <= 15 %, peak < 1 GB.

    python scripts/bench_sweep.py [--root_dir=/tmp/bench_sweep] [--steps=5000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Dict, List, Tuple

import psutil

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from harness.sweeps import aggregate  # pylint: disable=wrong-import-position

TAG = 'HARNESS_SWEEP_BENCH'


def tagged(tag: str) -> List[psutil.Process]:
  procs = []
  for proc in psutil.process_iter(['pid']):
    try:
      if proc.environ().get(TAG) == tag and proc.status() != psutil.STATUS_ZOMBIE:
        procs.append(proc)
    except (psutil.Error, OSError):
      continue
  return procs


def is_child(proc: psutil.Process) -> bool:
  """A harness-train process (a trial, or the driver's --check_only)."""
  try:
    return 'harness.train' in ' '.join(proc.cmdline())
  except psutil.Error:
    return True


def sample(tag: str) -> Tuple[float, float, Dict[str, float]]:
  """Total RSS and PSS (MiB) of the sweep's own processes, and RSS per process.

  RSS counts the pages that several processes share (Python, Ray's libraries)
  once per process; PSS splits each shared page among its users, so the PSS
  total is what the processes take from the machine together.
  """
  total, total_pss, parts = 0.0, 0.0, {}
  for proc in tagged(tag):
    if is_child(proc):
      continue
    try:
      info = proc.memory_full_info()
      name = proc.name()
    except psutil.Error:
      continue
    total += info.rss / 2**20
    total_pss += info.pss / 2**20
    parts[f'{name}:{proc.pid}'] = info.rss / 2**20
  return total, total_pss, parts


def cpu_label(proc: psutil.Process) -> str:
  """What a process is, for the CPU seconds table."""
  try:
    cmdline = ' '.join(proc.cmdline())
    name = proc.name()
  except psutil.Error:
    return '?'
  if 'harness.train' in cmdline:
    return 'harness-train --check_only' if '--check_only' in cmdline else 'harness-train trials'
  for needle, label in (('dashboard/agent.py', 'dashboard agent'),
                        ('runtime_env/agent', 'runtime-env agent'),
                        ('log_monitor', 'log monitor'), ('harness.sweep', 'harness-sweep'),
                        ('harness-sweep', 'harness-sweep')):
    if needle in cmdline:
      return label
  return name


def record_cpu(tag: str, cpu: Dict[int, Tuple[str, float]],
               trials: Dict[int, List[float]]) -> None:
  """The latest user + system CPU seconds of every process of the sweep, by pid;
  and [started, last seen] of every trial's harness-train, for the timeline."""
  now = time.time()
  for proc in tagged(tag):
    try:
      times = proc.cpu_times()
      label = cpu_label(proc)
      if label == 'harness-train trials':
        trials.setdefault(proc.pid, [proc.create_time(), now])[1] = now
    except psutil.Error:
      continue
    # Labelled at every sample: a child just forked still carries its parent's name.
    cpu[proc.pid] = (label, times.user + times.system)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--root_dir', default=None, help='sweep directory (default: temporary)')
  parser.add_argument('--steps', type=int, default=5000)
  args = parser.parse_args()
  root = args.root_dir or os.path.join(tempfile.mkdtemp(prefix='bench_sweep_'), 'sweep')
  if os.path.exists(root):
    shutil.rmtree(root)
  os.makedirs(os.path.dirname(root), exist_ok=True)
  tag = uuid.uuid4().hex
  cmd = [os.path.join(os.path.dirname(sys.executable), 'harness-sweep'), f'--root_dir={root}',
         f'--gin_file={os.path.join(REPO, "gin", "ddqn_cartpole.gin")}',
         f'--gin_bindings=train_eval.num_env_steps={args.steps}',
         '--sweep=make_agent.learning_rate=[2.3e-3, 1e-3]', '--seeds=2', '--max_concurrent=2']
  if not os.path.exists(cmd[0]):
    cmd[0:1] = [sys.executable, '-m', 'harness.sweep']
  env = dict(os.environ, **{TAG: tag})
  print('$', ' '.join(cmd[1:]) if cmd[0].endswith('harness-sweep') else ' '.join(cmd),
        flush=True)
  print(f'load average before: {os.getloadavg()[0]:.2f}', flush=True)
  peak, peak_pss, peak_parts = 0.0, 0.0, {}
  cpu: Dict[int, Tuple[str, float]] = {}
  trial_spans: Dict[int, List[float]] = {}
  start = time.time()
  with open(os.path.join(os.path.dirname(root), 'bench_sweep.log'), 'w') as log:
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    while proc.poll() is None:
      total, total_pss, parts = sample(tag)
      if total > peak:
        peak, peak_parts = total, parts
      peak_pss = max(peak_pss, total_pss)
      record_cpu(tag, cpu, trial_spans)
      time.sleep(0.25)
  wall = time.time() - start
  if proc.returncode != 0:
    sys.exit(f'harness-sweep exited {proc.returncode}: see {log.name}')
  rows = aggregate.read_csv(os.path.join(root, aggregate.TRIALS_FILE))
  own = [float(r['wall_seconds']) for r in rows]
  ideal = sum(own) / 2
  overhead = (wall - ideal) / ideal * 100
  print(f'trials: {len(rows)}, their own wall times: {", ".join(f"{s:.1f}" for s in own)} s')
  print(f'sweep wall time: {wall:.1f} s; sum of trial wall times / 2: {ideal:.1f} s; '
        f'overhead: {overhead:+.1f} % (target <= 15 %)')
  by_kind: Dict[str, float] = {}
  for key, rss in peak_parts.items():
    kind = key.split(':')[0]
    by_kind[kind] = by_kind.get(kind, 0.0) + rss
  print(f'peak RSS of the driver + Ray processes: {peak:.0f} MiB (target < 1 GB); at the peak: '
        + ', '.join(f'{k} {v:.0f}' for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))
  print(f'peak PSS of the same processes (shared pages counted once): {peak_pss:.0f} MiB')
  by_label: Dict[str, float] = {}
  for label, seconds in cpu.values():
    by_label[label] = by_label.get(label, 0.0) + seconds
  print('CPU seconds by process (sampled every 0.25 s, so a little short): ' + ', '.join(
      f'{k} {v:.1f}' for k, v in sorted(by_label.items(), key=lambda kv: -kv[1])))
  spans = sorted((begin - start, end - start) for begin, end in trial_spans.values())
  print('timeline, seconds from the command\'s start (ends to within 0.25 s): trials ran '
        + ', '.join(f'{begin:.1f}-{end:.1f}' for begin, end in spans) + f'; exit {wall:.1f}')
  print(f'load average after: {os.getloadavg()[0]:.2f}; sweep: {root}')


if __name__ == '__main__':
  main()
