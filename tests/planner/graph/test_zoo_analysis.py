"""The analyzer on every committed zoo graph (both graph styles), checked against the
manifest, TAG Table 3, and TensorFlow's own gradients."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.batch import SplitCategory
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.zoo import catalog
from tests.planner.graph.test_analyzer import check_layout

MODELS = [m.name for m in catalog.list_models()]
MIB = 2**20


def without_shapes(graph_def):
    """A copy of the graph with every ``_output_shapes`` attribute removed."""
    stripped = type(graph_def)()
    stripped.CopyFrom(graph_def)
    for node in stripped.node:
        if "_output_shapes" in node.attr:
            del node.attr["_output_shapes"]
    return stripped


@cache
def analyzed(name: str) -> GraphIR:
    source = load_graph_source(f"zoo:{name}")
    return analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)


@pytest.mark.parametrize("name", MODELS)
def test_every_gradient_maps_to_one_parameter_and_one_apply_op(name: str) -> None:
    ir = analyzed(name)
    params = ir.parameters
    assert len(params) > 0
    assert len(set(params.gradient_tensor.tolist())) == len(params)
    assert len(set(params.apply_op.tolist())) == len(params)
    assert len(set(params.variable_op.tolist())) == len(params)
    # a dense gradient has the parameter's size
    np.testing.assert_array_equal(params.gradient_bytes, params.bytes)
    # the gradient is produced by the backward pass: never by a variable read
    producers = {ir.op_types[ir.tensor_producer[t]] for t in params.gradient_tensor}
    assert "ReadVariableOp" not in producers and "VarHandleOp" not in producers


@pytest.mark.parametrize("name", MODELS)
def test_analysis_agrees_with_the_manifest(name: str) -> None:
    ir, model = analyzed(name), catalog.get_model(name)
    summary = ir.summary()  # the tables of wide_deep's are sparse parameters
    assert summary["trainable_bytes"] == model.param_bytes
    assert summary["trainable_variables"] == model.trainable_variables
    assert ir.batch_size == model.batch_size
    assert ir.loss_op >= 0
    check_layout(ir)
    counts = ir.split_category_counts()
    assert counts["split-concat"] > 0 and counts["split-sum"] > 0
    # every apply op is category none: gradients are aggregated before they are applied
    assert (ir.split_category[ir.parameters.apply_op] == SplitCategory.NONE).all()


def test_vgg19_parameter_size_matches_tag_table3() -> None:
    """TAG Table 3 lists VGG19's parameter size as 548M: MiB of float32 parameters
    (143.7M parameters x 4 bytes = 548 MiB). The bar is within 15%."""
    assert analyzed("vgg19").param_bytes / MIB == pytest.approx(548, rel=0.15)


def test_both_graph_styles_find_the_same_mlp() -> None:
    tf1, tf2 = analyzed("mlp"), analyzed("mlp_tf2")
    assert sorted(tf1.parameters.bytes.tolist()) == sorted(tf2.parameters.bytes.tolist())
    assert tf1.parameters.slot_bytes.sum() == tf2.parameters.slot_bytes.sum()
    assert {tf1.op_types[a] for a in tf1.parameters.apply_op} == {"ResourceApplyAdam"}
    assert {tf2.op_types[a] for a in tf2.parameters.apply_op} <= {
        "AssignSubVariableOp",
        "AssignVariableOp",
    }


def test_batch_norm_models_flag_batch_statistics() -> None:
    assert analyzed("resnet101").batch_statistics.sum() > 0
    assert analyzed("vgg19").batch_statistics.sum() == 0


@pytest.mark.tf
@pytest.mark.parametrize("name", ["mlp", "small_cnn"])
def test_shapes_without_output_shapes_come_from_tensorflow(name: str) -> None:
    source = load_graph_source(f"zoo:{name}")
    stripped = without_shapes(source.graph_def)
    ir = analyze(stripped, batch_inputs=source.batch_inputs, loss=source.loss)
    reference = analyzed(name)
    assert ir.tensor_shapes == reference.tensor_shapes
    np.testing.assert_array_equal(ir.tensor_batch_axis, reference.tensor_batch_axis)
    np.testing.assert_array_equal(ir.split_category, reference.split_category)


@pytest.mark.tf
def test_graph_with_unknown_batch_is_inferred_at_the_given_batch_size() -> None:
    """A graph built with a None batch dimension and exported without shapes."""
    import tensorflow as tf

    from tagplan.planner.graph.load import loads_graph_def

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 6], name="x")
        labels = tf.compat.v1.placeholder(tf.int32, [None], name="labels")
        w = tf.compat.v1.get_variable("w", [6, 3], use_resource=True)
        logits = tf.matmul(tf.reshape(x, [-1, 2, 3]), tf.reshape(w, [3, 6]))
        logits = tf.reduce_sum(logits, axis=1)[:, :3]
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        loss = tf.identity(tf.reduce_mean(xent), name="loss")
        tf.compat.v1.train.AdamOptimizer().minimize(loss)
    data = graph.as_graph_def(add_shapes=False).SerializeToString()
    with pytest.raises(InvalidInput, match="missing batch size"):
        analyze(loads_graph_def(data))
    ir = analyze(loads_graph_def(data), batch_size=8)
    assert (ir.graph_batch_size, ir.batch_size) == (8, 8)
    assert ir.param_bytes == 6 * 3 * 4
    matmul = next(i for i, t in enumerate(ir.op_types) if t == "BatchMatMulV2")
    out = ir.outputs(matmul)[0]
    assert ir.tensor_shapes[out] == (8, 2, 6)
    assert ir.tensor_batch_axis[out] == 0


@pytest.mark.tf
@pytest.mark.parametrize("name", ["mlp", "small_cnn"])
def test_identified_gradients_equal_tensorflow_gradients(name: str) -> None:
    """Run the graph in TensorFlow: the tensor the analyzer calls the gradient of each
    parameter must equal d(loss)/d(parameter) computed by tf.gradients."""
    import tensorflow as tf

    source = load_graph_source(f"zoo:{name}")
    ir = analyzed(name)
    model = catalog.get_model(name)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(
            tf.compat.v1.GraphDef.FromString(source.graph_def.SerializeToString()), name=""
        )
        loss = graph.get_tensor_by_name(f"{model.loss_node}:0")
        reads_by_param = {}
        for op in graph.get_operations():
            if op.type == "ReadVariableOp" and op.inputs[0].op.type == "VarHandleOp":
                reads_by_param.setdefault(op.inputs[0].op.name, []).append(op.outputs[0])
        names = list(ir.parameters.names)
        reference = []
        for param in names:
            grads = tf.gradients(loss, reads_by_param[param])
            reference.append(tf.add_n([g for g in grads if g is not None]))
        identified = []
        for t in ir.parameters.gradient_tensor:
            op_name = ir.op_names[ir.tensor_producer[t]]
            identified.append(graph.get_tensor_by_name(f"{op_name}:{ir.tensor_slot[t]}"))
        rng = np.random.default_rng(0)
        feeds = {}
        for entry in model.inputs:
            tensor = graph.get_tensor_by_name(f"{entry['name']}:0")
            if entry["dtype"].startswith("int"):
                feeds[tensor] = rng.integers(0, entry.get("high", 2), size=entry["shape"])
            else:
                feeds[tensor] = rng.standard_normal(entry["shape"]).astype(np.float32)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(graph.get_operation_by_name(model.init_node))
            expected, actual = session.run([reference, identified], feeds)
    for name_, want, got in zip(names, expected, actual, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name_)
