"""ResNet-101 (He et al. 2016): bottleneck blocks [3, 4, 23, 3] with batch norm.

From ``tf_keras.applications.ResNet101`` (v1 layout: batch norm after each
convolution; the Keras convolutions carry a bias, unlike tf-slim's).
"""

from __future__ import annotations

from .applications import IMAGENET_CLASSES, image_classifier
from .common import TrainGraph, build_tf1

__all__ = ["build"]

IMAGE_SIZE = 224


def build(batch_size: int, image_size: int = IMAGE_SIZE) -> TrainGraph:
    """ResNet-101 training step on ``batch_size`` RGB images of ``image_size`` pixels."""
    return build_tf1(
        lambda: image_classifier("ResNet101", batch_size, image_size),
        config={"image_size": image_size, "classes": IMAGENET_CLASSES, "source": "tf_keras"},
    )
