"""Compiled calls that take and give numpy arrays without making an EagerTensor.

In TensorFlow 2.15 on Python 3.11 every EagerTensor leaves one Python block
(about 48 bytes) behind for good, whether a compiled call returns it or a numpy
argument is converted into it (tensorflow/tensorflow#62551;
`scripts/eager_tensor_leak.py` measures it). A loop that calls a policy or a
train step a million times pays that on every call. A `HostCall` traces its
function once with no arguments and no results: the inputs are read inside the
graph from a host-side slot with `tf.numpy_function`, and the results are
handed back to the host the same way, so a call makes no EagerTensor at all
(+0.008 blocks per call measured, against +2 for one array in and one out) and
costs about the same.

Our own, because TensorFlow has no call path that avoids the EagerTensor: the
fix of that bug is in no 2.15 wheel.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Sequence

import numpy as np
import tensorflow as tf


class HostCall:
  """`fn(*inputs)` as one traced, argument-free call that exchanges numpy arrays.

  Args:
    fn: traced once; takes tensors shaped like `input_specs`, returns a nest of tensors
      (or None).
    input_specs: a `tf.TensorSpec` per positional input (fully defined shapes).
    name: for the graph's ops.

  Calls from several threads are serialised (the slots are the instance's own).
  """

  def __init__(self, fn: Callable[..., Any], input_specs: Sequence[tf.TensorSpec] = (),
               name: str = 'host_call'):
    self._fn = fn
    self._input_specs = list(input_specs)
    self._inputs: List[np.ndarray] = []
    self._outputs: Optional[List[np.ndarray]] = None
    self._structure = None
    self._lock = threading.Lock()
    self._traced = tf.function(self._graph, autograph=False, jit_compile=False)
    self._concrete = self._traced.get_concrete_function()
    self._name = name

  def _read_inputs(self):
    return self._inputs

  def _store_outputs(self, *outputs) -> np.int32:
    self._outputs = list(outputs)
    return np.int32(0)

  def _graph(self) -> None:
    inputs = []
    if self._input_specs:
      inputs = tf.numpy_function(self._read_inputs, [], [s.dtype for s in self._input_specs],
                                 stateful=True)
      for tensor, spec in zip(inputs, self._input_specs):
        tensor.set_shape(spec.shape)
    result = self._fn(*inputs)
    if result is None:
      return
    flat = tf.nest.flatten(result)
    self._structure = tf.nest.map_structure(lambda _: 0, result)
    if flat:
      # Stateful, so the call keeps it (tf.function's automatic control dependencies).
      tf.numpy_function(self._store_outputs, flat, tf.int32, stateful=True)

  def __call__(self, *inputs: np.ndarray) -> Any:
    """Runs the traced call on these numpy inputs; returns its results as numpy."""
    if len(inputs) != len(self._input_specs):
      raise TypeError(f'{self._name} takes {len(self._input_specs)} inputs, got {len(inputs)}')
    with self._lock:
      self._inputs = [np.asarray(x, spec.dtype.as_numpy_dtype)
                      for x, spec in zip(inputs, self._input_specs)]
      self._outputs = None
      self._concrete()
      outputs, self._outputs, self._inputs = self._outputs, None, []
    if outputs is None:
      return None
    return tf.nest.pack_sequence_as(self._structure, outputs)

  def trace_count(self) -> int:
    """Times `fn` has been traced: 1 for the life of the instance."""
    return int(self._traced.experimental_get_tracing_count())
