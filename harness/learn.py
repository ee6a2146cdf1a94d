"""Compiled training: one traced function that runs several gradient steps.

Our own loop rather than tf-agents' `Learner`: the Learner builds (and restores)
its own Checkpointer in its constructor, before the harness can pair the TF
checkpoint with the Reverb one and re-apply new settings after a restore. The
compiled part is the same idea: `iterations` gradient steps inside one graph.
"""

from __future__ import annotations

import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent


class Trainer:
  """Calls `agent.train` `steps_per_call` times per call, inside one tf.function.

  Takes no arguments, so nothing from Python can cause a retrace; the trace
  count is exposed for the logs and the tests.
  """

  def __init__(self, agent: dqn_agent.DqnAgent, dataset: tf.data.Dataset,
               steps_per_call: int):
    if steps_per_call < 1:
      raise ValueError(f'steps_per_call must be >= 1, got {steps_per_call}')
    self._agent = agent
    self._iterator = iter(dataset)
    self._steps_per_call = steps_per_call
    self._train = tf.function(self._train_steps, autograph=True)

  def _train_steps(self) -> tf.Tensor:
    total_loss = tf.constant(0.0)
    for _ in tf.range(self._steps_per_call):
      experience, _ = next(self._iterator)
      total_loss += self._agent.train(experience).loss
    return total_loss / self._steps_per_call

  def __call__(self) -> float:
    """Runs the gradient steps and returns their mean loss."""
    return float(self._train())

  @property
  def steps_per_call(self) -> int:
    return self._steps_per_call

  def trace_count(self) -> int:
    return int(self._train.experimental_get_tracing_count())
