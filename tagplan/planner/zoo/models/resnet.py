"""ResNet-101 (He et al. 2016): bottleneck blocks [3, 4, 23, 3] with batch norm.

From ``tf_keras.applications.ResNet101`` (v1 layout: batch norm after each
convolution; the Keras convolutions carry a bias, unlike tf-slim's).
"""

from __future__ import annotations

from .applications import IMAGENET_CLASSES, image_classifier
from .common import TrainGraph, build_tf1

__all__ = ["build"]

IMAGE_SIZE = 224


def build(batch_size: int) -> TrainGraph:
    """ResNet-101 training step on ``batch_size`` 224x224 RGB images."""
    return build_tf1(
        lambda: image_classifier("ResNet101", batch_size, IMAGE_SIZE),
        config={"image_size": IMAGE_SIZE, "classes": IMAGENET_CLASSES, "source": "tf_keras"},
    )
