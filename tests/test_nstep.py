"""n-step targets that stop at an episode's end, with batched collection.

A hand-made batch checks the formula; then a tiny corridor env, two envs
stepped as one batch, the real observer, Reverb table and dataset: every
sampled row's n-step return, discount and bootstrap observation must equal
the one computed by hand from the steps the envs really took.
"""

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
from tf_agents.environments import batched_py_environment
from tf_agents.specs import tensor_spec
from tf_agents.train.utils import train_utils
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory as trajectory_lib

from harness.rl import agents
from harness.rl import collect
from harness.rl import envs
from harness.rl import nstep
from harness.rl import replay
from harness.rundir import checkpoints

GAMMA = 0.9
FIRST, MID, LAST = (int(t) for t in (ts.StepType.FIRST, ts.StepType.MID, ts.StepType.LAST))


def _trajectory(step_type, next_step_type, reward, discount):
  """A [B, T] batch of trajectories; observation = (row, time) to trace rows back."""
  step_type = np.asarray(step_type, np.int32)
  rows, steps = step_type.shape
  observation = np.stack(np.meshgrid(np.arange(rows), np.arange(steps), indexing='ij'),
                         -1).astype(np.float32)
  return trajectory_lib.Trajectory(
      step_type=tf.constant(step_type), observation=tf.constant(observation),
      action=tf.zeros((rows, steps), tf.int64), policy_info=(),
      next_step_type=tf.constant(np.asarray(next_step_type, np.int32)),
      reward=tf.constant(np.asarray(reward, np.float32)),
      discount=tf.constant(np.asarray(discount, np.float32)))


def test_return_stops_at_termination_and_truncation():
  experience = _trajectory(
      step_type=[[MID, MID, MID, MID],     # the episode goes on: full 3-step return
                 [MID, MID, LAST, FIRST],  # terminates after 2 transitions
                 [MID, LAST, FIRST, MID],  # truncated after 1: bootstrap from the last obs
                 [LAST, FIRST, MID, MID]],  # starts on the boundary: masked by the loss
      next_step_type=[[MID, MID, MID, MID],
                      [MID, LAST, FIRST, MID],
                      [LAST, FIRST, MID, MID],
                      [FIRST, MID, MID, MID]],
      reward=[[1, 2, 3, 4], [1, 2, 0, 5], [1, 0, 7, 7], [0, 7, 7, 7]],
      discount=[[1, 1, 1, 1], [1, 0, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1]])
  transition = nstep.n_step_transition(experience, GAMMA)
  g = GAMMA
  np.testing.assert_allclose(transition.next_time_step.reward.numpy()[:3],
                             [1 + g * 2 + g * g * 3, 1 + g * 2, 1], rtol=1e-6)
  np.testing.assert_allclose(transition.next_time_step.discount.numpy()[:3],
                             [g * g, 0.0, 1.0], rtol=1e-6)
  # Bootstrap observations: time index 3, 2 (terminal, discount 0) and 1 (truncated).
  np.testing.assert_array_equal(transition.next_time_step.observation.numpy()[:3, 1],
                                [3, 2, 1])
  np.testing.assert_array_equal(transition.next_time_step.step_type.numpy()[:3],
                                [MID, LAST, LAST])
  assert transition.time_step.step_type.numpy()[3] == LAST  # the loss masks this row


def test_one_step_transitions_match_tf_agents():
  experience = _trajectory(step_type=[[MID, LAST], [MID, MID], [LAST, FIRST]],
                           next_step_type=[[LAST, FIRST], [MID, MID], [FIRST, MID]],
                           reward=[[2, 0], [3, 1], [0, 1]], discount=[[0, 1], [1, 1], [1, 1]])
  ours = nstep.n_step_transition(experience, GAMMA)
  theirs = trajectory_lib.to_transition(experience)
  for mine, reference in zip(tf.nest.flatten(ours.next_time_step),
                             tf.nest.flatten(tf.nest.map_structure(lambda t: t[:, 0],
                                                                   theirs.next_time_step))):
    np.testing.assert_allclose(mine.numpy(), reference.numpy())


class _Corridor(gym.Env):
  """Observation (env id, global step, step in episode); reward 1 + step in episode.

  Action 1 after step 3 terminates; the registration truncates at 6 steps.
  """
  observation_space = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
  action_space = gym.spaces.Discrete(2)
  instances = 0

  def __init__(self):
    self.id = _Corridor.instances
    _Corridor.instances += 1
    self.global_step = 0
    self.t = 0

  def _obs(self):
    return np.array([self.id, self.global_step, self.t], np.float32)

  def reset(self, seed=None, options=None):
    super().reset(seed=seed)
    self.t = 0
    self.global_step += 1
    return self._obs(), {}

  def step(self, action):
    self.t += 1
    self.global_step += 1
    terminated = bool(action == 1 and self.t >= 3)
    return self._obs(), float(self.t), terminated, False, {}


gym.register('NStepCorridor-v0', entry_point=_Corridor, max_episode_steps=6)


class _Log:
  """Every trajectory each env produced, in order."""

  def __init__(self, num_envs):
    self.steps = [[] for _ in range(num_envs)]

  def __call__(self, traj):
    if len(self.steps) == 1 and np.ndim(traj.step_type) == 0:  # one unbatched env
      self.steps[0].append(tf.nest.map_structure(np.asarray, traj))
      return
    for i in range(len(self.steps)):
      self.steps[i].append(tf.nest.map_structure(lambda x, i=i: np.asarray(x)[i], traj))


def _expected(steps, k, n):
  """n-step return, final discount and bootstrap observation of the item starting at k."""
  m = n
  for j in range(n):
    if steps[k + j].next_step_type == LAST:
      m = j + 1
      break
  ret = sum(GAMMA**j * float(steps[k + j].reward) for j in range(m))
  discount = GAMMA**(m - 1) * float(steps[k + m - 1].discount)
  return ret, discount, steps[k + m].observation


@pytest.mark.parametrize('num_envs', [1, 2])
def test_collection_gives_the_hand_computed_n_step_targets(num_envs):
  """One env and a batch of envs: the same targets, row by row."""
  n = 3
  if num_envs == 1:
    env = envs.make_env('NStepCorridor-v0', seed=0)
  else:
    env = batched_py_environment.BatchedPyEnvironment(
        [envs.make_env('NStepCorridor-v0', seed=i) for i in range(num_envs)],
        multithreading=False)
  run_state = checkpoints.RunState()
  built = agents.make_agent(tensor_spec.from_spec(env.time_step_spec()),
                            tensor_spec.from_spec(env.action_spec()),
                            train_utils.create_train_step(), run_state.env_steps,
                            fc_layer_params=(4,), n_step_update=n, gamma=GAMMA)
  layout = replay.StepReplay(built.agent.collect_data_spec, built.sequence_length, num_envs)
  server = replay.start_server([layout.make_table(2000)], checkpoint_dir=None)
  try:
    client = server.localhost_client()
    observer = layout.make_observer(client, num_envs)
    log = _Log(num_envs)
    # 1,000 random steps: a truncation needs four action-0 steps in a row (1 in 16
    # episodes), so 300 steps (~66 episodes) saw none about once in 70 runs.
    collect.Collector(env, built.agent.collect_policy, [observer, log], 4).collect_random(1000)
    observer.flush()
    dataset = layout.make_dataset(f'localhost:{server.port}', batch_size=32)
    ids = [int(log.steps[e][0].observation[0]) for e in range(num_envs)]  # each env's id
    where = {(ids[e], float(s.observation[1])): (e, k)
             for e in range(num_envs) for k, s in enumerate(log.steps[e])}
    checked = {'mid': 0, 'terminated': 0, 'truncated': 0}
    for experience, _ in dataset.take(20):
      transition = nstep.n_step_transition(experience, GAMMA)
      first = transition.time_step
      for row in range(32):
        if int(first.step_type[row]) == LAST:
          continue  # the LAST -> FIRST boundary: masked by the loss
        obs = first.observation[row].numpy()
        e, k = where[(int(obs[0]), float(obs[1]))]
        ret, discount, bootstrap = _expected(log.steps[e], k, n)
        assert float(transition.next_time_step.reward[row]) == pytest.approx(ret)
        assert float(transition.next_time_step.discount[row]) == pytest.approx(discount)
        np.testing.assert_array_equal(transition.next_time_step.observation[row].numpy(),
                                      bootstrap)
        if int(transition.next_time_step.step_type[row]) != LAST:
          checked['mid'] += 1
        elif discount == 0:
          checked['terminated'] += 1
        else:
          checked['truncated'] += 1
    # Every kind of target was seen: in-episode, cut by termination, cut by truncation.
    assert min(checked.values()) > 0, checked
  finally:
    server.stop()
