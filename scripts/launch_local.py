"""Runs a distributed layout on this machine: a replay server, N collectors, a learner.

Usage:
  python scripts/launch_local.py --root_dir=R --gin_file=F --num_collectors=N \
      [--gin_bindings=B ...] [--port=P]

Each job is `python -m harness.train --job=...` in its own process, logging to
R/logs/<job>.log. A collector or replay server that dies is started again (up
to --max_restarts times; collectors and learner reconnect with back-off). All
jobs stop on Ctrl-C or when the learner finishes. Exit status: the learner's if
it failed, 1 if another job failed past its restarts, else 0.
"""

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

import portpicker

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Job:
  """One `harness.train` process, restartable, logging to its own file."""

  def __init__(self, name: str, cmd: List[str], log_path: str):
    self.name, self.cmd, self.log_path = name, cmd, log_path
    self.proc: Optional[subprocess.Popen] = None
    self.restarts = 0

  def start(self) -> None:
    log = open(self.log_path, 'a')
    log.write(f'\n=== {time.strftime("%H:%M:%S")} starting: {" ".join(self.cmd)}\n')
    log.flush()
    self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)

  def poll(self) -> Optional[int]:
    return self.proc.poll() if self.proc else None

  def stop(self, timeout: float = 15.0) -> None:
    if self.proc and self.proc.poll() is None:
      self.proc.send_signal(signal.SIGTERM)
      try:
        self.proc.wait(timeout)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait()


def _wait_for_port(port: int, replay: Job, limit_s: float = 300) -> None:
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  import reverb  # pylint: disable=g-import-not-at-top  (heavy: only once jobs run)
  deadline = time.time() + limit_s
  while time.time() < deadline:
    if replay.poll() is not None:
      raise SystemExit(f'launch_local: the replay job failed, see {replay.log_path}')
    try:
      reverb.Client(f'localhost:{port}').server_info(timeout=2)
      return
    except Exception:  # pylint: disable=broad-except  (not up yet)
      time.sleep(0.5)
  raise SystemExit(f'launch_local: the replay job did not start in {limit_s:.0f} s')


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--root_dir', required=True)
  parser.add_argument('--gin_file', action='append', default=[])
  parser.add_argument('--gin_bindings', action='append', default=[])
  parser.add_argument('--num_collectors', type=int, default=2)
  parser.add_argument('--port', type=int, default=0, help='replay port (0: a free one)')
  parser.add_argument('--max_restarts', type=int, default=3)
  args = parser.parse_args()

  port = args.port or portpicker.pick_unused_port()
  address = f'localhost:{port}'
  logs = os.path.join(args.root_dir, 'logs')
  os.makedirs(logs, exist_ok=True)
  common = [f'--root_dir={args.root_dir}'] + [f'--gin_file={f}' for f in args.gin_file]
  common += [f'--gin_bindings={b}' for b in args.gin_bindings]
  train = [sys.executable, '-m', 'harness.train', f'--replay_address={address}']

  def job(name: str, *flags: str) -> Job:
    return Job(name, train + list(flags) + common, os.path.join(logs, f'{name}.log'))

  replay = job('replay', '--job=replay')
  learner = job('learner', '--job=learn')
  collectors = [job(f'collector-{i}', '--job=collect', f'--collector_id={i}')
                for i in range(args.num_collectors)]
  restartable: Dict[str, Job] = {j.name: j for j in [replay] + collectors}
  failed: List[str] = []
  replay.start()
  try:
    _wait_for_port(port, replay)
    print(f'launch_local: replay server on {address}; logs in {logs}', flush=True)
    learner.start()
    for collector in collectors:
      collector.start()
    while learner.poll() is None:
      time.sleep(1.0)
      for j in restartable.values():
        code = j.poll()
        if code is None or (j in collectors and code == 0):
          continue  # running, or a collector that saw the learner finish
        if j.restarts >= args.max_restarts:
          if j.name not in failed:
            failed.append(j.name)
            print(f'launch_local: {j.name} failed (exit {code}) after {j.restarts} '
                  f'restarts, see {j.log_path}', flush=True)
          continue
        j.restarts += 1
        print(f'launch_local: {j.name} exited with {code}; restart {j.restarts}', flush=True)
        j.start()
  except KeyboardInterrupt:
    print('launch_local: stopping all jobs', flush=True)
    for j in [learner] + collectors + [replay]:
      j.stop()
    return 130
  for j in collectors + [replay]:
    j.stop()
  code = learner.poll()
  print(f'launch_local: learner exited with {code}', flush=True)
  if code:
    return code
  return 1 if failed else 0


if __name__ == '__main__':
  sys.exit(main())
