"""Index arithmetic over compressed rows, against the loop it replaces."""

from __future__ import annotations

import numpy as np

from tagplan.planner.csr import row_ranges


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
