"""Edge resolution, output typing and validation of graphs."""

from __future__ import annotations

import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.parsed import parse_graph
from tagplan.planner.graph.protos import DT_RESOURCE
from tests.planner.graph.builders import dense_graph, document, graph_def, node, op, placeholder


def test_edges_and_registry_dtypes() -> None:
    graph = parse_graph(graph_def(dense_graph()))
    mm = graph.index["dw"]
    assert graph.data_inputs[mm] == [(graph.index["x"], 0), (graph.index["dy"], 0)]
    assert graph.output_dtypes[graph.index["w"]] == [DT_RESOURCE]
    assert graph.output_shapes[mm] == [(4, 3)]
    assert graph.known_op[mm]
    order = graph.topo_order.tolist()
    assert order.index(graph.index["x"]) < order.index(mm)


def test_output_count_comes_from_the_op_registry() -> None:
    doc = document(
        [
            placeholder("x", [2, 4]),
            node("s", "Split", ["dim", "x"], num_split=2, T={"type": "float32"}),
            node("dim", "Const", outputs=[("int32", [])], dtype={"type": "int32"}),
            op("y", "AddV2", ["s:0", "s:1"], [2, 2]),
        ]
    )
    graph = parse_graph(graph_def(doc))
    assert len(graph.output_dtypes[graph.index["s"]]) == 2


def test_cycle_is_refused_naming_its_nodes() -> None:
    doc = document([op("a", "Relu", ["b"], [1]), op("b", "Relu", ["a"], [1])])
    with pytest.raises(InvalidInput, match=r"cycle through 2 nodes \('a', 'b'\)"):
        parse_graph(graph_def(doc))


def test_control_edges_take_part_in_cycles() -> None:
    doc = document([op("a", "Relu", ["^b"], [1]), op("b", "Relu", ["a"], [1])])
    with pytest.raises(InvalidInput, match="cycle"):
        parse_graph(graph_def(doc))


@pytest.mark.parametrize(
    ("nodes", "message"),
    [
        ([op("a", "Relu", ["nowhere"], [1])], "reads 'nowhere'"),
        ([placeholder("a", [1]), placeholder("a", [1])], "two nodes are named 'a'"),
        ([placeholder("a", [1]), op("b", "Relu", ["a:3"], [1])], "output 3 is read"),
        ([], "no nodes"),
    ],
)
def test_inconsistent_graphs_are_refused(nodes, message) -> None:
    with pytest.raises(InvalidInput, match=message):
        parse_graph(graph_def(document(nodes)))


def test_unknown_op_types_are_typed_from_outputs_or_readers() -> None:
    doc = document(
        [
            placeholder("x", [2, 3]),
            node("custom", "MyFancyOp", ["x"], outputs=[("float16", [2, 3]), ("float32", [3])]),
            node("other", "AnotherOp", ["x"]),
            op("y", "Relu", ["other:1"], [2, 3]),
        ]
    )
    graph = parse_graph(graph_def(doc))
    assert graph.output_dtypes[graph.index["custom"]] == [19, 1]  # float16, float32
    assert len(graph.output_dtypes[graph.index["other"]]) == 2
    assert not graph.known_op[graph.index["custom"]]
