"""ImageNet classifiers from ``tf_keras.applications`` built in TF1 graph mode.

The Keras reference architectures are built on a fixed-size ``images``
placeholder with random initial weights (``weights=None``) and the learning
phase set to training, so batch normalization normalizes with batch statistics
(``FusedBatchNormV3`` with ``is_training``) and its moving-average updates come
back as ``Forward.updates``. Layers created this way use resource variables.
"""

from __future__ import annotations

import warnings

import tensorflow as tf

from .common import Forward, mean_xent, placeholder

__all__ = ["IMAGENET_CLASSES", "image_classifier"]

IMAGENET_CLASSES = 1000


def image_classifier(app_name: str, batch: int, image_size: int) -> Forward:
    """Forward pass of ``tf_keras.applications.<app_name>`` on ``[batch, s, s, 3]``."""
    import tf_keras

    images = placeholder("images", tf.float32, [batch, image_size, image_size, 3])
    labels = placeholder("labels", tf.int32, [batch])
    app = getattr(tf_keras.applications, app_name)
    # The learning-phase scope is deprecated for eager code but is the way to
    # build a graph-mode functional model in training mode without a symbolic
    # learning-phase placeholder and Switch/Merge around every batch norm.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        with tf_keras.backend.learning_phase_scope(1):
            model = app(
                weights=None,
                input_tensor=images,
                classes=IMAGENET_CLASSES,
                classifier_activation=None,
            )
    return Forward(
        inputs=[images, labels],
        loss=mean_xent(model.output, labels),
        updates=list(model.updates),
        value_ranges={"labels": IMAGENET_CLASSES},
    )
