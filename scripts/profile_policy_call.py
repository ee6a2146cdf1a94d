"""What one compiled policy call costs here (no timing is asserted anywhere).

Microseconds per call of `collect.CompiledPolicy` (collect and greedy policies of the CartPole
config on 4 envs), of its concrete function alone and compiled with XLA, of the Q-network
alone, and of one step of the 4 batched envs. See docs/benchmarks.md (wall time against the Zoo).

    python scripts/profile_policy_call.py
"""
import time, numpy as np, tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.train.utils import train_utils
from harness.rl import agents
from harness.rl import collect
from harness.rl import envs
from harness.rundir import checkpoints
env = envs.make_batched_env(4, seed=0)
rs = checkpoints.RunState()
built = agents.make_agent(tensor_spec.from_spec(env.time_step_spec()), tensor_spec.from_spec(env.action_spec()),
    train_utils.create_train_step(), rs.env_steps, fc_layer_params=(256, 256), dueling=True, n_step_update=3)
obs = env.reset()
def bench(label, fn, n=2000):
  fn(); t=time.perf_counter()
  for _ in range(n): fn()
  print(f'{label}: {(time.perf_counter()-t)/n*1e6:.0f} us/call', flush=True)
for name, pol in (('collect', built.agent.collect_policy), ('greedy', built.agent.policy)):
  cp = collect.CompiledPolicy(pol, env)
  bench(f'{name} CompiledPolicy.action', lambda: cp.action(obs))
  bench(f'{name} concrete fn only', lambda: cp._concrete(obs.observation))
  jit = tf.function(cp._act_on_observation, autograph=False, jit_compile=True)
  spec = tensor_spec.add_outer_dim(pol.time_step_spec.observation, 4)
  try:
    cj = jit.get_concrete_function(spec)
    bench(f'{name} concrete fn, jit_compile', lambda: cj(obs.observation))
  except Exception as e:
    print(name, 'jit failed:', str(e).splitlines()[0][:200])
  ops = len(cp._concrete.graph.get_operations())
  print(f'{name}: {ops} ops in the graph')
net = built.agent._q_network
f = tf.function(lambda o: net(o)[0]).get_concrete_function(tf.TensorSpec([4,4], tf.float32))
bench('q network alone', lambda: f(obs.observation))
bench('env step (4 CartPole)', lambda: env.step(np.zeros(4, np.int64)))
