"""Index arithmetic over compressed rows (an offsets array ``ptr`` whose row ``r`` is
``ptr[r]:ptr[r + 1]``): the graph's inputs and control edges, a placement's instances."""

from __future__ import annotations

import numpy as np

__all__ = ["row_ranges"]


def row_ranges(ptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ``arange(ptr[r], ptr[r + 1])`` over ``rows``, and each one's length."""
    lengths = ptr[rows + 1] - ptr[rows]
    offsets = np.repeat(ptr[rows] - np.cumsum(lengths) + lengths, lengths)
    return offsets + np.arange(int(lengths.sum())), lengths
