"""Disjoint sets over ``0..size-1``: ops that must share a device or a group."""

from __future__ import annotations

import numpy as np

__all__ = ["UnionFind"]


class UnionFind:
    """Union-find with path halving; :meth:`labels` numbers the sets densely."""

    def __init__(self, size: int) -> None:
        self.parent = list(range(size))

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)

    def labels(self) -> np.ndarray:
        """Set id per element, 0..k-1, numbered by the sets' smallest representative."""
        roots = [self.find(x) for x in range(len(self.parent))]
        return np.unique(roots, return_inverse=True)[1].astype(np.int32)
