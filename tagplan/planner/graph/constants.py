"""Values of small integer constants (axes, permutations, shapes) read from ``Const`` nodes,
and the few integer ops on constants that gradients compute permutations with (inverse
permutations, ranges, stacks, concatenations, sums and products)."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from tagplan.planner.graph.parsed import ParsedGraph

__all__ = ["const_ints", "tensor_ints"]

_INT_DTYPES = {3: np.int32, 9: np.int64, 4: np.uint8, 5: np.int16, 6: np.int8}
_PASS_THROUGH = {"Identity", "Snapshot", "StopGradient"}
_MAX_DEPTH = 8
_MAX_VALUES = 4096  # small tensors only: a permutation, a shape, an axis list


def _range(node: Any, operands: list[list[int]]) -> list[int] | None:
    if len(operands) != 3 or any(len(v) != 1 for v in operands) or operands[2][0] == 0:
        return None
    values = range(operands[0][0], operands[1][0], operands[2][0])
    return list(values) if len(values) <= _MAX_VALUES else None


def _stacked(node: Any, operands: list[list[int]]) -> list[int] | None:
    """``Pack`` along axis 0 (row-major, the operands one after another)."""
    if node.attr["axis"].i != 0:
        return None
    return [value for values in operands for value in values]


def _concat(node: Any, operands: list[list[int]]) -> list[int] | None:
    """``ConcatV2`` along axis 0 (its last operand): the operands one after another."""
    if not operands or operands[-1] != [0]:
        return None
    return [value for values in operands[:-1] for value in values]


def _arithmetic(function: Callable[[int, int], int]) -> Callable[..., list[int] | None]:
    def apply(node: Any, operands: list[list[int]]) -> list[int] | None:
        if len(operands) != 2:
            return None
        left, right = operands
        if len(left) == 1:
            left = left * len(right)
        if len(right) == 1:
            right = right * len(left)
        if len(left) != len(right):
            return None
        return [function(a, b) for a, b in zip(left, right, strict=True)]

    return apply


_COMPUTED: dict[str, Callable[[Any, list[list[int]]], list[int] | None]] = {
    "Range": _range,
    "Pack": _stacked,
    "ConcatV2": _concat,
    "Add": _arithmetic(operator.add),
    "AddV2": _arithmetic(operator.add),
    "Sub": _arithmetic(operator.sub),
    "Mul": _arithmetic(operator.mul),
}


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


def const_ints(
    graph: ParsedGraph, producer: int, slot: int = 0, _depth: int = 0
) -> list[int] | None:
    """Integer values of the tensor ``producer:slot`` when it is a constant, or small
    integer arithmetic on constants (``Range``, ``Pack``, ``ConcatV2`` along axis 0,
    ``Add``/``Sub``/``Mul``: what a gradient builds a permutation from, e.g. TensorFlow's
    gradient of a ``GatherV2`` with ``batch_dims``), flattened; else ``None``."""
    while graph.ops[producer] in _PASS_THROUGH and graph.data_inputs[producer]:
        producer, slot = graph.data_inputs[producer][0]
    op, inputs = graph.ops[producer], graph.data_inputs[producer]
    if op == "InvertPermutation" and inputs:
        # the gradient of a transpose permutes back by the inverse permutation
        perm = const_ints(graph, *inputs[0], _depth + 1)
        if perm is None or sorted(perm) != list(range(len(perm))):
            return None
        inverse = [0] * len(perm)
        for position, axis in enumerate(perm):
            inverse[axis] = position
        return inverse
    if op in _COMPUTED and slot == 0 and _depth < _MAX_DEPTH:
        operands = [const_ints(graph, *ref, _depth + 1) for ref in inputs]
        if any(values is None for values in operands):
            return None
        return _COMPUTED[op](graph.nodes[producer], operands)
    if graph.ops[producer] != "Const" or slot != 0:
        return None
    node = graph.nodes[producer]
    if "value" not in node.attr:
        return None
    return tensor_ints(node.attr["value"].tensor)
