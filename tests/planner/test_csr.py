"""Index arithmetic over compressed rows, against the loop it replaces."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.csr import distinct_pairs_csr, row_ranges, stable_order


def test_row_ranges_concatenates_each_rows_indices_in_the_order_asked() -> None:
    ptr = np.array([0, 3, 3, 7, 8, 12])
    rows = np.array([3, 0, 1, 4, 0, 2])
    indices, lengths = row_ranges(ptr, rows)
    expected = np.concatenate([np.arange(ptr[r], ptr[r + 1]) for r in rows])
    assert indices.tolist() == expected.tolist()
    assert lengths.tolist() == [1, 3, 0, 4, 3, 4]


def test_no_rows_give_no_indices() -> None:
    indices, lengths = row_ranges(np.array([0, 2, 5]), np.array([], dtype=np.int64))
    assert indices.tolist() == [] and lengths.tolist() == []


def _pairs_by_row(ptr: np.ndarray, cols: np.ndarray) -> list[list[int]]:
    return [cols[ptr[r] : ptr[r + 1]].tolist() for r in range(len(ptr) - 1)]


def test_distinct_pairs_are_each_rows_sorted_set_of_columns() -> None:
    rng = np.random.default_rng(7)
    num_rows = 40
    rows = rng.integers(0, num_rows, 3000)
    rows[:200] = 5  # a row of many columns, sorted another way than the short ones
    cols = rng.integers(0, 60, 3000)
    ptr, distinct = distinct_pairs_csr(rows, cols, num_rows)
    assert ptr.dtype == np.int32 and distinct.dtype == np.int32
    expected = [
        sorted({int(c) for r, c in zip(rows, cols, strict=True) if r == row})
        for row in range(num_rows)
    ]
    assert _pairs_by_row(ptr, distinct) == expected


def test_rows_without_pairs_are_empty_and_no_pairs_give_an_empty_csr() -> None:
    ptr, cols = distinct_pairs_csr([3, 0, 3, 3], [2, 9, 2, 1], 5)
    assert _pairs_by_row(ptr, cols) == [[9], [], [], [1, 2], []]
    ptr, cols = distinct_pairs_csr([], [], 3)
    assert ptr.tolist() == [0, 0, 0, 0] and cols.tolist() == []


def test_stable_order_is_numpys_stable_argsort() -> None:
    keys = np.random.default_rng(3).integers(0, 25, 4000)
    assert stable_order(keys, 30).tolist() == np.argsort(keys, kind="stable").tolist()
    assert stable_order(np.array([], dtype=np.int32), 0).tolist() == []


def test_keys_out_of_range_are_refused_before_the_kernels_index_by_them() -> None:
    with pytest.raises(ValueError, match=r"rows must lie in \[0, 3\)"):
        distinct_pairs_csr([0, 3], [1, 1], 3)
    with pytest.raises(ValueError, match=r"keys must lie in \[0, 4\)"):
        stable_order([2, -1], 4)
