"""RSS that each periodic event of a run keeps, the first time and later times, in one process.

Builds the single-process job's parts (collect env, agent, Reverb table, trainer, Reporter) as
`harness-train` does, trains until the table has data, then runs each event in turn between
stretches of plain collect + train work, and prints the RSS change across each (after
`malloc_trim`, so freed memory is not counted):

- evaluate: `Reporter.evaluate` (greedy episodes side by side; a new best exports best_policy)
- checkpoint: `checkpoints.save_pair` (Reverb checkpoint, then the TF checkpoint)
- export current: greedy_policy and collect_policy
- export best: best_policy

    python scripts/event_memory.py [--gin_file=gin/ddqn_cartpole.gin] [--rounds=3] [--work_steps=2000]
        [--gin_bindings=train_eval.replay_capacity=5000 ...]

A one-time cost shows in round 0 only; a leak shows in every round. Single readings scatter by
a few tenths of a MiB. Beside each RSS change: Python's allocated blocks across the event alone
(after a collection), where the EagerTensors that TF 2.15 leaks on Python 3.11 show one each.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import gin  # pylint: disable=wrong-import-position

import harness  # pylint: disable=wrong-import-position,unused-import  (quiet TF start-up)
from harness.base import memory  # pylint: disable=wrong-import-position
from harness.rl import collect  # pylint: disable=wrong-import-position
from harness.rl import learn  # pylint: disable=wrong-import-position
from harness.rl import replay  # pylint: disable=wrong-import-position
from harness.run import experiment  # pylint: disable=wrong-import-position
from harness.run import parts as parts_lib  # pylint: disable=wrong-import-position
from harness.run import reporting  # pylint: disable=wrong-import-position
from harness.rundir import checkpoints  # pylint: disable=wrong-import-position
from harness.rundir import metrics  # pylint: disable=wrong-import-position
from harness.rundir.directory import RunDirectory  # pylint: disable=wrong-import-position



def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--gin_file', default=os.path.join(REPO, 'gin', 'ddqn_cartpole.gin'))
  parser.add_argument('--gin_bindings', nargs='*', default=[
      'train_eval.replay_capacity=5000', 'train_eval.eval_episodes=10'])
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--work_steps', type=int, default=2000,
                      help='env steps of collect + train between two readings')
  args = parser.parse_args()
  root = tempfile.mkdtemp(prefix='event_memory-')
  gin.parse_config_files_and_bindings([args.gin_file], args.gin_bindings)
  memory.configure_allocator()
  cfg = experiment.settings_from_gin(root_dir=root)
  env = parts_lib.make_collect_env(cfg, cfg.seed)
  parts = parts_lib.build_agent(cfg, env)
  run_dir = RunDirectory(cfg.root_dir, parts)
  layout = parts_lib.replay_layout(cfg, parts)
  server = replay.start_server([parts_lib.make_replay_table(cfg, layout)],
                               replay.replay_dir(cfg.root_dir))
  client = server.localhost_client()
  observer = layout.make_observer(client, cfg.num_envs)
  stats = metrics.EpisodeStats(num_envs=cfg.num_envs)
  collector = collect.Collector(env, parts.agent.collect_policy, [observer, stats],
                                cfg.collect_steps_per_iteration)
  trainer = learn.Trainer(parts.built, layout.make_dataset(f'localhost:{server.port}',
                                                           cfg.batch_size),
                          cfg.train_steps_per_iteration, None)
  run_dir.write_launch_files(None)
  reporter = reporting.Reporter(cfg, parts, None)
  collector.collect_random(cfg.initial_collect_steps)

  def work(steps: int = args.work_steps) -> None:
    start = stats.env_steps
    while stats.env_steps < start + steps:
      collector.run()
      observer.flush()
      trainer()
    parts.run_state.set_env_steps(stats.env_steps)

  def checkpoint() -> None:
    observer.flush()
    checkpoints.save_pair(client, run_dir.checkpointer, parts.run_state, parts.train_step)

  def rss() -> float:
    memory.release_free_memory()
    return memory.rss_mb()

  def blocks() -> int:
    # Python's live blocks: EagerTensors that TF 2.15 on Python 3.11 never frees show here.
    gc.collect()
    return sys.getallocatedblocks()

  events = {'evaluate': lambda: reporter.evaluate(stats.env_steps),
            'checkpoint': checkpoint,
            'export current': reporter.exporter.save_current,
            'export best': reporter.exporter.save_best}
  for _ in range(4):
    work()
  for round_ in range(args.rounds):
    for name, event in events.items():
      work()
      before, blocks_before = rss(), blocks()
      start = time.time()
      event()
      took = time.time() - start
      blocks_after = blocks()
      work()
      print(f'round {round_}  {name:15s} {rss() - before:+6.2f} MiB  '
            f'{blocks_after - blocks_before:+7d} blocks  ({took:.2f} s)', flush=True)
  before, blocks_before = rss(), blocks()
  for _ in range(3):
    work()
  print(f'{3 * args.work_steps} env steps of collect + train alone: {rss() - before:+6.2f} MiB  '
        f'{blocks() - blocks_before:+7d} blocks')
  reporter.close()
  server.stop()
  shutil.rmtree(root, ignore_errors=True)


if __name__ == '__main__':
  main()
