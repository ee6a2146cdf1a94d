"""The base floor: one-line errors, the quiet log, `--help`, the allocator and thread
settings, signals and clean stops, safe writes (a full disk), Ray start and stop, W&B.

Imports no other harness package; everything else may import it.
"""
