"""Prioritized replay on a real Reverb server: weights, priority updates, beta, resume."""

import os

import numpy as np
import pytest
import reverb
from tf_agents.specs import tensor_spec
from tf_agents.train.utils import train_utils

from harness.rl import agents
from harness.rl import collect
from harness.rl import envs
from harness.rl import learn
from harness.rl import replay
from harness.rundir import checkpoints
from harness.rundir import metrics
from tests.cli import TINY_BINDINGS, harness_train, tail


@pytest.fixture(scope='module')
def prioritized(tmp_path_factory):
  env = envs.make_env('CartPole-v1', seed=0)
  run_state = checkpoints.RunState()
  train_step = train_utils.create_train_step()
  built = agents.make_agent(tensor_spec.from_spec(env.time_step_spec()),
                            tensor_spec.from_spec(env.action_spec()), train_step,
                            run_state.env_steps, fc_layer_params=(16,))
  agent = built.agent
  settings = learn.PrioritizedReplay(beta_steps=1000)
  layout = replay.StepReplay(agent.collect_data_spec, 2)
  table = layout.make_table(1000, priority_exponent=settings.priority_exponent)
  server = replay.start_server([table], checkpoint_dir=None)
  client = server.localhost_client()
  observer = layout.make_observer(client, 1)
  collect.Collector(env, agent.collect_policy, [observer, metrics.EpisodeStats(1)],
                    1).collect_random(300)
  observer.flush()
  address = f'localhost:{server.port}'
  dataset = layout.make_dataset(address, 32)
  updater = learn.PriorityUpdater(settings, address, replay.TABLE, train_step,
                                  run_state.max_priority, rows_per_item=1)
  trainer = learn.Trainer(built, dataset, 5, updater)
  yield trainer, updater, dataset, train_step
  server.stop()


def _sampled_priorities(dataset, batches=10):
  iterator = iter(dataset)
  return np.concatenate([next(iterator)[1].priority.numpy() for _ in range(batches)])


def test_priorities_of_sampled_items_change_after_training(prioritized):
  trainer, updater, dataset, _ = prioritized
  assert np.all(_sampled_priorities(dataset) == 1.0)  # all inserted at the initial max
  trainer()
  assert trainer.trace_count() == 1
  after = _sampled_priorities(dataset, batches=30)
  assert np.any(after != 1.0)
  assert float(updater.max_priority.numpy()) >= after.max() - 1e-6


def test_importance_weights_lie_in_zero_one(prioritized):
  trainer, updater, dataset, _ = prioritized
  trainer()
  _, info = next(iter(dataset))
  weights = updater.weights(info).numpy()
  assert weights.shape == (32,)
  assert np.all(weights > 0) and np.all(weights <= 1.0) and weights.max() == 1.0


def test_beta_reaches_one_at_the_end_of_its_schedule(prioritized):
  _, updater, _, train_step = prioritized
  saved = int(train_step.numpy())
  train_step.assign(0)
  assert float(updater.current_beta()) == pytest.approx(0.4)
  train_step.assign(500)
  assert float(updater.current_beta()) == pytest.approx(0.7)
  train_step.assign(1000)
  assert float(updater.current_beta()) == pytest.approx(1.0)
  train_step.assign(5000)
  assert float(updater.current_beta()) == pytest.approx(1.0)
  train_step.assign(saved)


@pytest.mark.slow
def test_priorities_survive_a_checkpoint_and_a_resume(tmp_path):
  root = str(tmp_path / 'run')
  bindings = TINY_BINDINGS + ['train_eval.prioritized_replay=True',
                              'PrioritizedReplay.beta_steps=1000']
  result = harness_train(root, bindings)
  assert result.returncode == 0, tail(result)
  rows = metrics.CsvLog(os.path.join(root, 'metrics.csv'), metrics.METRICS_COLUMNS).rows()
  betas = [float(r['per_beta']) for r in rows]
  assert betas == sorted(betas) and 0.4 < betas[-1] < 1.0
  # A server restored from ROOT/replay has a prioritized table with the learned priorities.
  server = reverb.Server([reverb.Table.queue(replay.TABLE, 1)], checkpointer=
                         reverb.checkpointers.DefaultCheckpointer(replay.replay_dir(root)))
  try:
    info = server.localhost_client().server_info()[replay.TABLE]
    assert 'prioritized' in str(info.sampler_options)
    priorities = [s[0].info.priority for s in server.localhost_client().sample(
        replay.TABLE, num_samples=200)]
    assert len(set(np.round(priorities, 6))) > 1
  finally:
    server.stop()
  # Resume: beta continues from the restored step instead of starting at beta_start.
  result = harness_train(root, bindings + ['train_eval.num_env_steps=800'])
  assert result.returncode == 0, tail(result)
  resumed = metrics.CsvLog(os.path.join(root, 'metrics.csv'), metrics.METRICS_COLUMNS).rows()
  assert float(resumed[len(rows)]['per_beta']) > betas[-1]
