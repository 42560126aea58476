"""VGG19 (Simonyan & Zisserman 2014): 16 3x3 conv layers and three FC layers.

The standard ImageNet network with 4096-wide fully connected layers (143.7M
parameters, 548 MiB in float32), from ``tf_keras.applications.VGG19``.
"""

from __future__ import annotations

from .applications import IMAGENET_CLASSES, image_classifier
from .common import TrainGraph, build_tf1

__all__ = ["build"]

IMAGE_SIZE = 224


def build(batch_size: int) -> TrainGraph:
    """VGG19 training step on ``batch_size`` 224x224 RGB images."""
    return build_tf1(
        lambda: image_classifier("VGG19", batch_size, IMAGE_SIZE),
        config={"image_size": IMAGE_SIZE, "classes": IMAGENET_CLASSES, "source": "tf_keras"},
    )
