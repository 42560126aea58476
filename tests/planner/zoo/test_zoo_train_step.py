"""Committed graphs load in TensorFlow and the tiny ones train from their GraphDef."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tagplan.planner.zoo import get_model, list_models, read_graph_bytes

pytestmark = pytest.mark.tf


def _graph_def(name: str) -> Any:
    tf = pytest.importorskip("tensorflow")
    return tf.compat.v1.GraphDef.FromString(read_graph_bytes(name))


def _unknown_allowed(node: Any, index: int, by_name: dict[str, Any]) -> bool:
    """FusedBatchNormV3's reserve_space_3 (a backend-dependent scratch buffer) and
    the unused zeros tf.gradients makes for it are tensors of unknown shape; so are the
    batch's distinct ids (``Unique``'s first output) and what a sparse update computes
    from them, whose rows depend on the ids' values."""
    if node.op == "FusedBatchNormV3":
        return index == 5
    if node.op == "ZerosLike":
        name, _, port = node.input[0].partition(":")
        return by_name[name].op == "FusedBatchNormV3" and port == "5"
    return _after_distinct_ids(node.name, by_name, set())


def _after_distinct_ids(name: str, by_name: dict[str, Any], seen: set[str]) -> bool:
    """Does ``name`` depend, over data edges, on the distinct ids of a ``Unique``?"""
    if name in seen:
        return False
    seen.add(name)
    node = by_name[name]
    if node.op == "Unique":
        return True
    producers = (i.lstrip("^").partition(":")[0] for i in node.input if not i.startswith("^"))
    return any(_after_distinct_ids(p, by_name, seen) for p in producers)


def test_every_output_has_a_static_shape() -> None:
    from tensorflow.python.framework import op_def_registry

    for m in list_models():
        graph_def = _graph_def(m.name)
        by_name = {n.name: n for n in graph_def.node}
        for node in graph_def.node:
            if not op_def_registry.get(node.op).output_arg:
                continue
            assert "_output_shapes" in node.attr, (m.name, node.name)
            for i, shape in enumerate(node.attr["_output_shapes"].list.shape):
                known = not shape.unknown_rank and all(d.size >= 0 for d in shape.dim)
                assert known or _unknown_allowed(node, i, by_name), (m.name, node.name, i)
        for spec in m.inputs:
            dims = by_name[spec["name"]].attr["_output_shapes"].list.shape[0].dim
            assert [d.size for d in dims] == spec["shape"]
        loss_shape = by_name[m.loss_node].attr["_output_shapes"].list.shape[0]
        assert not loss_shape.unknown_rank and len(loss_shape.dim) == 0


@pytest.mark.parametrize("name", ["mlp", "small_cnn"])
def test_one_training_step_from_the_committed_graph(name: str) -> None:
    tf = pytest.importorskip("tensorflow")
    model = get_model(name)
    graph_def = _graph_def(name)
    handles = [n.input[0] for n in graph_def.node if n.op == "ResourceApplyAdam"]
    assert len(handles) == model.trainable_variables

    rng = np.random.default_rng(0)
    feed: dict[str, np.ndarray] = {}
    for spec in model.inputs:
        if "high" in spec:
            value = rng.integers(0, spec["high"], spec["shape"]).astype(spec["dtype"])
        else:
            value = rng.standard_normal(spec["shape"]).astype(spec["dtype"])
        feed[f"{spec['name']}:0"] = value

    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(graph_def, name="")
        reads = [
            tf.raw_ops.ReadVariableOp(
                resource=graph.get_tensor_by_name(f"{h}:0"),
                dtype=graph.get_operation_by_name(h).get_attr("dtype"),
            )
            for h in handles
        ]
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(model.init_node)
            before = sess.run(reads)
            loss, _ = sess.run([f"{model.loss_node}:0", model.train_node], feed)
            after = sess.run(reads)

    assert np.isfinite(loss)
    for handle, old, new in zip(handles, before, after, strict=True):
        assert not np.array_equal(old, new), f"{handle} did not change"
