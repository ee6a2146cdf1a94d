"""The single-process job (`--job=all`): collection, replay, training and evaluation here."""

from __future__ import annotations

from absl import logging
import reverb

from harness.base import quiet
from harness.base import shutdown
from harness.rl import collect
from harness.rl import envs
from harness.rl import learn
from harness.rl import replay
from harness.run import loop
from harness.run import parts as parts_lib
from harness.run import reporting
from harness.run.settings import RunConfig
from harness.rundir import checkpoints
from harness.rundir import metrics
from harness.rundir.directory import RunDirectory


# Iterations between two reads of the max priority that new items enter with
# (prioritized replay): a few iterations stale at most, as the overlapped
# training already makes it one.
_PRIORITY_READ_ITERATIONS = 8


def run_single_process(cfg: RunConfig) -> None:
  """Collects with an embedded Reverb server and trains until the target."""
  # Environments and agent first: an unknown id or a continuous action space
  # fails here, before anything is written to root_dir.
  collect_env = parts_lib.make_collect_env(cfg, cfg.seed)
  parts = parts_lib.build_agent(cfg, collect_env)
  logging.info('%s', reporting.describe_run(cfg, parts, envs.configured_env_id()))
  run_dir = RunDirectory(cfg.root_dir, parts)
  run_state, train_step = parts.run_state, parts.train_step
  clock = checkpoints.WallClock(run_state)
  stats = metrics.EpisodeStats(num_envs=cfg.num_envs)
  run_state.load_stats(stats)

  layout = parts_lib.replay_layout(cfg, parts)
  table = parts_lib.make_replay_table(cfg, layout)
  pair_warning = (checkpoints.check_replay_pair(run_state, replay.replay_dir(cfg.root_dir))
                  if run_dir.checkpointer.restored else None)
  server = replay.start_server([table], replay.replay_dir(cfg.root_dir))
  address = f'localhost:{server.port}'
  client = server.localhost_client()
  replay_observer = layout.make_observer(client, cfg.num_envs)
  collector = collect.Collector(collect_env, parts_lib.collect_policy(parts, collect_env, cfg.seed),
                                [replay_observer, stats], cfg.collect_steps_per_iteration)
  per = parts_lib.prioritized_settings(cfg)
  priorities = per and learn.PriorityUpdater(per, address, replay.TABLE, train_step,
                                             run_state.max_priority, layout.rows_per_item)
  with quiet.native_stderr():  # Reverb's line on the in-process sampler
    trainer = learn.Trainer(parts.built, layout.make_dataset(address, cfg.batch_size),
                            cfg.train_steps_per_iteration, priorities)
  stop = shutdown.current()
  shutdown.exit_if_requested('during start-up')  # before the first write
  run_dir.write_launch_files(pair_warning)
  reporter = reporting.Reporter(cfg, parts, run_dir.restored_step)
  last_loss = [float('nan')]
  # In TF 2.15 on Python 3.11 every EagerTensor leaves ~48 bytes behind for good
  # (scripts/eager_tensor_leak.py), a variable read two of them. So the loop keeps
  # train_step on the host (only the compiled calls advance it, by a known count)
  # and reads the max priority every few iterations instead of every one.
  host_train_step = [int(train_step.numpy())]
  iterations = [0]

  def settle() -> None:
    """Waits for the gradient steps in flight (train_eval.overlap_training)."""
    loss = trainer.finish()
    if loss is not None:
      last_loss[0] = loss

  def calls_due() -> int:
    """Compiled calls that bring train_step to the replay ratio of the env steps
    actually collected after the initial collect (a batched step can overshoot):
    train_step stays at replay_ratio * (env_steps - initial_collect_steps)."""
    due = (stats.env_steps - cfg.initial_collect_steps) * cfg.replay_ratio
    step, calls = host_train_step[0], 0
    while step + trainer.steps_per_call / 2 <= due:
      step, calls = step + trainer.steps_per_call, calls + 1
    return calls

  def iteration() -> int:
    if priorities and iterations[0] % _PRIORITY_READ_ITERATIONS == 0:
      # New items enter with the highest priority given so far.
      replay_observer.update_priority(run_state.max_priority_value())
    iterations[0] += 1
    with quiet.native_stderr():  # Reverb's writer and sampler lines
      # With overlap_training, the previous iteration's gradient steps run meanwhile.
      collector.run()
      run_state.set_env_steps(stats.env_steps)
      settle()
      calls = calls_due()
      if calls:
        trainer.start(calls)
        host_train_step[0] += calls * trainer.steps_per_call
      if not cfg.overlap_training:
        settle()  # serial: this iteration's steps end before the next collect
    return stats.env_steps

  def metrics_row(env_steps: int) -> dict:
    return reporting.metrics_row(parts, env_steps, last_loss[0],
                                 replay.table_size(client) * layout.rows_per_item,
                                 stats.average_return(), trainer, collector.trace_count())

  def save_checkpoint() -> None:
    with quiet.native_stderr():  # Reverb's checkpoint lines
      replay_observer.flush()
      run_state.save_stats(stats)
      clock.record()
      checkpoints.save_pair(client, run_dir.checkpointer, run_state, train_step)
    reporter.exporter.save_current()

  # Initial random collect: the first `initial_collect_steps` env steps of a run.
  # A stop meanwhile ends the launch without a checkpoint: nothing is trained yet.
  with quiet.native_stderr():
    collector.collect_random(min(cfg.initial_collect_steps, cfg.num_env_steps) - stats.env_steps,
                             should_stop=lambda: stop.requested)
  shutdown.exit_if_requested(f'at env_steps {stats.env_steps}, in the initial random collect')
  if run_dir.checkpointer.restored:
    _refill_an_emptied_table(cfg, collector, stats, client, layout.rows_per_item, stop)
  run_state.set_env_steps(stats.env_steps)
  hooks = loop.JobHooks(iteration=iteration, metrics_row=metrics_row,
                        save_checkpoint=save_checkpoint, episodes=lambda: stats.episodes,
                        train_return_last100=stats.train_return_last100,
                        settle=settle)
  loop.train_to_target(cfg, reporter, clock, hooks, stats.env_steps)
  with quiet.native_stderr():
    replay_observer.close()
    reporter.close()
    server.stop()


def _refill_an_emptied_table(cfg: RunConfig, collector: collect.Collector,
                             stats: metrics.EpisodeStats, client: reverb.Client,
                             rows_per_item: int, stop: shutdown.StopRequest) -> None:
  """Collects with the collect policy, without training, into a resumed table
  that is empty (its Reverb checkpoint was unreadable or deleted).

  Sampling an empty table blocks for good: the resumed launch would hang.
  The table is filled to the size the initial collect would have given (as the
  distributed learner's rate limiter waits for); the gradient steps those env
  steps are due are then trained at once, keeping train_step at
  replay_ratio * (env_steps - initial_collect_steps). It stops at the run's
  target, where nothing is trained any more.
  """
  if replay.table_size(client) > 0:
    return
  wanted = max(1, min(cfg.initial_collect_steps, cfg.replay_capacity) // rows_per_item)
  logging.warning('the resumed replay table is empty: collecting %d items with the collect '
                  'policy, without training, before training goes on', wanted)
  with quiet.native_stderr():
    while (replay.table_size(client) < wanted and stats.env_steps < cfg.num_env_steps
           and not stop.requested):
      collector.run()
  shutdown.exit_if_requested('while refilling the replay table')
