"""Inception-v3 (Szegedy et al. 2016) on 299x299 images, with batch norm.

From ``tf_keras.applications.InceptionV3``: bias-free convolutions followed by
batch norm without scale, the 11 Inception blocks, no auxiliary classifier.
"""

from __future__ import annotations

from .applications import IMAGENET_CLASSES, image_classifier
from .common import TrainGraph, build_tf1

__all__ = ["build"]

IMAGE_SIZE = 299


def build(batch_size: int, image_size: int = IMAGE_SIZE) -> TrainGraph:
    """Inception-v3 training step on ``batch_size`` RGB images of ``image_size`` pixels."""
    return build_tf1(
        lambda: image_classifier("InceptionV3", batch_size, image_size),
        config={"image_size": image_size, "classes": IMAGENET_CLASSES, "source": "tf_keras"},
    )
