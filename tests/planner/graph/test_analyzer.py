"""The analyzer's IR: layout invariants, batch scaling, fingerprints, bad inputs."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.analyzer import analyze, graph_fingerprint
from tagplan.planner.graph.ir import GraphIR
from tests.planner.graph.builders import dense_graph, graph_def, node, placeholder


def check_layout(ir: GraphIR) -> None:
    """CSR arrays agree with each other and ops are in topological order."""
    for op in range(ir.num_ops):
        for tensor in ir.inputs(op):
            assert ir.tensor_producer[tensor] < op
            assert op in ir.consumers(tensor)
        for tensor in ir.outputs(op):
            assert ir.tensor_producer[tensor] == op
        assert all(pred < op for pred in ir.control_preds(op))
    assert ir.op_output_ptr[-1] == ir.num_tensors
    consumers = sum(len(ir.consumers(t)) for t in range(ir.num_tensors))
    assert consumers == len(ir.op_input_tensor)


def test_layout_invariants() -> None:
    check_layout(analyze(graph_def(dense_graph())))


def test_bytes_and_shapes_scale_with_the_job_batch_size_only_on_batch_tensors() -> None:
    base = analyze(graph_def(dense_graph(batch=8)))
    doubled = analyze(graph_def(dense_graph(batch=8)), batch_size=16)
    batch = base.tensor_batch_axis >= 0
    assert batch.any()
    np.testing.assert_array_equal(doubled.tensor_bytes[batch], 2 * base.tensor_bytes[batch])
    np.testing.assert_array_equal(doubled.tensor_bytes[~batch], base.tensor_bytes[~batch])
    y = base.op_names.index("y")
    assert doubled.tensor_shapes[doubled.outputs(y)[0]] == (16, 3)
    assert doubled.graph_batch_size == 8 and doubled.batch_size == 16
    assert doubled.cost_keys == base.cost_keys  # profiles key on shapes without the batch


def test_fingerprint_ignores_node_order_and_devices_but_not_content() -> None:
    doc = dense_graph()
    reference = graph_fingerprint(graph_def(doc))
    shuffled = dict(doc, nodes=list(reversed(doc["nodes"])))
    for entry in shuffled["nodes"]:
        entry["device"] = "/device:GPU:3"
    assert graph_fingerprint(graph_def(shuffled)) == reference
    changed = dense_graph(units=5)
    assert graph_fingerprint(graph_def(changed)) != reference


def test_missing_batch_size_is_refused() -> None:
    doc = dense_graph()
    doc["nodes"][0] = placeholder("x", [-1, 4])
    with pytest.raises(InvalidInput, match="missing batch size"):
        analyze(graph_def(doc))


def test_inconsistent_batch_size_is_refused() -> None:
    doc = dense_graph(batch=8)
    doc["nodes"].append(placeholder("labels", [6]))
    with pytest.raises(InvalidInput, match=r"inconsistent batch size.*labels\[6\]"):
        analyze(graph_def(doc))


def test_non_positive_batch_size_is_refused() -> None:
    with pytest.raises(InvalidInput, match="must be positive"):
        analyze(graph_def(dense_graph()), batch_size=0)


def test_graph_without_batch_input_is_refused() -> None:
    doc = dense_graph()
    doc["nodes"][0] = node("x", "RandomStandardNormal", ["shape"], [("float32", [8, 4])])
    doc["nodes"].append(node("shape", "Const", outputs=[("int32", [2])], dtype={"type": "int32"}))
    with pytest.raises(InvalidInput, match="no batch input"):
        analyze(graph_def(doc))


def test_unknown_op_types_are_analyzed_as_none_and_reported() -> None:
    doc = dense_graph()
    for entry in doc["nodes"]:
        if entry["name"] == "dy":
            entry["op"] = "FancyOnesLike"
    ir = analyze(graph_def(doc))
    assert ir.unknown_op_types == ("FancyOnesLike",)
    assert ir.split_category[ir.op_names.index("dy")] == 2
    assert ir.summary()["unknown_op_types"] == ["FancyOnesLike"]


def test_the_one_scalar_of_the_batch_nobody_reads_is_the_loss() -> None:
    """A TF2 training function returns its loss through an ``Identity`` of another name:
    the one floating-point scalar computed from the batch that nothing reads."""
    doc = dense_graph(batch=4)
    for entry in doc["nodes"]:
        if entry["name"] == "loss":
            entry["name"] = "Identity_3"
    ir = analyze(graph_def(doc))
    assert ir.op_names[ir.loss_op] == "Identity_3"
    named = analyze(graph_def(doc), loss="y")
    assert named.op_names[named.loss_op] == "y"
