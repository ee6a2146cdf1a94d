"""TensorFlow's thread pools are a gin binding that harness-train applies before TF starts."""

import glob
import os
import subprocess
import sys
import textwrap

import pytest

from harness.base import threads
from harness.base.errors import UsageError
from tests.cli import TINY_BINDINGS, harness_train, tail

# A fresh interpreter: the pools can be sized only before TensorFlow's first op.
# harness-train's own input check parses the gin file and sizes them; then an op runs.
_POOLS_AFTER_THE_INPUT_CHECK = textwrap.dedent("""
    import sys
    import tensorflow as tf
    from harness import train
    train.check_input([sys.argv[1]], sys.argv[2:])
    tf.constant(1.0) + 1.0
    print(tf.config.threading.get_intra_op_parallelism_threads(),
          tf.config.threading.get_inter_op_parallelism_threads())
""")


@pytest.mark.parametrize('bindings, expected', [
    ([], '1 0'),  # the shipped CartPole file: one intra-op thread, TF's inter-op default
    (['configure_threads.intra_op_threads=2', 'configure_threads.inter_op_threads=3'], '2 3'),
])
@pytest.mark.slow
def test_the_thread_pools_are_sized_before_tensorflow_starts(bindings, expected):
  gin_file = os.path.join(os.path.dirname(__file__), '..', 'gin', 'ddqn_cartpole.gin')
  out = subprocess.run([sys.executable, '-c', _POOLS_AFTER_THE_INPUT_CHECK, gin_file, *bindings],
                       check=True, capture_output=True, text=True).stdout
  assert out.split('\n')[-2] == expected


@pytest.mark.parametrize('value', [0, -1, 1.5, True])
def test_a_thread_count_that_is_not_a_positive_integer_is_refused(value):
  with pytest.raises(UsageError, match='must be a positive integer'):
    threads.configure_threads(intra_op_threads=value)


@pytest.mark.slow
def test_harness_train_refuses_a_bad_thread_count_in_one_line(tmp_path):
  root = str(tmp_path / 'run')
  result = harness_train(root, TINY_BINDINGS + ['configure_threads.inter_op_threads=0'])
  assert result.returncode == 2, tail(result)
  assert result.stderr.strip().count('\n') == 0, result.stderr
  assert 'configure_threads.inter_op_threads=0 must be a positive integer' in result.stderr
  assert not os.path.exists(root) or not glob.glob(os.path.join(root, '*'))
