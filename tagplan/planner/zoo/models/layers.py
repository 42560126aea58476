"""Hand-written layers for the zoo's language models and tiny nets.

Plain ``tf.compat.v1`` ops over resource variables, one variable scope per
layer, so node names read like the TF1 reference implementations (BERT's
``bert/encoder/layer_3/attention/self/query/MatMul``). Reshapes keep the batch
dimension as ``-1`` so no constant in the forward pass bakes in the batch size.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import tensorflow as tf

__all__ = [
    "Initializer",
    "attention",
    "dense",
    "embedding",
    "gelu",
    "layer_norm",
    "variable",
]

Initializer = Callable[..., Any]


def variable(name: str, shape: list[int], initializer: Initializer | None = None) -> tf.Variable:
    """A float32 trainable resource variable in the current variable scope."""
    if initializer is None:
        initializer = tf.compat.v1.zeros_initializer()
    return tf.compat.v1.get_variable(
        name, shape, tf.float32, initializer=initializer, use_resource=True
    )


def dense(
    x: tf.Tensor,
    units: int,
    name: str,
    *,
    initializer: Initializer,
    activation: str | None = None,
) -> tf.Tensor:
    """``x @ kernel + bias`` on a 2-D input, with an optional relu/gelu/tanh."""
    with tf.compat.v1.variable_scope(name):
        kernel = variable("kernel", [int(x.shape[-1]), units], initializer)
        bias = variable("bias", [units])
        y = tf.nn.bias_add(tf.matmul(x, kernel), bias)
    if activation == "relu":
        return tf.nn.relu(y)
    if activation == "gelu":
        return gelu(y)
    if activation == "tanh":
        return tf.tanh(y)
    if activation is not None:
        raise ValueError(f"unknown activation {activation!r}")
    return y


def gelu(x: tf.Tensor) -> tf.Tensor:
    """The tanh approximation of GELU, written out as in the original BERT code."""
    cdf = 0.5 * (1.0 + tf.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * tf.pow(x, 3))))
    return x * cdf


def layer_norm(x: tf.Tensor, name: str, epsilon: float = 1e-12) -> tf.Tensor:
    """Layer normalization over the last axis with learned scale and offset."""
    with tf.compat.v1.variable_scope(name):
        width = int(x.shape[-1])
        gamma = variable("gamma", [width], tf.compat.v1.ones_initializer())
        beta = variable("beta", [width])
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + epsilon) * gamma + beta


def embedding(
    ids: tf.Tensor,
    vocab_size: int,
    width: int,
    name: str,
    *,
    initializer: Initializer,
) -> tuple[tf.Tensor, tf.Variable]:
    """Look ``ids`` up in a ``[vocab_size, width]`` table; returns rows and table."""
    table = variable(name, [vocab_size, width], initializer)
    return tf.gather(table, ids), table


def attention(
    query_in: tf.Tensor,
    memory_in: tf.Tensor,
    *,
    seq_q: int,
    seq_k: int,
    heads: int,
    initializer: Initializer,
    mask: tf.Tensor | None = None,
) -> tf.Tensor:
    """Multi-head scaled dot-product attention on 2-D ``[batch*seq, width]`` inputs.

    Q, K and V are separate dense layers (``query``, ``key``, ``value``); the
    scores are a BatchMatMul over ``[batch, heads, seq, head_width]``. ``mask``
    (``[seq_q, seq_k]``, 1 = attend) is added as a large negative bias where 0.
    Returns the 2-D context, before the caller's output projection.
    """
    width = int(query_in.shape[-1])
    head_width = width // heads

    def split_heads(x: tf.Tensor, seq: int) -> tf.Tensor:
        x = tf.reshape(x, [-1, seq, heads, head_width])
        return tf.transpose(x, [0, 2, 1, 3])

    q = split_heads(dense(query_in, width, "query", initializer=initializer), seq_q)
    k = split_heads(dense(memory_in, width, "key", initializer=initializer), seq_k)
    v = split_heads(dense(memory_in, width, "value", initializer=initializer), seq_k)
    scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(head_width))
    if mask is not None:
        scores += (1.0 - mask) * -1e9
    probs = tf.nn.softmax(scores)
    context = tf.transpose(tf.matmul(probs, v), [0, 2, 1, 3])
    return tf.reshape(context, [-1, width])
