"""TensorFlow, loaded only where a step runs it: it is an optional dependency
(``tagplan[tf]``), so the engine, the workers and the API start without it."""

from __future__ import annotations

import os
from typing import Any

from tagplan.planner.errors import InvalidInput

__all__ = ["import_tensorflow"]


def import_tensorflow(missing: str) -> Any:
    """The ``tensorflow`` module (its C++ logging down to warnings); an :class:`InvalidInput`
    saying ``missing`` when it is not installed."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise InvalidInput(missing) from exc
    return tf
