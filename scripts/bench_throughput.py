"""Env steps per second: TF-Agents' own DQN example vs the harness, one after the other.

Usage:
  python scripts/bench_throughput.py [--steps 20000] [--out_dir runs/bench]
  python scripts/bench_throughput.py --compare_prioritized [--gin_file F] [--steps N]
  python scripts/bench_throughput.py --compare_agents [--gin_file F] [--rounds 5]
      [--agents ddqn c51 qrdqn rainbow] [--gin_bindings ...]
  python scripts/bench_throughput.py --compare_dtypes --gin_file=gin/ddqn_atari.gin \
      --agents ddqn [--gin_bindings ...]
  python scripts/bench_throughput.py --compare_optimizers [--gin_file F] [--agents ...]

Both programs train DQN on CartPole-v1 with one gradient step per env step, batch
64, MLP (100,), Adam 1e-3, a uniform Reverb table of 100,000:
  - reference: `python -m tf_agents.examples.dqn.dqn_train_eval` as shipped in the
    tf-agents wheel, `--num_iterations=STEPS --eval_interval=0`, env bound to
    CartPole-v1 (it defaults to v0);
  - harness:   `python -m harness.train --gin_file=gin/bench_cartpole.gin`
    with `train_eval.num_env_steps=STEPS`.
With --compare_prioritized the harness runs twice instead, uniform then
prioritized replay (`train_eval.prioritized_replay=True`), with the same gin file.
Start-up is excluded: the reference's rate comes from its own "steps/sec" log
lines (timestamps of the first line after 10% of the run to the last), the
harness's from metrics.csv rows (first row to last row).

With --compare_agents: the gradient step of each agent (`make_agent.agent`) on the
gin file's network, in one process: each agent's parts are built as harness-train
builds them (its Reverb table filled by random steps), then the agents' compiled
train calls run in turn for --rounds rounds, alternating, and the median ms per
gradient step of each is printed beside DDQN's. --compare_dtypes does the same for
each agent in float32 and in bfloat16 (`make_agent.compute_dtype`), each bfloat16
row against its float32 row. --compare_optimizers does it for each agent with
Keras' own Adam (the reference) and with the FusedAdam that make_agent builds
(the same update in one op per variable; harness/rl/agents/optimizers.py).

The build order biases these comparisons: on CartPole a variant built later ran
2-5 % faster than the same variant built earlier in the same process (C51 against
its own older code, both orders, docs/benchmarks.md "The DQN family"). With
--build_reversed the variants are built in reverse order (timed and printed in the
given order); quote a ratio from runs in both orders.
"""

import argparse
import csv
import datetime
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Dict, List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STEP_LINE = re.compile(r'^I(\d{4}) (\d\d:\d\d:\d\d\.\d+) .*Step: (\d+), ([\d.]+) steps/sec')


def _run(cmd, log_path):
  start = time.time()
  with open(log_path, 'w') as log:
    subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, check=True)
  return time.time() - start


def _seconds(clock: str) -> float:
  t = datetime.datetime.strptime(clock, '%H:%M:%S.%f')
  return t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6


def reference(steps: int, out_dir: str) -> dict:
  root = os.path.join(out_dir, 'reference')
  shutil.rmtree(root, ignore_errors=True)
  log_path = os.path.join(out_dir, 'reference.log')
  total = _run([sys.executable, '-m', 'tf_agents.examples.dqn.dqn_train_eval',
                f'--root_dir={root}', f'--num_iterations={steps}', '--eval_interval=0',
                "--gin_bindings=train_eval.env_name='CartPole-v1'"], log_path)
  points = []
  with open(log_path) as f:
    for line in f:
      match = _STEP_LINE.match(line)
      if match:
        points.append((int(match.group(3)), _seconds(match.group(2))))
  points = [p for p in points if p[0] >= steps // 10]
  (step0, t0), (step1, t1) = points[0], points[-1]
  # One collect step and one gradient step per iteration, after 1,000 random steps.
  return {'env_steps_per_sec': (step1 - step0) / (t1 - t0),
          'train_per_env_step': steps / (steps + 1000), 'wall_s': total}


def harness(steps: int, out_dir: str, gin_file: str, name: str = 'harness',
            bindings=()) -> dict:
  root = os.path.join(out_dir, name)
  shutil.rmtree(root, ignore_errors=True)
  total = _run([sys.executable, '-m', 'harness.train', f'--root_dir={root}',
                f'--gin_file={gin_file}', f'--gin_bindings=train_eval.num_env_steps={steps}',
                f'--gin_bindings=train_eval.log_interval={max(1000, steps // 20)}'] +
               [f'--gin_bindings={b}' for b in bindings],
               os.path.join(out_dir, f'{name}.log'))
  with open(os.path.join(root, 'metrics.csv'), newline='') as f:
    rows = list(csv.DictReader(f))
  first, last = rows[0], rows[-1]
  rate = ((int(last['env_steps']) - int(first['env_steps'])) /
          (float(last['wall_time']) - float(first['wall_time'])))
  return {'env_steps_per_sec': rate,
          'train_per_env_step': int(last['train_step']) / int(last['env_steps']),
          'wall_s': total}


KERAS_ADAM = 'keras Adam'


def build_trainers(gin_file: str, bindings, variants: Dict[str, Tuple[str, List[str]]],
                   reverse: bool = False):
  """Each variant's compiled train call, built as harness-train builds it, its Reverb
  table filled by random steps and the call traced once. A variant whose label
  ends in KERAS_ADAM gets Keras' own Adam where make_agent builds FusedAdam.

  Returns label -> (trainer, Reverb server, agent name, settings).
  """
  sys.path.insert(0, REPO)
  import gin  # pylint: disable=g-import-not-at-top
  import harness.train  # pylint: disable=g-import-not-at-top,unused-import  (every configurable)
  from harness.base import memory, threads  # pylint: disable=g-import-not-at-top
  from harness.rl import collect, learn, replay  # pylint: disable=g-import-not-at-top
  from harness.run import experiment, parts as parts_lib  # pylint: disable=g-import-not-at-top
  from harness.rl.agents import optimizers  # pylint: disable=g-import-not-at-top
  fused_adam = optimizers.FusedAdam
  trainers = {}
  for label, (_, extra) in reversed(variants.items()) if reverse else variants.items():
    # The reference of --compare_optimizers: make_agent looks the class up when it builds.
    optimizers.FusedAdam = (_keras_adam() if label.endswith(KERAS_ADAM) else fused_adam)
    gin.clear_config()
    gin.parse_config_files_and_bindings([gin_file], list(bindings) + list(extra))
    memory.configure_allocator()
    if not trainers:
      threads.configure_threads()  # once, before TensorFlow starts its pools
    cfg = experiment.settings_from_gin(root_dir=os.path.join('/tmp', 'bench_agents', label))
    env = parts_lib.make_collect_env(cfg, cfg.seed)
    parts = parts_lib.build_agent(cfg, env)
    layout = parts_lib.replay_layout(cfg, parts)
    server = replay.start_server([parts_lib.make_replay_table(cfg, layout)], None)
    observer = layout.make_observer(server.localhost_client(), cfg.num_envs)
    collector = collect.Collector(env, parts.agent.collect_policy, [observer],
                                  cfg.collect_steps_per_iteration)
    collector.collect_random(max(cfg.initial_collect_steps, 2 * cfg.batch_size))
    observer.flush()
    address = f'localhost:{server.port}'
    per = parts_lib.prioritized_settings(cfg)
    priorities = per and learn.PriorityUpdater(per, address, replay.TABLE, parts.train_step,
                                               parts.run_state.max_priority, layout.rows_per_item)
    trainer = learn.Trainer(parts.built, layout.make_dataset(address, cfg.batch_size),
                            cfg.train_steps_per_iteration, priorities)
    trainer()  # the one trace
    trainers[label] = (trainer, server, parts.built.name, cfg)
  optimizers.FusedAdam = fused_adam
  return {label: trainers[label] for label in variants}


def _keras_adam():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.keras.optimizers.Adam


def compare(gin_file: str, bindings, variants: Dict[str, Tuple[str, List[str]]], rounds: int,
            calls: int, reverse: bool = False) -> None:
  """Median ms per gradient step of each variant, alternating in one process.

  `variants`: label -> (the label it is compared with, its extra bindings).
  """
  import statistics  # pylint: disable=g-import-not-at-top
  trainers = build_trainers(gin_file, bindings, variants, reverse)
  times = {label: [] for label in variants}
  for _ in range(rounds):
    for label, (trainer, _, _, _) in trainers.items():
      start = time.perf_counter()
      for _ in range(calls):
        trainer()
      times[label].append((time.perf_counter() - start) / (calls * trainer.steps_per_call) * 1e3)
  cfg = next(iter(trainers.values()))[3]
  order = 'built in reverse order' if reverse else 'built in this order'
  print(f'| variant ({os.path.basename(gin_file)}, batch {cfg.batch_size}; {order}) | ms per '
        f'gradient step (median of {rounds}) | ratio | against |')
  print('|---|---|---|---|')
  for label, (base, _) in variants.items():
    median = statistics.median(times[label])
    print(f'| {label} ({trainers[label][2]}) | {median:.2f} '
          f'({min(times[label]):.2f}-{max(times[label]):.2f}) | '
          f'{median / statistics.median(times[base]):.2f}x | {base} |')
  for trainer, server, _, _ in trainers.values():
    server.stop()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--steps', type=int, default=20000)
  parser.add_argument('--out_dir', default=os.path.join(REPO, 'runs', 'bench'))
  parser.add_argument('--gin_file', default=os.path.join(REPO, 'gin', 'bench_cartpole.gin'))
  parser.add_argument('--compare_prioritized', action='store_true')
  parser.add_argument('--gin_bindings', nargs='*', default=[],
                      help='extra bindings for the harness runs (e.g. a small Atari table)')
  parser.add_argument('--compare_agents', action='store_true',
                      help='ms per gradient step of each of --agents against the first')
  parser.add_argument('--compare_dtypes', action='store_true',
                      help='ms per gradient step of each of --agents in bfloat16 against float32')
  parser.add_argument('--compare_optimizers', action='store_true',
                      help="ms per gradient step of each of --agents with FusedAdam against "
                           "Keras' own Adam")
  parser.add_argument('--agents', nargs='*', default=['ddqn', 'c51', 'qrdqn', 'rainbow'])
  parser.add_argument('--rounds', type=int, default=5)
  parser.add_argument('--calls', type=int, default=4, help='compiled train calls per reading')
  parser.add_argument('--build_reversed', action='store_true',
                      help='build the compared variants in reverse order (the order biases them)')
  args = parser.parse_args()
  if args.compare_optimizers:
    variants = {}
    for agent in args.agents:
      variants[f'{agent} {KERAS_ADAM}'] = (f'{agent} {KERAS_ADAM}', [f"make_agent.agent='{agent}'"])
      variants[f'{agent} FusedAdam'] = (f'{agent} {KERAS_ADAM}', [f"make_agent.agent='{agent}'"])
    compare(args.gin_file, args.gin_bindings, variants, args.rounds, args.calls,
            args.build_reversed)
    return
  if args.compare_agents or args.compare_dtypes:
    dtypes = ('float32', 'bfloat16') if args.compare_dtypes else (None,)
    variants = {}
    for agent in args.agents:
      for dtype in dtypes:
        base = f'{agent} float32' if args.compare_dtypes else args.agents[0]
        label = f'{agent} {dtype}' if dtype else agent
        variants[label] = (base, [f"make_agent.agent='{agent}'"] +
                           ([f"make_agent.compute_dtype='{dtype}'"] if dtype else []))
    compare(args.gin_file, args.gin_bindings, variants, args.rounds, args.calls,
            args.build_reversed)
    return
  os.makedirs(args.out_dir, exist_ok=True)
  if args.compare_prioritized:
    uniform = harness(args.steps, args.out_dir, args.gin_file, 'uniform', args.gin_bindings)
    per = harness(args.steps, args.out_dir, args.gin_file, 'prioritized',
                  args.gin_bindings + ['train_eval.prioritized_replay=True'])
    print(f'| replay ({os.path.basename(args.gin_file)}) | env steps/s | wall s ({args.steps} steps) |')
    print('|---|---|---|')
    for name, r in (('uniform', uniform), ('prioritized', per)):
      print(f"| {name} | {r['env_steps_per_sec']:.0f} | {r['wall_s']:.0f} |")
    cost = 1 - per['env_steps_per_sec'] / uniform['env_steps_per_sec']
    print(f'prioritized costs {100 * cost:.0f}% of uniform throughput')
    return
  ref = reference(args.steps, args.out_dir)
  ours = harness(args.steps, args.out_dir, args.gin_file, bindings=args.gin_bindings)
  print(f'| program | env steps/s | gradient steps per env step | wall s ({args.steps} steps) |')
  print('|---|---|---|---|')
  for name, r in (('TF-Agents examples/dqn/dqn_train_eval.py', ref),
                  ('ddqn-harness gin/bench_cartpole.gin', ours)):
    print(f"| {name} | {r['env_steps_per_sec']:.0f} | {r['train_per_env_step']:.3f} | "
          f"{r['wall_s']:.0f} |")
  print(f"ratio: {ours['env_steps_per_sec'] / ref['env_steps_per_sec']:.1f}x")


if __name__ == '__main__':
  main()
