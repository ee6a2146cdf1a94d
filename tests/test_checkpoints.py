"""Checkpoint pieces on real files: damaged-checkpoint fallback, CSV rewrite."""

import os

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.train.utils import train_utils
from tf_agents.trajectories import time_step as ts

from harness.rl import agents
from harness.rl import envs
from harness.rundir import checkpoints
from harness.rundir import metrics


def test_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path):
  directory = str(tmp_path)
  value = tf.Variable(1.0)
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=value), directory, max_to_keep=3)
  manager.save(checkpoint_number=1)
  value.assign(2.0)
  newest = manager.save(checkpoint_number=2)
  with open(newest + '.data-00000-of-00001', 'r+b') as f:
    f.truncate(2)  # a torn write
  checkpoints._skip_damaged_checkpoints(directory)  # pylint: disable=protected-access
  assert tf.train.latest_checkpoint(directory).endswith('ckpt-1')
  assert os.path.exists(newest + '.index'), 'damaged files must be left in place'
  restored = tf.Variable(0.0)
  tf.train.Checkpoint(v=restored).restore(tf.train.latest_checkpoint(directory))
  assert float(restored.numpy()) == 1.0


def test_csv_keeps_rows_up_to_the_checkpoint_and_drops_a_torn_row(tmp_path):
  log = metrics.CsvLog(str(tmp_path / 'metrics.csv'), ['train_step', 'loss'])
  for step in (100, 200, 300):
    log.append({'train_step': step, 'loss': 0.5})
  with open(log.path, 'a') as f:
    f.write('400,0.')  # killed mid-row
  assert log.keep_rows_up_to(200) == 2
  assert [r['train_step'] for r in log.rows()] == ['100', '200']
  assert log.keep_rows_up_to(200) == 0
  log.append({'train_step': 300, 'loss': 0.25})
  assert [r['train_step'] for r in log.rows()] == ['100', '200', '300']


def _policy_actions(policy, observations):
  time_step = ts.restart(tf.constant(observations), batch_size=len(observations))
  return policy.action(time_step).action.numpy()


@pytest.mark.parametrize('prepared', [False, True])
def test_later_exports_write_new_weights_under_the_first_graph(tmp_path, prepared):
  """After the first whole SavedModel, exports write only variables: a loaded
  export must act exactly as the live policy with the newest weights. Prepared
  (as a launch does), the whole SavedModel is written to a temporary directory
  at start-up, nothing under ROOT, and every export writes only variables."""
  env = envs.make_env('CartPole-v1', seed=0)
  built = agents.make_agent(tensor_spec.from_spec(env.time_step_spec()),
                            tensor_spec.from_spec(env.action_spec()),
                            train_utils.create_train_step(), checkpoints.RunState().env_steps,
                            fc_layer_params=(16,))
  policy = built.agent.policy
  exporter = checkpoints.PolicyExporter(str(tmp_path), built.agent)
  if prepared:
    exporter.prepare()
    assert not os.listdir(tmp_path)
    for saver in exporter._savers.values():  # pylint: disable=protected-access
      saver.save = None  # prepared: no export may write a whole SavedModel again
  observations = np.random.default_rng(0).normal(0, 1, (500, 4)).astype(np.float32)
  rng = np.random.default_rng(1)
  for round_ in range(3):
    for variable in policy.variables():  # new weights, as training would make
      variable.assign(rng.normal(0, 0.5, variable.shape).astype(variable.dtype.as_numpy_dtype))
    built.agent.train_step_counter.assign(round_ + 1)
    exporter.save_current()
    loaded = tf.saved_model.load(exporter.path('greedy_policy'))
    np.testing.assert_array_equal(_policy_actions(loaded, observations),
                                  _policy_actions(policy, observations))
    assert int(loaded.get_train_step().numpy()) == round_ + 1
  assert not os.path.exists(exporter.path('greedy_policy') + '.tmp')


def test_unreadable_replay_checkpoint_is_moved_aside_and_the_table_starts_empty(tmp_path):
  """Reverb marks a checkpoint complete (an empty DONE file) even when a full disk
  cut its data short; a resume must start, keeping the damaged files aside."""
  from harness.rl import replay
  signature = tf.TensorSpec([2], tf.float32)
  replay_dir = str(tmp_path / 'replay')
  server = replay.start_server([replay.make_table(signature, 10)], replay_dir)
  client = server.localhost_client()
  with client.trajectory_writer(num_keep_alive_refs=1) as writer:
    for i in range(3):
      writer.append(np.full(2, i, np.float32))
      writer.create_item(replay.TABLE, 1.0, writer.history[-1])
  path = client.checkpoint()
  server.stop()
  name = os.path.basename(path.rstrip('/'))
  for data in ('chunks.tfrecord', 'items.tfrecord'):  # cut short, DONE kept
    with open(os.path.join(path, data), 'wb') as f:
      f.write(b'\0' * 7)

  server = replay.start_server([replay.make_table(signature, 10)], replay_dir)
  try:
    assert replay.table_size(server.localhost_client()) == 0
  finally:
    server.stop()
  kept = str(tmp_path / 'replay-unreadable' / name)
  assert os.path.isfile(os.path.join(kept, 'DONE'))
  assert replay.newest_checkpoint(replay_dir) is None


def test_the_last_100_training_returns_survive_a_checkpoint(tmp_path):
  """results.json's train_return_last100 covers episodes from before a resume too."""
  stats = metrics.EpisodeStats(num_envs=1)
  assert stats.train_return_last100() is None
  for episode in range(130):
    stats.last100_returns.append(float(episode))
    stats.recent_returns.append(float(episode))
  state = checkpoints.RunState()
  state.save_stats(stats)
  checkpoint = tf.train.Checkpoint(run_state=state)
  path = checkpoint.save(str(tmp_path / 'ckpt'))
  restored = checkpoints.RunState()
  tf.train.Checkpoint(run_state=restored).restore(path).assert_consumed()
  again = metrics.EpisodeStats(num_envs=1)
  restored.load_stats(again)
  assert again.train_return_last100() == pytest.approx(np.mean(np.arange(30, 130)))
  assert list(again.recent_returns) == [float(e) for e in range(120, 130)]
