"""Index arithmetic over compressed rows (an offsets array ``ptr`` whose row ``r`` is
``ptr[r]:ptr[r + 1]``): the graph's inputs and control edges, a placement's instances, a
task graph's successors and buffer readers."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["distinct_pairs_csr", "row_ranges"]

_INSERTION_MOST = 16  # rows of at most this many columns are sorted in place


def row_ranges(ptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ``arange(ptr[r], ptr[r + 1])`` over ``rows``, and each one's length."""
    lengths = ptr[rows + 1] - ptr[rows]
    offsets = np.repeat(ptr[rows] - np.cumsum(lengths) + lengths, lengths)
    return offsets + np.arange(int(lengths.sum())), lengths


def distinct_pairs_csr(rows, cols, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR (int32 pointer, int32 columns) of the distinct ``(row, col)`` pairs, each row's
    columns in ascending order; ``rows`` in ``[0, num_rows)``, ``cols`` non-negative.

    A counting sort by row, then each row's few columns sorted and their repeats dropped:
    linear in the pairs where a sort of them all is not (a task graph's edges and reads
    number about a million on 64 GPUs, and a search builds one graph per strategy)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    cols = np.ascontiguousarray(cols, dtype=np.int64)
    if len(rows) != len(cols):
        raise ValueError("rows and cols differ in length")
    return _distinct_pairs_csr(rows, cols, num_rows)


@njit(cache=True)
def _distinct_pairs_csr(
    rows: np.ndarray, cols: np.ndarray, num_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    start = np.zeros(num_rows + 1, dtype=np.int64)
    for r in rows:
        start[r + 1] += 1
    for r in range(num_rows):
        start[r + 1] += start[r]
    filled = start[:-1].copy()
    bucketed = np.empty(len(cols), dtype=np.int32)
    for i in range(len(rows)):
        r = rows[i]
        bucketed[filled[r]] = cols[i]
        filled[r] += 1
    ptr = np.zeros(num_rows + 1, dtype=np.int32)
    kept = 0
    for r in range(num_rows):
        lo, hi = start[r], start[r + 1]
        if hi - lo > _INSERTION_MOST:
            bucketed[lo:hi] = np.sort(bucketed[lo:hi])
        else:
            for i in range(lo + 1, hi):  # an insertion sort: a row holds a few columns
                col, j = bucketed[i], i
                while j > lo and bucketed[j - 1] > col:
                    bucketed[j] = bucketed[j - 1]
                    j -= 1
                bucketed[j] = col
        for i in range(lo, hi):
            if i == lo or bucketed[i] != bucketed[i - 1]:
                bucketed[kept] = bucketed[i]
                kept += 1
        ptr[r + 1] = kept
    return ptr, bucketed[:kept].copy()
