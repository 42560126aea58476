"""Index arithmetic over compressed rows (an offsets array ``ptr`` whose row ``r`` is
``ptr[r]:ptr[r + 1]``): the graph's inputs and control edges, a placement's instances, a
task graph's successors and buffer readers."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["distinct_pairs_csr", "row_ranges", "stable_order"]

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
    rows = _in_range(rows, num_rows, "rows")
    cols = np.ascontiguousarray(cols, dtype=np.int64)
    if len(rows) != len(cols):
        raise ValueError("rows and cols differ in length")
    return _distinct_pairs_csr(rows, cols, num_rows)


def stable_order(keys, num_keys: int) -> np.ndarray:
    """The order of ``keys`` (integers in ``[0, num_keys)``) ascending, equal keys in their
    own order: a counting sort, linear where a comparison sort is not (what
    ``np.argsort(keys, kind="stable")`` gives)."""
    return _counting_sort(_in_range(keys, num_keys, "keys"), num_keys)[0]


def _in_range(values, limit: int, name: str) -> np.ndarray:
    """``values`` as int64, checked to lie in ``[0, limit)``: the kernels index by them
    unchecked."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    if len(values) and (values.min() < 0 or values.max() >= limit):
        raise ValueError(f"{name} must lie in [0, {limit})")
    return values


@njit(cache=True)
def _counting_sort(keys: np.ndarray, num_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """The stable ascending order of ``keys`` and where each key's run starts in it."""
    start = np.zeros(num_keys + 1, dtype=np.int64)
    for k in keys:
        start[k + 1] += 1
    for k in range(num_keys):
        start[k + 1] += start[k]
    filled = start[:-1].copy()
    order = np.empty(len(keys), dtype=np.int64)
    for i in range(len(keys)):
        order[filled[keys[i]]] = i
        filled[keys[i]] += 1
    return order, start


@njit(cache=True)
def _distinct_pairs_csr(
    rows: np.ndarray, cols: np.ndarray, num_rows: int
) -> tuple[np.ndarray, np.ndarray]:
    order, start = _counting_sort(rows, num_rows)
    bucketed = np.empty(len(cols), dtype=np.int32)
    for i in range(len(order)):
        bucketed[i] = cols[order[i]]
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
