"""A wide-and-deep recommender (Cheng et al. 2016): one categorical id per feature looked
up in an embedding table of its own (the deep part) and in a per-class weight table (the
wide, linear part), a dense tower over the embeddings and the continuous features.

The tables hold almost all of the parameters, and each step touches only the rows of the
batch's ids: the gradients stay ``IndexedSlices``, and TF1's Adam updates a table by
scattering those rows into its slots before assigning the whole table, the structure of
every recommendation model a planner meets (sparse parameters, docs/design.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import tensorflow as tf

from .common import Forward, TrainGraph, build_tf1, mean_xent, placeholder
from .layers import dense, embedding

__all__ = ["TINY_WIDE_DEEP", "WIDE_DEEP", "WideDeepConfig", "build"]


@dataclass(frozen=True)
class WideDeepConfig:
    vocab_sizes: tuple[int, ...]  # rows of each categorical feature's tables
    width: int  # embedding width of the deep part
    dense_features: int
    hidden: tuple[int, ...]  # units of the dense tower's layers
    classes: int


WIDE_DEEP = WideDeepConfig(
    vocab_sizes=(1_000_000, 500_000, 200_000, 100_000, 100_000, 100_000, 100_000, 100_000),
    width=32,
    dense_features=13,
    hidden=(1024, 512, 256),
    classes=2,
)
TINY_WIDE_DEEP = WideDeepConfig(
    vocab_sizes=(50, 40, 30), width=4, dense_features=3, hidden=(16,), classes=2
)


def _forward(config: WideDeepConfig, batch: int) -> Forward:
    init = tf.compat.v1.glorot_uniform_initializer()
    ids = [placeholder(f"feature_{i}", tf.int32, [batch]) for i in range(len(config.vocab_sizes))]
    continuous = placeholder("dense_features", tf.float32, [batch, config.dense_features])
    labels = placeholder("labels", tf.int32, [batch])
    deep, wide = [continuous], []
    for i, (x, vocab) in enumerate(zip(ids, config.vocab_sizes, strict=True)):
        rows, _ = embedding(x, vocab, config.width, f"deep/embedding_{i}", initializer=init)
        weights, _ = embedding(x, vocab, config.classes, f"wide/weights_{i}", initializer=init)
        deep.append(rows)
        wide.append(weights)
    hidden = tf.concat(deep, axis=1)
    for layer, units in enumerate(config.hidden):
        hidden = dense(hidden, units, f"deep/hidden_{layer}", initializer=init, activation="relu")
    logits = dense(hidden, config.classes, "deep/logits", initializer=init) + tf.add_n(wide)
    ranges = {f"feature_{i}": vocab for i, vocab in enumerate(config.vocab_sizes)}
    return Forward(
        inputs=[*ids, continuous, labels],
        loss=mean_xent(logits, labels),
        value_ranges={**ranges, "labels": config.classes},
    )


def build(config: WideDeepConfig, batch_size: int) -> TrainGraph:
    """The model as a TF1 training graph with Adam, its table gradients left sparse."""
    return build_tf1(
        lambda: _forward(config, batch_size), config=asdict(config), sparse_gradients=True
    )
