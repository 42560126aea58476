"""TAG §4.1.1 simplification: dangling ops, Identity and NoOp go; ordering survives."""

from __future__ import annotations

import pytest

from tagplan.planner.graph.analyzer import analyze
from tests.planner.graph.builders import dense_graph, graph_def, node, op, scalar


def graph_with_clutter() -> dict:
    doc = dense_graph(batch=4)
    doc["nodes"] += [
        # an initializer: not part of the training step
        scalar("init_value", 0.0),
        node("init_w", "AssignVariableOp", ["w", "init_value"], [], dtype={"type": "float32"}),
        # an identity chain in front of the gradient, and a train op that groups the update
        op("dw_id", "Identity", ["dw"], [4, 3]),
        op("dw_id2", "Identity", ["dw_id", "^y"], [4, 3]),
        node("after", "NoOp", ["^update_w"]),
        node("train_op", "NoOp", ["^after"]),
    ]
    for entry in doc["nodes"]:
        if entry["name"] == "update_w":
            entry["inputs"] = ["w", "lr", "dw_id2"]
    return doc


def test_dangling_identity_and_noop_are_dropped_with_names_kept() -> None:
    ir = analyze(graph_def(graph_with_clutter()))
    assert set(ir.dropped["dangling"]) == {"init_value", "init_w"}
    assert set(ir.dropped["identity"]) == {"dw_id", "dw_id2"}
    assert set(ir.dropped["noop"]) == {"after", "train_op"}
    assert "dw_id" not in ir.op_names
    # a dropped identity maps to the op it folds into
    assert ir.op_index("dw_id2") == ir.op_names.index("dw")
    names = ["update_w", "dw_id2", "dw"]
    expected = [ir.op_names.index(n) for n in ("update_w", "dw", "dw")]
    assert ir.op_indices(names).tolist() == expected
    with pytest.raises(KeyError, match="init_w"):  # dropped as dangling: no op stands for it
        ir.op_indices(["dw", "init_w", "also_missing"])


def test_bypassed_identity_passes_on_its_tensor_and_control_edges() -> None:
    ir = analyze(graph_def(graph_with_clutter()))
    apply = ir.op_names.index("update_w")
    gradient = ir.inputs(apply)[2]
    assert ir.op_names[ir.tensor_producer[gradient]] == "dw"
    assert ir.op_names[ir.tensor_producer[ir.parameters.gradient_tensor[0]]] == "dw"
    # dw_id2 waited on y: the apply op inherits that control edge
    assert [ir.op_names[p] for p in ir.control_preds(apply)] == ["y"]


def test_no_identity_or_noop_survives_in_zoo_style_graphs() -> None:
    ir = analyze(graph_def(graph_with_clutter()))
    assert "Identity" not in ir.op_types and "NoOp" not in ir.op_types


def test_a_value_nobody_reads_is_pruned_once_the_loss_is_known() -> None:
    """``unused`` (a gradient TensorFlow computes and nothing reads) depends on the batch
    and is a sink; fetching the loss and the train op never runs it. Without a loss (here:
    two scalars nobody reads, neither named ``loss``), no sink can be told from the loss,
    so every one stays."""
    doc = dense_graph(batch=4)
    doc["nodes"].append(op("unused", "Neg", ["dy"], [4, 3]))
    step = analyze(graph_def(doc), loss="loss")
    assert "unused" in step.dropped["dangling"] and "unused" not in step.op_names
    assert "loss" in step.op_names and "update_w" in step.op_names
    for entry in doc["nodes"]:
        if entry["name"] == "loss":
            entry["name"] = "total"
    doc["nodes"].append(op("other_total", "Sum", ["y", "axes"], [], Tidx={"type": "int32"}))
    ambiguous = analyze(graph_def(doc))
    assert ambiguous.loss_op == -1 and "unused" in ambiguous.op_names
