"""The run directory ROOT and its files: opening it for a launch, the lock,
checkpoints paired with the Reverb table, the resume report, metrics.csv and
eval.csv, results.json.

May import harness.rl (what a checkpoint holds) and harness.base.
"""
