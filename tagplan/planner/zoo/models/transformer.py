"""Encoder-decoder Transformer (Vaswani et al. 2017) for translation.

The base architecture: 6 encoder and 6 decoder layers, d_model 512, 8 heads,
feed-forward width 2048, ReLU, post-LN, sinusoidal positions, embeddings scaled
by sqrt(d_model). Source embedding, target embedding and the pre-softmax
projection are separate matrices (no weight tying).

The vocabulary size is the one free knob once the base architecture is fixed:
40,000 sub-word units puts the parameters at ~403 MiB, within 1% of the 407 MiB
TAG reports (the 37,000-token WMT En-De vocabulary of the paper would give
385 MiB). A batch is 480 sentence pairs of 50 tokens each side, ~24k tokens,
close to the ~25k source tokens per batch of the original training setup.

No dropout and no label smoothing, so a step is deterministic and a distributed
version of the graph can be checked against the original; no padding mask
(every sentence fills its 50 tokens).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import tensorflow as tf

from .common import Forward, TrainGraph, build_tf1, mean_xent, placeholder
from .layers import Initializer, attention, dense, embedding, layer_norm

__all__ = ["TRANSFORMER_BASE", "TransformerConfig", "build"]


@dataclass(frozen=True)
class TransformerConfig:
    """Architecture and input sizes of the Transformer."""

    vocab_size: int = 40000
    d_model: int = 512
    heads: int = 8
    ffn: int = 2048
    encoder_layers: int = 6
    decoder_layers: int = 6
    seq_len: int = 50


TRANSFORMER_BASE = TransformerConfig()


def _positional_encoding(seq: int, width: int) -> tf.Tensor:
    """Sinusoidal position signal ``[seq, width]`` (sin half, then cos half).

    Computed with a handful of ops rather than stored as a constant tensor.
    """
    position = tf.cast(tf.range(seq), tf.float32)[:, None]
    inv_freq = tf.exp(tf.cast(tf.range(0, width, 2), tf.float32) * (-math.log(10000.0) / width))
    angles = position * inv_freq[None, :]
    return tf.concat([tf.sin(angles), tf.cos(angles)], axis=1)


def _embed(ids: tf.Tensor, cfg: TransformerConfig, name: str) -> tf.Tensor:
    """Scaled token embedding plus position signal, flattened to 2-D."""
    init = tf.compat.v1.random_normal_initializer(stddev=cfg.d_model**-0.5)
    x, _ = embedding(ids, cfg.vocab_size, cfg.d_model, name, initializer=init)
    x = x * math.sqrt(cfg.d_model) + _positional_encoding(cfg.seq_len, cfg.d_model)
    return tf.reshape(x, [-1, cfg.d_model])


def _sublayer_attention(
    x: tf.Tensor,
    memory: tf.Tensor,
    cfg: TransformerConfig,
    init: Initializer,
    name: str,
    mask: tf.Tensor | None = None,
) -> tf.Tensor:
    """Attention, output projection, residual and layer norm."""
    with tf.compat.v1.variable_scope(name):
        context = attention(
            x,
            memory,
            seq_q=cfg.seq_len,
            seq_k=cfg.seq_len,
            heads=cfg.heads,
            initializer=init,
            mask=mask,
        )
        out = dense(context, cfg.d_model, "output", initializer=init)
        return layer_norm(x + out, "layer_norm", epsilon=1e-6)


def _sublayer_ffn(x: tf.Tensor, cfg: TransformerConfig, init: Initializer) -> tf.Tensor:
    """ReLU feed-forward network, residual and layer norm."""
    with tf.compat.v1.variable_scope("ffn"):
        h = dense(x, cfg.ffn, "dense_1", initializer=init, activation="relu")
        h = dense(h, cfg.d_model, "dense_2", initializer=init)
        return layer_norm(x + h, "layer_norm", epsilon=1e-6)


def _forward(cfg: TransformerConfig, batch: int) -> Forward:
    """Teacher-forced translation loss over every target position."""
    seq = cfg.seq_len
    source = placeholder("source_tokens", tf.int32, [batch, seq])
    target = placeholder("target_tokens", tf.int32, [batch, seq])
    labels = placeholder("labels", tf.int32, [batch, seq])
    init = tf.compat.v1.glorot_uniform_initializer()

    with tf.compat.v1.variable_scope("encoder"):
        x = _embed(source, cfg, "embedding")
        for i in range(cfg.encoder_layers):
            with tf.compat.v1.variable_scope(f"layer_{i}"):
                x = _sublayer_attention(x, x, cfg, init, "self_attention")
                x = _sublayer_ffn(x, cfg, init)
    memory = x

    with tf.compat.v1.variable_scope("decoder"):
        causal = tf.linalg.band_part(tf.ones([seq, seq]), -1, 0)
        y = _embed(target, cfg, "embedding")
        for i in range(cfg.decoder_layers):
            with tf.compat.v1.variable_scope(f"layer_{i}"):
                y = _sublayer_attention(y, y, cfg, init, "self_attention", mask=causal)
                y = _sublayer_attention(y, memory, cfg, init, "encdec_attention")
                y = _sublayer_ffn(y, cfg, init)

    with tf.compat.v1.variable_scope("softmax"):
        logits = dense(y, cfg.vocab_size, "logits", initializer=init)
    loss = mean_xent(logits, tf.reshape(labels, [-1]))
    return Forward(
        inputs=[source, target, labels],
        loss=loss,
        value_ranges={n: cfg.vocab_size for n in ("source_tokens", "target_tokens", "labels")},
    )


def build(cfg: TransformerConfig, batch_size: int) -> TrainGraph:
    """The training step of ``cfg`` at ``batch_size`` sentence pairs."""
    return build_tf1(lambda: _forward(cfg, batch_size), config=asdict(cfg))
