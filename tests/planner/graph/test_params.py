"""Parameters, gradients, apply ops and slots in both graph styles (docs/design.md §2)."""

from __future__ import annotations

import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.analyzer import analyze
from tests.planner.graph.builders import (
    F32,
    const,
    dense_graph,
    document,
    graph_def,
    node,
    op,
    placeholder,
    scalar,
    sgd,
    variable,
)

B = 8


def captured(name: str, shape: list[int]) -> list[dict]:
    """A TF2 concrete-function capture: a DT_RESOURCE placeholder, and its read."""
    handle = node(
        name,
        "Placeholder",
        outputs=[("resource", [])],
        dtype={"type": "resource"},
        _handle_shapes={"list_shape": [shape]},
        _handle_dtypes={"list_type": ["float32"]},
    )
    read = node(f"{name}/read", "ReadVariableOp", [name], [("float32", shape)], dtype=F32)
    return [handle, read]


def keras_style_graph() -> dict:
    """x @ w, sum loss, and a decomposed momentum-like update with one slot ``m``."""
    return document(
        [
            placeholder("x", [B, 4]),
            *captured("w", [4, 3]),
            *captured("m", [4, 3]),
            *captured("iterations", []),
            op("y", "MatMul", ["x", "w/read"], [B, 3]),
            const("axes", [0, 1]),
            op("loss", "Sum", ["y", "axes"], [], Tidx={"type": "int32"}),
            op("dy", "OnesLike", ["y"], [B, 3]),
            op("dw", "MatMul", ["x", "dy"], [4, 3], transpose_a=True),
            scalar("decay", 0.9),
            scalar("keep", 0.1),
            scalar("lr", 0.01),
            op("m_decayed", "Mul", ["m/read", "decay"], [4, 3]),
            op("g_scaled", "Mul", ["dw", "keep"], [4, 3]),
            op("m_new", "AddV2", ["m_decayed", "g_scaled"], [4, 3]),
            node("assign_m", "AssignVariableOp", ["m", "m_new"], [], dtype=F32),
            node(
                "m/read_after",
                "ReadVariableOp",
                ["m", "^assign_m"],
                [("float32", [4, 3])],
                dtype=F32,
            ),
            op("step", "Mul", ["m/read_after", "lr"], [4, 3]),
            node("update_w", "AssignSubVariableOp", ["w", "step"], [], dtype=F32),
            scalar("one", 1.0),
            node("count", "AssignAddVariableOp", ["iterations", "one", "^update_w"], [], dtype=F32),
        ]
    )


def test_fused_apply_op_names_gradient_and_parameter() -> None:
    ir = analyze(graph_def(dense_graph(batch=B)))
    params = ir.parameters
    assert params.names == ("w",)
    assert params.bytes.tolist() == [4 * 3 * 4]
    assert ir.op_names[ir.tensor_producer[params.gradient_tensor[0]]] == "dw"
    assert ir.op_names[params.apply_op[0]] == "update_w"
    assert params.gradient_bytes.tolist() == params.bytes.tolist()


def test_decomposed_optimizer_region_gradient_and_slots() -> None:
    ir = analyze(graph_def(keras_style_graph()))
    params = ir.parameters
    assert params.names == ("w",)
    assert params.bytes.tolist() == [48]
    assert ir.op_names[ir.tensor_producer[params.gradient_tensor[0]]] == "dw"
    assert ir.op_names[params.apply_op[0]] == "update_w"
    slots = params.slot_op[params.slot_ptr[0] : params.slot_ptr[1]]
    assert [ir.op_names[s] for s in slots] == ["m"]
    assert params.slot_bytes.tolist() == [48]
    region = {ir.op_names[r] for r in params.region_op[params.region_ptr[0] : params.region_ptr[1]]}
    assert {"assign_m", "m_new", "g_scaled", "m_decayed", "step", "update_w"} <= region
    assert "dw" not in region and "count" not in region


def test_decomposed_optimizer_needs_the_loss_to_tell_parameters_from_slots() -> None:
    ir = analyze(graph_def(keras_style_graph()), loss="loss")
    assert ir.parameters.names == ("w",)
    with pytest.raises(InvalidInput, match="loss node 'nope'"):
        analyze(graph_def(keras_style_graph()), loss="nope")


def test_graph_without_parameters_is_refused() -> None:
    doc = document([placeholder("x", [B, 4]), op("loss", "Relu", ["x"], [B, 4])])
    with pytest.raises(InvalidInput, match="no trainable parameters"):
        analyze(graph_def(doc))


def test_parameter_with_two_updates_is_refused() -> None:
    doc = dense_graph(batch=B)
    doc["nodes"].append(sgd("update_w_again", "w", "dw"))
    with pytest.raises(InvalidInput, match="updated by two apply ops"):
        analyze(graph_def(doc))


def test_ambiguous_decomposed_gradient_is_refused() -> None:
    doc = keras_style_graph()
    doc["nodes"].append(op("dw2", "MatMul", ["x", "dy"], [4, 3], transpose_a=True))
    for entry in doc["nodes"]:
        if entry["name"] == "m_new":
            entry["op"], entry["inputs"] = "AddN", ["m_decayed", "g_scaled", "dw2"]
            entry["attrs"]["N"] = 3
    with pytest.raises(InvalidInput, match="cannot identify the gradient of parameter 'w'"):
        analyze(graph_def(doc))


def test_variable_helper_reads_shape_from_attrs() -> None:
    doc = dense_graph(batch=B)
    doc["nodes"][1:3] = variable("w", [4, 3])
    assert analyze(graph_def(doc)).param_bytes == 48


def test_every_variable_op_holds_its_bytes() -> None:
    """Parameters, their slots and other state (here the iteration counter) all count."""
    ir = analyze(graph_def(keras_style_graph()))
    held = {ir.op_names[i]: int(b) for i, b in enumerate(ir.variable_bytes) if b}
    assert held == {"w": 48, "m": 48, "iterations": 4}
