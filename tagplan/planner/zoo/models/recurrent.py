"""A GNMT-style sequence-to-sequence model: LSTM encoder and decoder, statically unrolled,
with embeddings and Luong attention (Wu et al. 2016, scaled down).

Every time step reads the same weights, so each weight's gradient is the sum of one
partial gradient per step (TensorFlow's ``AddN`` before the update): the structure that
recurrent models give a planner. The LSTM cell is written out (``[x, h] @ W + b`` split
into the four gates) so node names stay readable and nothing depends on Keras' cell
implementation. Embedding gradients are densified like every zoo model's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import tensorflow as tf

from .common import Forward, TrainGraph, build_tf1, mean_xent, placeholder
from .layers import embedding, variable

__all__ = ["GNMT_SMALL", "TINY_LSTM", "Seq2SeqConfig", "build"]


@dataclass(frozen=True)
class Seq2SeqConfig:
    vocab_size: int
    width: int  # embedding and LSTM units
    layers: int  # LSTM layers in the encoder and in the decoder
    source_steps: int
    target_steps: int


GNMT_SMALL = Seq2SeqConfig(vocab_size=16000, width=512, layers=2, source_steps=20, target_steps=20)
TINY_LSTM = Seq2SeqConfig(vocab_size=64, width=16, layers=1, source_steps=4, target_steps=3)


def _lstm_step(
    x: tf.Tensor, state: tuple[tf.Tensor, tf.Tensor], kernel: tf.Tensor, bias: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """One LSTM step (forget-gate bias of 1, as TensorFlow's LSTM cells add)."""
    c, h = state
    gates = tf.nn.bias_add(tf.matmul(tf.concat([x, h], axis=1), kernel), bias)
    i, g, f, o = tf.split(gates, 4, axis=1)
    c = tf.sigmoid(f + 1.0) * c + tf.sigmoid(i) * tf.tanh(g)
    return c, tf.sigmoid(o) * tf.tanh(c)


def _lstm_stack(
    inputs: list[tf.Tensor], name: str, config: Seq2SeqConfig, init: object
) -> list[tf.Tensor]:
    """``config.layers`` LSTM layers over the steps ``inputs``; the top layer's outputs."""
    batch, width = int(inputs[0].shape[0]), config.width
    outputs = inputs
    for layer in range(config.layers):
        with tf.compat.v1.variable_scope(f"{name}/layer_{layer}"):
            kernel = variable("kernel", [int(outputs[0].shape[1]) + width, 4 * width], init)
            bias = variable("bias", [4 * width])
        state = (tf.zeros([batch, width]), tf.zeros([batch, width]))
        steps = []
        for x in outputs:
            state = _lstm_step(x, state, kernel, bias)
            steps.append(state[1])
        outputs = steps
    return outputs


def _forward(config: Seq2SeqConfig, batch: int) -> Forward:
    source = placeholder("source_ids", tf.int32, [batch, config.source_steps])
    target_in = placeholder("target_in_ids", tf.int32, [batch, config.target_steps])
    target_out = placeholder("target_out_ids", tf.int32, [batch, config.target_steps])
    init = tf.compat.v1.glorot_uniform_initializer()
    width = config.width
    source_vectors, _ = embedding(
        source, config.vocab_size, width, "source_embedding", initializer=init
    )
    target_vectors, _ = embedding(
        target_in, config.vocab_size, width, "target_embedding", initializer=init
    )
    encoded = _lstm_stack(tf.unstack(source_vectors, axis=1), "encoder", config, init)
    memory = tf.stack(encoded, axis=1)  # [batch, source_steps, width]
    decoded = _lstm_stack(tf.unstack(target_vectors, axis=1), "decoder", config, init)
    with tf.compat.v1.variable_scope("attention"):
        score_kernel = variable("score_kernel", [width, width], init)
        output_kernel = variable("output_kernel", [2 * width, width], init)
    with tf.compat.v1.variable_scope("softmax"):
        logits_kernel = variable("kernel", [width, config.vocab_size], init)
        logits_bias = variable("bias", [config.vocab_size])
    logits = []
    for h in decoded:  # Luong's general score, then the attentional hidden state
        query = tf.expand_dims(tf.matmul(h, score_kernel), 2)  # [batch, width, 1]
        weights = tf.nn.softmax(tf.squeeze(tf.matmul(memory, query), 2))  # [batch, steps]
        context = tf.squeeze(tf.matmul(tf.expand_dims(weights, 1), memory), 1)
        attended = tf.tanh(tf.matmul(tf.concat([context, h], axis=1), output_kernel))
        logits.append(tf.nn.bias_add(tf.matmul(attended, logits_kernel), logits_bias))
    return Forward(
        inputs=[source, target_in, target_out],
        loss=mean_xent(tf.stack(logits, axis=1), target_out),
        value_ranges={
            name: config.vocab_size for name in ("source_ids", "target_in_ids", "target_out_ids")
        },
    )


def build(config: Seq2SeqConfig, batch_size: int) -> TrainGraph:
    """The model as a TF1 training graph with Adam."""
    return build_tf1(lambda: _forward(config, batch_size), config=asdict(config))
