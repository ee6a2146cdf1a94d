"""Where a gradient step of the shipped CartPole config goes (no timing is asserted anywhere).

ms per step of `learn.Trainer` (dueling (256, 256), 3-step targets, batch 64 from 4 envs,
128 steps per call) with the Reverb dataset, on one cached batch, and without dueling, n-step
and clipping; a bare Keras double-DQN step of the same network; and the Reverb dataset alone.

    python scripts/profile_gradient_step.py [full cached ds keras plain]
"""
import sys, time

import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.train.utils import train_utils
from harness.rl import agents
from harness.rl import collect
from harness.rl import envs
from harness.rl import learn
from harness.rl import replay
from harness.rundir import checkpoints

NUM_ENVS, BATCH, STEPS = 4, 64, 128

def build(dueling=True, n=3, clip=10.0):
  env = envs.make_batched_env(NUM_ENVS, seed=0) if NUM_ENVS > 1 else envs.make_env('CartPole-v1', seed=0)
  ts_spec = tensor_spec.from_spec(env.time_step_spec()); a_spec = tensor_spec.from_spec(env.action_spec())
  rs = checkpoints.RunState()
  built = agents.make_agent(ts_spec, a_spec, train_utils.create_train_step(), rs.env_steps,
                            fc_layer_params=(256, 256), learning_rate=2.3e-3, n_step_update=n,
                            dueling=dueling, target_update_period=128, gradient_clipping=clip)
  layout = replay.StepReplay(built.agent.collect_data_spec, n + 1, NUM_ENVS)
  server = replay.start_server([layout.make_table(100000)], checkpoint_dir=None)
  client = server.localhost_client()
  obs = layout.make_observer(client, NUM_ENVS)
  col = collect.Collector(env, built.agent.collect_policy, [obs], 256)
  col.collect_random(4000); obs.flush()
  ds = layout.make_dataset(f'localhost:{server.port}', BATCH)
  return built, ds, server

def time_trainer(built, ds, label, calls=6):
  tr = learn.Trainer(built, ds, STEPS)
  tr()  # trace
  t = time.perf_counter()
  for _ in range(calls): tr()
  ms = (time.perf_counter() - t) / (calls * STEPS) * 1e3
  print(f'{label}: {ms:.2f} ms/step', flush=True)

def time_dataset(ds, label, n=512):
  it = iter(ds); next(it)
  t = time.perf_counter()
  for _ in range(n): next(it)
  print(f'{label}: {(time.perf_counter()-t)/n*1e3:.2f} ms/batch (eager next)', flush=True)

def bare_keras():
  net = tf.keras.Sequential([tf.keras.layers.Dense(256, 'relu'), tf.keras.layers.Dense(256, 'relu'), tf.keras.layers.Dense(2)])
  tgt = tf.keras.models.clone_model(net); net.build((None, 4)); tgt.build((None, 4))
  opt = tf.keras.optimizers.Adam(2.3e-3)
  o = tf.random.normal((BATCH, 4)); o2 = tf.random.normal((BATCH, 4)); a = tf.zeros((BATCH,), tf.int32); r = tf.ones((BATCH,))
  @tf.function
  def steps():
    for _ in tf.range(STEPS):
      with tf.GradientTape() as tape:
        q = tf.gather(net(o), a, batch_dims=1)
        a2 = tf.argmax(net(o2), 1, output_type=tf.int32)
        y = r + 0.99 * tf.gather(tgt(o2), a2, batch_dims=1)
        loss = tf.reduce_mean(tf.keras.losses.huber(tf.stop_gradient(y)[:, None], q[:, None]))
      g = tape.gradient(loss, net.trainable_variables)
      g, _ = tf.clip_by_global_norm(g, 10.0)
      opt.apply_gradients(zip(g, net.trainable_variables))
    return loss
  steps()
  t = time.perf_counter()
  for _ in range(6): steps()
  print(f'bare keras double DQN: {(time.perf_counter()-t)/(6*STEPS)*1e3:.2f} ms/step', flush=True)

which = sys.argv[1:] or ['full', 'cached', 'ds', 'keras', 'plain']
if 'keras' in which: bare_keras()
built, ds, server = build()
if 'ds' in which: time_dataset(ds, 'reverb dataset')
if 'full' in which: time_trainer(built, ds, 'trainer, reverb dataset (shipped config)')
if 'cached' in which: time_trainer(built, ds.take(1).cache().repeat(), 'trainer, one cached batch')
server.stop()
if 'plain' in which:
  built, ds, server = build(dueling=False, n=1, clip=None)
  time_trainer(built, ds.take(1).cache().repeat(), 'trainer, cached, no dueling, 1-step, no clip')
  server.stop()
