"""Values of small integer constants (axes, permutations, shapes) read from ``Const`` nodes
(and the inverse permutations that transpose gradients compute from them)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tagplan.planner.graph.parsed import ParsedGraph

__all__ = ["const_ints", "tensor_ints"]

_INT_DTYPES = {3: np.int32, 9: np.int64, 4: np.uint8, 5: np.int16, 6: np.int8}
_PASS_THROUGH = {"Identity", "Snapshot", "StopGradient"}


def tensor_ints(tensor: Any) -> list[int] | None:
    """The integer values of a ``TensorProto`` (scalars and broadcast fills expanded)."""
    dtype = _INT_DTYPES.get(tensor.dtype)
    if dtype is None:
        return None
    count = 1
    for dim in tensor.tensor_shape.dim:
        count *= dim.size
    if tensor.tensor_content:
        return [int(v) for v in np.frombuffer(tensor.tensor_content, dtype=dtype)]
    values = list(tensor.int64_val) if tensor.dtype == 9 else list(tensor.int_val)
    if not values:
        return [0] * count
    if len(values) < count:
        values += [values[-1]] * (count - len(values))
    return [int(v) for v in values]


def const_ints(graph: ParsedGraph, producer: int, slot: int = 0) -> list[int] | None:
    """Integer values of the tensor ``producer:slot`` when it is a constant, else ``None``."""
    while graph.ops[producer] in _PASS_THROUGH and graph.data_inputs[producer]:
        producer, slot = graph.data_inputs[producer][0]
    if graph.ops[producer] == "InvertPermutation" and graph.data_inputs[producer]:
        # the gradient of a transpose permutes back by the inverse permutation
        perm = const_ints(graph, *graph.data_inputs[producer][0])
        if perm is None or sorted(perm) != list(range(len(perm))):
            return None
        inverse = [0] * len(perm)
        for position, axis in enumerate(perm):
            inverse[axis] = position
        return inverse
    if graph.ops[producer] != "Const" or slot != 0:
        return None
    node = graph.nodes[producer]
    if "value" not in node.attr:
        return None
    return tensor_ints(node.attr["value"].tensor)
