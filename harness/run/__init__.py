"""A run: its settings (`train_eval`), the parts every job is built from, the one
loop and its triggers, the single-process job, reporting, evaluation and videos.

May import harness.rundir, harness.rl and harness.base; never a command or a sweep.
"""
