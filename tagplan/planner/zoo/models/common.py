"""Shared recipe for zoo training graphs: placeholders, loss, Adam, export.

Every TF1-style zoo model is a *forward function* that creates placeholders and
returns a scalar loss; :func:`build_tf1` wraps it into the same training graph
(forward + backward + one ``ResourceApplyAdam`` per parameter) so all models
follow the naming conventions the analyzer relies on: the loss is ``loss``, the
training op ``train_op``, the variable initializer ``init``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

__all__ = [
    "INIT_NODE",
    "LOSS_NODE",
    "TRAIN_NODE",
    "Forward",
    "TrainGraph",
    "build_tf1",
    "input_spec",
    "mean_xent",
    "placeholder",
    "reset_random_state",
]

LOSS_NODE = "loss"
TRAIN_NODE = "train_op"
INIT_NODE = "init"
LEARNING_RATE = 1e-3


@dataclass
class Forward:
    """What a forward function hands back: its inputs, loss and state updates.

    ``updates`` are ops that must run once per step besides the optimizer, e.g.
    batch-norm moving averages; they become control inputs of ``train_op``.
    ``value_ranges`` gives, per integer input, the exclusive upper bound of valid
    values (class count, vocabulary size, sequence length) so that callers can
    feed random but valid batches.
    """

    inputs: list[tf.Tensor]
    loss: tf.Tensor
    updates: list[tf.Operation] = field(default_factory=list)
    value_ranges: dict[str, int] = field(default_factory=dict)


@dataclass
class TrainGraph:
    """A finished training graph plus the facts the manifest records about it."""

    graph_def: Any
    inputs: list[dict[str, Any]]
    loss_node: str
    train_node: str
    init_node: str | None
    runnable: bool
    params: list[tuple[str, str, list[int]]]
    config: dict[str, Any] = field(default_factory=dict)
    captured_variables: list[dict[str, Any]] = field(default_factory=list)


def placeholder(name: str, dtype: tf.DType, shape: list[int]) -> tf.Tensor:
    """A data input with a fully known shape (the batch size is fixed)."""
    return tf.compat.v1.placeholder(dtype, shape, name=name)


def input_spec(tensor: tf.Tensor, high: int | None = None) -> dict[str, Any]:
    """Manifest description of a data input: node name, dtype, static shape.

    Integer inputs also get ``high``: valid values are ``0 <= v < high``.
    """
    spec: dict[str, Any] = {
        "name": tensor.op.name,
        "dtype": tensor.dtype.name,
        "shape": [int(d) for d in tensor.shape],
    }
    if tensor.dtype.is_integer:
        if high is None:
            raise RuntimeError(f"integer input {tensor.op.name} needs a value range")
        spec["high"] = int(high)
    return spec


def mean_xent(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Mean sparse softmax cross-entropy over every label position."""
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_mean(xent)


def reset_random_state(seed: int) -> None:
    """Seed Python, NumPy, TensorFlow and Keras so a rebuild gives the same bytes."""
    import tf_keras

    tf_keras.backend.clear_session()
    tf_keras.utils.set_random_seed(seed)


def _dense_gradient(grad: Any) -> Any:
    """Turn an embedding's IndexedSlices gradient into a dense tensor.

    ``tf.gather`` differentiates to IndexedSlices, which AdamOptimizer would
    apply with scatter ops; densifying (one UnsortedSegmentSum) keeps the
    convention that every parameter is updated by exactly one ResourceApplyAdam.
    """
    if isinstance(grad, tf.IndexedSlices):
        return tf.convert_to_tensor(grad)
    return grad


def build_tf1(
    forward_fn: Callable[[], Forward],
    *,
    config: dict[str, Any] | None = None,
    seed: int = 0,
    optimizer: Callable[[], tf.compat.v1.train.Optimizer] | None = None,
    sparse_gradients: bool = False,
) -> TrainGraph:
    """Build ``forward_fn`` in a fresh graph and add backward, the optimizer and ``init``.

    ``optimizer`` makes the TF1 optimizer to use instead of Adam (a benchmark that
    reproduces a published configuration trains with plain SGD, for instance).
    ``sparse_gradients`` keeps embedding gradients as ``IndexedSlices``, which the
    optimizer applies with scatter ops, instead of densifying them.

    Variables are resource variables; every node with outputs carries
    ``_output_shapes``, all static except FusedBatchNormV3's scratch output.
    Batch-norm style updates returned by the forward function run under
    ``train_op``'s control dependencies.
    """
    reset_random_state(seed)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        fwd = forward_fn()
        loss = tf.identity(fwd.loss, name=LOSS_NODE)
        opt = optimizer() if optimizer else tf.compat.v1.train.AdamOptimizer(LEARNING_RATE)
        grads_and_vars = [
            (g if sparse_gradients else _dense_gradient(g), v)
            for g, v in opt.compute_gradients(loss)
            if g is not None
        ]
        if fwd.updates:
            apply_op = opt.apply_gradients(grads_and_vars)
            train_op = tf.group(apply_op, *fwd.updates, name=TRAIN_NODE)
        else:
            train_op = opt.apply_gradients(grads_and_vars, name=TRAIN_NODE)
        init = tf.compat.v1.global_variables_initializer()
        trainable = tf.compat.v1.trainable_variables()
        names = {loss.op.name, train_op.name, init.name}
        if names != {LOSS_NODE, TRAIN_NODE, INIT_NODE}:
            raise RuntimeError(f"unexpected special node names: {sorted(names)}")
        if len(grads_and_vars) != len(trainable):
            raise RuntimeError("some trainable variables receive no gradient")
        for t in fwd.inputs:
            if not t.shape.is_fully_defined():
                raise RuntimeError(f"input {t.op.name} has an unknown dimension")
        graph_def = graph.as_graph_def(add_shapes=True)
    return TrainGraph(
        graph_def=graph_def,
        inputs=[input_spec(t, fwd.value_ranges.get(t.op.name)) for t in fwd.inputs],
        loss_node=LOSS_NODE,
        train_node=TRAIN_NODE,
        init_node=INIT_NODE,
        runnable=True,
        params=[(v.op.name, v.dtype.base_dtype.name, [int(d) for d in v.shape]) for v in trainable],
        config=dict(config or {}),
    )
