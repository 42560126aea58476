"""Input functions for ``tagplan run --input`` in the tests: the batch a test wrote."""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np

BATCH_FILE = "TAGPLAN_TEST_BATCH"
"""Environment variable naming the ``.npz`` file of the batch to train on."""


def repeated() -> Iterator[dict[str, np.ndarray]]:
    """The batch of ``$TAGPLAN_TEST_BATCH``, at every step."""
    with np.load(os.environ[BATCH_FILE]) as stored:
        batch = {name: stored[name] for name in stored.files}
    while True:
        yield batch
