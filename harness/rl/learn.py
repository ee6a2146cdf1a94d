"""Compiled training: one traced function that runs several gradient steps.

Our own loop rather than tf-agents' `Learner`: the Learner builds (and restores)
its own Checkpointer in its constructor, before the harness can pair the TF
checkpoint with the Reverb one and re-apply new settings after a restore, and it
has no hook for importance weights and priority updates. The compiled part is
the same idea: `iterations` gradient steps inside one graph.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Optional

import gin
import reverb
import tensorflow as tf

from harness.base import host_calls
from harness.rl import agents
from harness.rl import nstep


@gin.configurable
@dataclasses.dataclass
class PrioritizedReplay:
  """Settings of prioritized replay (used when train_eval.prioritized_replay=True).

  Attributes:
    priority_exponent: alpha: sampling probability is priority**alpha / sum.
    beta_start: importance-sampling exponent at train step 0 ...
    beta_steps: ... annealed linearly to 1.0 over this many train steps.
    priority_epsilon: added to |TD error| so no item becomes unsampleable.
  """
  priority_exponent: float = 0.6
  beta_start: float = 0.4
  beta_steps: int = 100_000
  priority_epsilon: float = 1e-6


class PriorityUpdater(tf.Module):
  """In-graph importance weights and priority updates for one Reverb table."""

  def __init__(self, settings: PrioritizedReplay, server_address: str, table: str,
               train_step: tf.Variable, max_priority: tf.Variable, rows_per_item: int):
    super().__init__(name='priority_updater')
    self.settings = settings
    self._client = reverb.TFClient(server_address)
    self._table = table
    self._train_step = train_step
    self.max_priority = max_priority
    self._rows_per_item = rows_per_item
    self.beta = tf.Variable(settings.beta_start, dtype=tf.float32, trainable=False)
    self.mean_sampled_priority = tf.Variable(0.0, dtype=tf.float32, trainable=False)

  def current_beta(self) -> tf.Tensor:
    s = self.settings
    progress = tf.minimum(
        tf.cast(self._train_step, tf.float32) / float(max(s.beta_steps, 1)), 1.0)
    return s.beta_start + (1.0 - s.beta_start) * progress

  def weights(self, info: reverb.SampleInfo) -> tf.Tensor:
    """(N * P(i))**-beta / max over the batch, one weight per training row."""
    probability = tf.cast(info.probability, tf.float32)
    size = tf.cast(info.table_size, tf.float32)
    beta = self.current_beta()
    self.beta.assign(beta)
    self.mean_sampled_priority.assign(tf.reduce_mean(tf.cast(info.priority, tf.float32)))
    weights = tf.pow(size * probability, -beta)
    weights /= tf.reduce_max(weights)
    return tf.repeat(weights, self._rows_per_item)

  def update(self, info: reverb.SampleInfo, td_error: tf.Tensor) -> None:
    """New priority of each sampled item: |TD error| + epsilon (max over its rows)."""
    errors = tf.reshape(tf.abs(td_error), [-1, self._rows_per_item])
    priorities = tf.cast(tf.reduce_max(errors, axis=1), tf.float64)
    priorities += self.settings.priority_epsilon
    self._client.update_priorities(self._table, info.key, priorities)
    self.max_priority.assign(tf.maximum(self.max_priority,
                                        tf.cast(tf.reduce_max(priorities), tf.float32)))


class Trainer:
  """Calls `agent.train` `steps_per_call` times per call, inside one tf.function.

  Each step trains on n-step transitions (`harness.rl.nstep`) with the learning
  rate of the schedule at the current env step.

  Takes no arguments, so nothing from Python can cause a retrace; the trace
  count is exposed for the logs and the tests. With a `PriorityUpdater` each
  step is weighted by importance weights and updates the sampled priorities.
  """

  def __init__(self, built: agents.BuiltAgent, dataset: tf.data.Dataset,
               steps_per_call: int, priorities: Optional[PriorityUpdater] = None):
    if steps_per_call < 1:
      raise ValueError(f'steps_per_call must be >= 1, got {steps_per_call}')
    self._built = built
    self._agent = built.agent
    self._iterator = iter(dataset)
    self._steps_per_call = steps_per_call
    self.priorities = priorities
    # Traced without autograph (HostCall): converting tf-agents' and Keras' Python
    # code for the loop body took 4.7 s of the first call (0.5 s without it;
    # CartPole's whole run is about 35 s), and nothing in the body branches on a
    # tensor. The mean loss comes back as numpy, not as a (leaking) EagerTensor.
    self._train = host_calls.HostCall(self._train_steps, name='train_steps')
    # Training runs on one thread of its own, so its short-lived tensors come
    # from that thread's malloc arena instead of being interleaved with the
    # long-lived replay chunks the collector builds on the main thread, which
    # fragmented the main heap (Breakout soak: +6.6 -> +3.2 MB per 10,000 steps).
    self._thread = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                         thread_name_prefix='trainer')
    self._pending: Optional[concurrent.futures.Future] = None

  def _train_step(self) -> tf.Tensor:
    experience, info = next(self._iterator)
    # n-step targets that stop at an episode's end (tf-agents' own conversion
    # runs on into the next episode after a time limit; see harness.rl.nstep).
    experience = nstep.n_step_transition(experience, self._built.gamma)
    self._built.update_learning_rate()
    if self.priorities is None:
      return self._agent.train(experience).loss
    # Reverb's SampleInfo has one entry per item (not per step): [items].
    loss_info = self._agent.train(experience, weights=self.priorities.weights(info))
    self.priorities.update(info, loss_info.extra.td_error)
    return loss_info.loss

  def _train_steps(self) -> tf.Tensor:
    _, total_loss = tf.while_loop(
        lambda step, _: step < self._steps_per_call,
        lambda step, total: (step + 1, total + self._train_step()),
        (tf.constant(0), tf.constant(0.0)))
    return total_loss / self._steps_per_call

  def __call__(self) -> float:
    """Runs the gradient steps and returns their mean loss."""
    if self._pending is not None:
      raise RuntimeError('Trainer called while calls begun by start() are in flight')
    return self._thread.submit(lambda: float(self._train())).result()

  def start(self, calls: int) -> None:
    """Begins `calls` compiled calls on the trainer's thread and returns at once.

    The caller collects meanwhile (TensorFlow releases the GIL while its ops
    run); `finish` waits for them.
    """
    if self._pending is not None:
      raise RuntimeError('Trainer.start called before finish() of the previous start')
    self._pending = self._thread.submit(
        lambda: [float(self._train()) for _ in range(calls)][-1])

  def finish(self) -> Optional[float]:
    """Waits for the calls `start` began; returns the last one's mean loss
    (None when none was in flight)."""
    pending, self._pending = self._pending, None
    return pending.result() if pending is not None else None

  @property
  def steps_per_call(self) -> int:
    return self._steps_per_call

  def trace_count(self) -> int:
    return self._train.trace_count()
