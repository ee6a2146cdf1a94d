"""A distributed run: the replay, collect, learn and eval jobs, the Ray actors that
run them, and the launch that starts and stops them on Ray.

May import harness.run, harness.rundir, harness.rl and harness.base.
"""
