"""Shared pytest fixtures."""

import pytest

from tests.cli import TINY_BINDINGS, harness_train


@pytest.fixture(scope='session')
def short_cartpole_run(tmp_path_factory):
  """A finished 600-step CartPole run (made once per session): its ROOT path.

  Tests must not change it; copy it first to resume or damage it.
  """
  root = str(tmp_path_factory.mktemp('short') / 'cartpole_short')
  result = harness_train(root, TINY_BINDINGS)
  assert result.returncode == 0, result.stderr[-3000:]
  return root
