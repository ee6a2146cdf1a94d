"""train_eval.overlap_training: gradient steps while the collector steps the envs, with the
promises of the plain loop (replay ratio at every row, a complete checkpoint on SIGTERM,
a SIGKILL then a resume with unique train steps)."""

import signal

import pytest

from tests.cli import TINY_BINDINGS, harness_train, sigkill_after_first_checkpoint, tail
from tests.test_robust import STOP_LINE, Launch, _latest_checkpoint_step, _metrics

COLLECT, TRAIN, INITIAL = 8, 4, 200
OVERLAP = TINY_BINDINGS + [
    'train_eval.overlap_training=True',
    f'train_eval.collect_steps_per_iteration={COLLECT}',
    f'train_eval.train_steps_per_iteration={TRAIN}',
    f'train_eval.initial_collect_steps={INITIAL}',
    'train_eval.checkpoint_interval=400',
]


def _ratio_holds(row) -> bool:
  """train_step is within half a compiled call of replay_ratio * trained env steps."""
  due = (int(row['env_steps']) - INITIAL) * TRAIN / COLLECT
  return abs(int(row['train_step']) - due) <= TRAIN / 2


@pytest.mark.slow
def test_every_row_sees_train_step_at_the_replay_ratio(tmp_path):
  root = str(tmp_path / 'run')
  result = harness_train(root, OVERLAP + ['train_eval.num_env_steps=1200'])
  assert result.returncode == 0, tail(result)
  rows = [r for r in _metrics(root) if int(r['env_steps']) > INITIAL]
  assert rows and int(rows[-1]['env_steps']) >= 1200
  assert all(_ratio_holds(r) for r in rows), [(r['env_steps'], r['train_step']) for r in rows]
  assert {r['train_traces'] for r in rows} == {'1'}


@pytest.mark.slow
def test_sigterm_mid_run_writes_a_checkpoint_of_every_row_and_exits_143(tmp_path):
  root = str(tmp_path / 'run')
  launch = Launch(root, str(tmp_path), 'sigterm',
                  OVERLAP + ['train_eval.num_env_steps=20000', 'train_eval.log_interval=200'])
  launch.wait_for_rows(4)
  launch.proc.send_signal(signal.SIGTERM)
  assert launch.finish() == 143, launch.stdout[-3000:] + launch.stderr[-3000:]
  stops = STOP_LINE.findall(launch.stdout)
  assert len(stops) == 1 and stops[0][0] == 'SIGTERM', launch.stdout[-3000:]
  last = _metrics(root)[-1]
  assert _latest_checkpoint_step(root) >= int(last['train_step'])
  assert 'Traceback' not in launch.stderr


@pytest.mark.slow
def test_sigkill_then_the_same_command_completes_with_unique_train_steps(tmp_path):
  root = str(tmp_path / 'run')
  bindings = OVERLAP + ['train_eval.num_env_steps=2000', 'train_eval.log_interval=100']
  sigkill_after_first_checkpoint(root, bindings, after_s=1.0)  # mid-run
  result = harness_train(root, bindings)
  assert result.returncode == 0, tail(result)
  rows = _metrics(root)
  steps = [int(r['train_step']) for r in rows]
  assert steps == sorted(set(steps)), 'a train_step appears twice in metrics.csv'
  assert int(rows[-1]['env_steps']) >= 2000 and _ratio_holds(rows[-1])
