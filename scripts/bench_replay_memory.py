"""Bytes of process memory per stored transition: frame-once replay vs whole stacks.

Plays real Breakout frames (uniformly random actions, as in the initial
collect) through the harness's own path: the gin-configured env and agent, a
`collect.Collector` and the replay layout's table and observer on an embedded
Reverb server. Reports process RSS growth divided by items stored, measured
after a warm-up, for the frame-once layout and then for naive whole-step
storage (`replay.StepReplay`) in the same process.

  python scripts/bench_replay_memory.py --items=100000
  python scripts/bench_replay_memory.py --gin_file=gin/ddqn_minatar.gin --noframe_once \
      --gin_bindings="make_env.env_id='MinAtar/Seaquest-v0'"
"""

from __future__ import annotations

import gc
import time

from absl import app
from absl import flags
from absl import logging
import gin
import numpy as np
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.train.utils import train_utils

import harness
from harness.base import memory
from harness.rl import agents
from harness.rl import collect
from harness.rl import envs
from harness.rl import frame_replay
from harness.rl import replay
from harness.run import experiment  # pylint: disable=unused-import  (gin: train_eval)

_ITEMS = flags.DEFINE_integer('items', 100_000, 'Transitions to store per layout.')
_WARMUP = flags.DEFINE_integer('warmup', 2_000, 'Transitions stored before measuring.')
_REPORTS = flags.DEFINE_integer('reports', 4, 'Progress lines per layout.')
_GIN_FILE = flags.DEFINE_multi_string('gin_file', ['gin/ddqn_atari.gin'], 'Gin files.')
_GIN_BINDINGS = flags.DEFINE_multi_string('gin_bindings', [], 'Gin bindings.')
_NAIVE = flags.DEFINE_bool('naive', True, 'Also measure whole-step (naive) storage.')
_FRAME_ONCE = flags.DEFINE_bool('frame_once', True, 'Measure the frame-once layout (stacked '
                                'frames only; --noframe_once for MinAtar grids).')
_SEED = flags.DEFINE_integer('seed', 0, 'Env seed.')


def _fill(name: str, layout, agent, items: int) -> float:
  """Stores `items` transitions after a warm-up; returns bytes of RSS per transition."""
  np.random.seed(_SEED.value)
  table = layout.make_table(items + 2 * _WARMUP.value)  # never full: nothing is evicted
  server = replay.start_server([table], None)
  client = server.localhost_client()
  observer = layout.make_observer(client, 1)
  env = envs.make_env(seed=_SEED.value)
  collector = collect.Collector(env, agent.collect_policy, [observer], 1)
  collector.collect_random(_WARMUP.value)
  observer.flush()
  gc.collect()
  rss0, size0, start = memory.rss_mb(), replay.table_size(client), time.time()
  per_item = float('nan')
  for _ in range(_REPORTS.value):
    collector.collect_random(items // _REPORTS.value)
    observer.flush()
    stored = replay.table_size(client) - size0
    per_item = (memory.rss_mb() - rss0) * 2**20 / stored
    print(f'{name:>11}: {stored:>8,d} transitions stored  {per_item:>7,.0f} bytes/transition  '
          f'({stored / (time.time() - start):,.0f} env steps/s)', flush=True)
  # Keep the server (and its memory) alive: the next layout is measured on top.
  _fill.keep.append((server, observer, env))
  return per_item


_fill.keep = []


def main(argv) -> None:
  del argv
  harness.quiet_tensorflow_logs()
  memory.configure_allocator()  # as harness-train does
  gin.parse_config_files_and_bindings(_GIN_FILE.value, _GIN_BINDINGS.value)
  env = envs.make_env(seed=_SEED.value)
  built = agents.make_agent(tensor_spec.from_spec(env.time_step_spec()),
                            tensor_spec.from_spec(env.action_spec()),
                            train_utils.create_train_step(), tf.Variable(0, dtype=tf.int64))
  agent, sequence_length = built.agent, built.sequence_length
  env_id = env.env_id
  env.close()
  print(f'{env_id}, observation {env.observation_spec().shape} '
        f'{env.observation_spec().dtype}, '
        f'items of {sequence_length} steps')
  layouts = [('frame-once', frame_replay.frame_replay(agent.collect_data_spec, sequence_length,
                                                      enabled=True))] if _FRAME_ONCE.value else []
  if _NAIVE.value:
    layouts.append(('naive', replay.StepReplay(agent.collect_data_spec, sequence_length)))
  results = {name: _fill(name, layout, agent, _ITEMS.value) for name, layout in layouts}
  print('bytes of process RSS per stored transition at '
        f'{_ITEMS.value:,d} transitions: ' +
        ', '.join(f'{name} {value:,.0f}' for name, value in results.items()))


if __name__ == '__main__':
  logging.set_verbosity(logging.WARNING)
  app.run(main)
