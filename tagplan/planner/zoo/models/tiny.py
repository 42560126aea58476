"""Tiny models for fast tests: an MLP and a small CNN (TF1), and the MLP as TF2.

``mlp`` and ``mlp_tf2`` are the same network (784 -> 256 -> 128 -> 10, ReLU)
built two ways: as a TF1 graph with ``ResourceApplyAdam``, and as a TF2
``tf.function`` whose Keras 3 Adam decomposes into elementwise ops and
Assign*VariableOp on captured resource placeholders. The TF2 graph cannot run on
its own (its variables live outside the graph), so it is recorded as not
runnable, with a map from each resource placeholder to its variable.
"""

from __future__ import annotations

import itertools
from typing import Any

import tensorflow as tf

from .common import (
    LEARNING_RATE,
    LOSS_NODE,
    Forward,
    TrainGraph,
    build_tf1,
    input_spec,
    mean_xent,
    placeholder,
    reset_random_state,
)
from .layers import dense, variable

__all__ = ["MLP_WIDTHS", "build_mlp", "build_mlp_tf2", "build_small_cnn"]

MLP_WIDTHS = (784, 256, 128, 10)
CNN_IMAGE = (32, 32, 3)
CNN_CLASSES = 10
# The node TF adds after the last stateful op of a tf.function: the train step.
TF2_TRAIN_NODE = "NoOp"


def _mlp_forward(batch: int) -> Forward:
    """ReLU MLP over flat features."""
    features = placeholder("features", tf.float32, [batch, MLP_WIDTHS[0]])
    labels = placeholder("labels", tf.int32, [batch])
    init = tf.compat.v1.glorot_uniform_initializer()
    x = features
    for i, width in enumerate(MLP_WIDTHS[1:]):
        last = i == len(MLP_WIDTHS) - 2
        x = dense(x, width, f"dense_{i}", initializer=init, activation=None if last else "relu")
    return Forward(
        inputs=[features, labels],
        loss=mean_xent(x, labels),
        value_ranges={"labels": MLP_WIDTHS[-1]},
    )


def build_mlp(batch_size: int) -> TrainGraph:
    """The MLP as a TF1 training graph."""
    return build_tf1(lambda: _mlp_forward(batch_size), config={"widths": list(MLP_WIDTHS)})


def _conv_relu_pool(x: tf.Tensor, filters: int, name: str) -> tf.Tensor:
    """3x3 SAME convolution with bias, ReLU, then 2x2 max pooling."""
    with tf.compat.v1.variable_scope(name):
        kernel = variable(
            "kernel",
            [3, 3, int(x.shape[-1]), filters],
            tf.compat.v1.glorot_uniform_initializer(),
        )
        bias = variable("bias", [filters])
        x = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, kernel, 1, "SAME"), bias))
        return tf.nn.max_pool2d(x, 2, 2, "VALID")


def _small_cnn_forward(batch: int) -> Forward:
    """Two conv + pool stages and a dense classifier on 32x32 RGB images."""
    images = placeholder("images", tf.float32, [batch, *CNN_IMAGE])
    labels = placeholder("labels", tf.int32, [batch])
    x = _conv_relu_pool(images, 16, "conv_0")
    x = _conv_relu_pool(x, 32, "conv_1")
    x = tf.reshape(x, [-1, int(x.shape[1] * x.shape[2] * x.shape[3])])
    logits = dense(x, CNN_CLASSES, "logits", initializer=tf.compat.v1.glorot_uniform_initializer())
    return Forward(
        inputs=[images, labels],
        loss=mean_xent(logits, labels),
        value_ranges={"labels": CNN_CLASSES},
    )


def build_small_cnn(batch_size: int) -> TrainGraph:
    """The small CNN as a TF1 training graph."""
    return build_tf1(
        lambda: _small_cnn_forward(batch_size),
        config={"image": list(CNN_IMAGE), "filters": [16, 32], "classes": CNN_CLASSES},
    )


def _resource_handle(var: Any) -> tf.Tensor:
    """The eager resource handle behind a ``tf.Variable`` or a Keras 3 variable."""
    if isinstance(var, tf.Variable):
        return var.handle
    return var.value.handle


def _variable_name(var: Any) -> str:
    """A readable variable name: Keras path, or the tf.Variable name without ``:0``."""
    path = getattr(var, "path", None)
    if isinstance(path, str):
        return path
    return var.name.split(":")[0]


def _renumber_custom_gradients(graph_def: Any) -> None:
    """Number ``_gradient_op_type`` values by first appearance, in place.

    TensorFlow names custom gradients from a process-wide counter, so the value
    depends on what was built earlier in the process. It only keys an in-process
    gradient registry, so renumbering makes the export reproducible at no cost.
    """
    seen: dict[bytes, bytes] = {}
    for node in graph_def.node:
        attr = node.attr.get("_gradient_op_type")
        if attr is not None:
            new = seen.setdefault(attr.s, f"CustomGradient-{len(seen)}".encode())
            attr.s = new


def build_mlp_tf2(batch_size: int, seed: int = 0) -> TrainGraph:
    """The MLP as a TF2 concrete function: GradientTape + Keras 3 Adam."""
    import keras

    reset_random_state(seed)
    params: list[tf.Variable] = []
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(MLP_WIDTHS)):
        limit = (6.0 / (fan_in + fan_out)) ** 0.5
        kernel = tf.random.stateless_uniform(
            [fan_in, fan_out], seed=[seed, i], minval=-limit, maxval=limit
        )
        params.append(tf.Variable(kernel, name=f"dense_{i}/kernel"))
        params.append(tf.Variable(tf.zeros([fan_out]), name=f"dense_{i}/bias"))
    # named: Keras numbers unnamed optimizers per process (adam, adam_1, ...), so a build
    # after other Keras work would name the slots differently
    optimizer = keras.optimizers.Adam(learning_rate=LEARNING_RATE, name="adam")
    optimizer.build(params)

    @tf.function
    def train_step(features: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            x = features
            for i in range(0, len(params), 2):
                x = tf.nn.bias_add(tf.matmul(x, params[i]), params[i + 1])
                if i + 2 < len(params):
                    x = tf.nn.relu(x)
            loss = mean_xent(x, labels)
        grads = tape.gradient(loss, params)
        optimizer.apply_gradients(zip(grads, params, strict=True))
        return tf.identity(loss, name=LOSS_NODE)

    specs = [
        tf.TensorSpec([batch_size, MLP_WIDTHS[0]], tf.float32, name="features"),
        tf.TensorSpec([batch_size], tf.int32, name="labels"),
    ]
    concrete = train_step.get_concrete_function(*specs)
    graph = concrete.graph
    graph_def = graph.as_graph_def(add_shapes=True)
    _renumber_custom_gradients(graph_def)

    by_handle = {id(_resource_handle(v)): (v, True) for v in params}
    by_handle.update({id(_resource_handle(v)): (v, False) for v in optimizer.variables})
    captured: list[dict[str, Any]] = []
    for external, internal in graph.captures:
        var, trainable = by_handle[id(external)]
        captured.append(
            {
                "placeholder": internal.op.name,
                "variable": _variable_name(var),
                "dtype": tf.as_dtype(var.dtype).name,
                "shape": [int(d) for d in var.shape],
                "trainable": trainable,
            }
        )
    data_inputs = [graph.get_tensor_by_name(f"{s.name}:0") for s in specs]
    node_names = {n.name for n in graph_def.node}
    if LOSS_NODE not in node_names or TF2_TRAIN_NODE not in node_names:
        raise RuntimeError("the traced train step lacks its loss or final NoOp node")
    return TrainGraph(
        graph_def=graph_def,
        inputs=[input_spec(t, MLP_WIDTHS[-1] if t.dtype.is_integer else None) for t in data_inputs],
        loss_node=LOSS_NODE,
        train_node=TF2_TRAIN_NODE,
        init_node=None,
        runnable=False,
        params=[(_variable_name(v), v.dtype.name, [int(d) for d in v.shape]) for v in params],
        config={"widths": list(MLP_WIDTHS), "optimizer": "keras.optimizers.Adam"},
        captured_variables=captured,
    )
