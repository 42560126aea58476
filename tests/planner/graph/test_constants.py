"""Small integer constants and the integer ops on them that gradients build permutations
with, evaluated as TensorFlow would (the values checked by hand)."""

from __future__ import annotations

from tagplan.planner.graph.constants import const_ints
from tagplan.planner.graph.parsed import parse_graph
from tests.planner.graph.builders import const, document, graph_def, node

I32 = {"type": "int32"}


def _values(nodes: list[dict], name: str) -> list[int] | None:
    graph = parse_graph(graph_def(document(nodes)))
    return const_ints(graph, graph.index[name])


def _int_op(name: str, op: str, inputs: list[str], size: int, **attrs) -> dict:
    return node(name, op, inputs, [("int32", [size])], T=I32, **attrs)


def test_ranges_stacks_concatenations_and_arithmetic_evaluate() -> None:
    nodes = [
        const("zero", [0]),
        const("one", [1]),
        const("three", [3]),
        const("five", [5]),
        const("pair", [10, 20]),
        node("r", "Range", ["one", "five", "one"], [("int32", [4])], Tidx=I32),
        _int_op("p", "Pack", ["three", "one"], 2, N=2, axis=0),
        _int_op("c", "ConcatV2", ["r", "p", "zero"], 6, N=2, Tidx=I32),
        _int_op("sum", "AddV2", ["pair", "one"], 2),  # a scalar broadcast
        _int_op("diff", "Sub", ["pair", "pair"], 2),
        _int_op("prod", "Mul", ["three", "pair"], 2),
        _int_op("along_1", "ConcatV2", ["pair", "pair", "one"], 4, N=2, Tidx=I32),
        node("empty", "Range", ["one", "one", "one"], [("int32", [0])], Tidx=I32),
        node("backwards", "Range", ["five", "one", "three"], [("int32", [0])], Tidx=I32),
    ]
    assert _values(nodes, "r") == [1, 2, 3, 4]
    assert _values(nodes, "p") == [3, 1]
    assert _values(nodes, "c") == [1, 2, 3, 4, 3, 1]
    assert _values(nodes, "sum") == [11, 21]
    assert _values(nodes, "diff") == [0, 0]
    assert _values(nodes, "prod") == [30, 60]
    assert _values(nodes, "along_1") is None  # not along axis 0: not a plain concatenation
    assert _values(nodes, "empty") == []
    assert _values(nodes, "backwards") == []


def test_what_is_not_small_integer_arithmetic_on_constants_is_unknown() -> None:
    nodes = [
        const("zero", [0]),
        const("one", [1]),
        const("huge", [10**6]),
        node("x", "Placeholder", outputs=[("int32", [2])], dtype=I32, shape={"shape": [2]}),
        _int_op("fed", "AddV2", ["x", "one"], 2),
        node("long", "Range", ["zero", "huge", "one"], [("int32", [10**6])], Tidx=I32),
        node("no_step", "Range", ["zero", "one", "zero"], [("int32", [0])], Tidx=I32),
    ]
    assert _values(nodes, "fed") is None  # a placeholder's values are not known
    assert _values(nodes, "long") is None  # too long to be a permutation or a shape
    assert _values(nodes, "no_step") is None
