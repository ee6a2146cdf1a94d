"""The RL parts: environments (gymnasium, Atari), agents, n-step targets, replay
layouts on Reverb, collection, the host policy, the compiled train step, exploration.

Components, not jobs: they may import harness.base only (never run/, rundir/,
sweeps/, distributed/ or a command), and they never read flags.
"""
