"""Checkpoint pieces on real files: damaged-checkpoint fallback, CSV rewrite."""

import os

import tensorflow as tf

from harness import checkpoints, metrics


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
