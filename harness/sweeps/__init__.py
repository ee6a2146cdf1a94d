"""Sweeps on Ray Tune: the spec, the trials table, the Tune driver, one trial (a
`harness-train` process), the gate, and the rliable statistics.

A sweep reads run directories and runs processes: it may import harness.base and
harness.rundir.results, and never TensorFlow, tf-agents, Reverb or the training code.
"""
