"""BERT pre-training graphs (Devlin et al. 2018): BERT-Small and BERT-Large.

A compact re-statement of google-research/bert's ``modeling.py`` and
``run_pretraining.py`` heads in TF1 ops: word + segment + position embeddings,
post-LN encoder layers (self-attention, GELU feed-forward), a tanh pooler, the
masked-LM head tied to the word embeddings and the next-sentence head.

Simplifications that do not change the architecture or parameter count: no
dropout (a step is deterministic, so a distributed version of the graph can be
checked against the original), no padding mask (every token is real) and every
masked position counts in the loss.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import tensorflow as tf

from .common import Forward, TrainGraph, build_tf1, mean_xent, placeholder
from .layers import Initializer, attention, dense, embedding, layer_norm, variable

__all__ = ["BERT_LARGE", "BERT_SMALL", "BertConfig", "build"]


@dataclass(frozen=True)
class BertConfig:
    """Architecture and input sizes of one BERT variant."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    vocab_size: int = 30522
    max_position: int = 512
    type_vocab_size: int = 2
    seq_len: int = 128
    max_predictions: int = 20


# BERT-Small as released with the BERT miniatures (L=4, H=512, A=8).
BERT_SMALL = BertConfig(layers=4, hidden=512, heads=8, intermediate=2048)
# BERT-Large (L=24, H=1024, A=16).
BERT_LARGE = BertConfig(layers=24, hidden=1024, heads=16, intermediate=4096)


def _encoder_layer(x: tf.Tensor, cfg: BertConfig, init: Initializer) -> tf.Tensor:
    """One post-LN transformer encoder layer on a ``[batch*seq, hidden]`` input."""
    with tf.compat.v1.variable_scope("attention"):
        with tf.compat.v1.variable_scope("self"):
            context = attention(
                x, x, seq_q=cfg.seq_len, seq_k=cfg.seq_len, heads=cfg.heads, initializer=init
            )
        with tf.compat.v1.variable_scope("output"):
            out = dense(context, cfg.hidden, "dense", initializer=init)
            x = layer_norm(out + x, "LayerNorm")
    with tf.compat.v1.variable_scope("intermediate"):
        h = dense(x, cfg.intermediate, "dense", initializer=init, activation="gelu")
    with tf.compat.v1.variable_scope("output"):
        h = dense(h, cfg.hidden, "dense", initializer=init)
        return layer_norm(h + x, "LayerNorm")


def _forward(cfg: BertConfig, batch: int) -> Forward:
    """Placeholders, encoder and the two pre-training losses (MLM + NSP)."""
    seq, hidden = cfg.seq_len, cfg.hidden
    tokens = placeholder("tokens", tf.int32, [batch, seq])
    segment_ids = placeholder("segment_ids", tf.int32, [batch, seq])
    positions = placeholder("masked_positions", tf.int32, [batch, cfg.max_predictions])
    masked_labels = placeholder("masked_labels", tf.int32, [batch, cfg.max_predictions])
    nsp_labels = placeholder("next_sentence_labels", tf.int32, [batch])
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.02)

    with tf.compat.v1.variable_scope("bert"):
        with tf.compat.v1.variable_scope("embeddings"):
            words, word_table = embedding(
                tokens, cfg.vocab_size, hidden, "word_embeddings", initializer=init
            )
            types, _ = embedding(
                segment_ids, cfg.type_vocab_size, hidden, "token_type_embeddings", initializer=init
            )
            position_table = variable("position_embeddings", [cfg.max_position, hidden], init)
            x = words + types + tf.slice(position_table, [0, 0], [seq, -1])
            x = tf.reshape(layer_norm(x, "LayerNorm"), [-1, hidden])
        with tf.compat.v1.variable_scope("encoder"):
            for i in range(cfg.layers):
                with tf.compat.v1.variable_scope(f"layer_{i}"):
                    x = _encoder_layer(x, cfg, init)
        sequence_output = tf.reshape(x, [-1, seq, hidden])
        with tf.compat.v1.variable_scope("pooler"):
            first_token = tf.squeeze(sequence_output[:, 0:1, :], axis=1)
            pooled = dense(first_token, hidden, "dense", initializer=init, activation="tanh")

    with tf.compat.v1.variable_scope("cls/predictions"):
        picked = tf.gather(sequence_output, positions, batch_dims=1)
        picked = tf.reshape(picked, [-1, hidden])
        with tf.compat.v1.variable_scope("transform"):
            t = dense(picked, hidden, "dense", initializer=init, activation="gelu")
            t = layer_norm(t, "LayerNorm")
        output_bias = variable("output_bias", [cfg.vocab_size])
        logits = tf.nn.bias_add(tf.matmul(t, word_table, transpose_b=True), output_bias)
        mlm_loss = mean_xent(logits, tf.reshape(masked_labels, [-1]))
    with tf.compat.v1.variable_scope("cls/seq_relationship"):
        weights = variable("output_weights", [2, hidden], init)
        bias = variable("output_bias", [2])
        nsp_logits = tf.nn.bias_add(tf.matmul(pooled, weights, transpose_b=True), bias)
        nsp_loss = mean_xent(nsp_logits, nsp_labels)

    return Forward(
        inputs=[tokens, segment_ids, positions, masked_labels, nsp_labels],
        loss=mlm_loss + nsp_loss,
        value_ranges={
            "tokens": cfg.vocab_size,
            "segment_ids": cfg.type_vocab_size,
            "masked_positions": seq,
            "masked_labels": cfg.vocab_size,
            "next_sentence_labels": 2,
        },
    )


def build(cfg: BertConfig, batch_size: int) -> TrainGraph:
    """The pre-training step of ``cfg`` at ``batch_size`` sequences."""
    return build_tf1(lambda: _forward(cfg, batch_size), config=asdict(cfg))
