"""Canonical cluster fingerprint: the same for every naming and numbering of one cluster.

Strategies are cached by (graph, cluster). A scheduler may hand the same shape of
allocation with machines renamed or listed in another order, or with other GPU
indices; the fingerprint ignores all of that and changes with anything that changes
performance: a GPU type or its figures, a GPU count, a bandwidth or a latency.

Method. A machine is described by its invariant (GPU types with counts, intra-machine
bandwidth and latency); two machines by their link (bandwidth, latency). With link
overrides this is a complete edge-weighted, vertex-coloured graph, and a canonical
machine order is a canonical labelling of it:

1. colour machines by invariant, then refine colours Weisfeiler-Lehman style by the
   sorted multiset of (link, neighbour colour) until stable;
2. while a colour class has several machines, individualize each candidate in turn
   and refine again (individualization-refinement); keep the order whose link matrix
   is lexicographically smallest.

Two machines with the same invariant and the same links to every other machine
("twins") can be swapped without changing anything, so only one twin per class is
tried, and a class made only of twins is ordered at once. This makes the common cases
(identical machines on one switch, a few overrides) a single leaf. The search stops
after ``max_leaves`` leaves; past that the order is still deterministic but
isomorphic clusters might get different fingerprints (a cache miss, never a wrong
hit: the fingerprint encodes the whole cluster, so equal fingerprints always mean
equal clusters up to naming). :attr:`CanonicalOrder.exact` says whether that happened.

Inside a machine, GPUs of one type are interchangeable (one intra-machine bandwidth),
so canonical devices follow canonical machines, then type name, then GPU index.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInput
from .cluster import Cluster

__all__ = [
    "DEFAULT_MAX_LEAVES",
    "FINGERPRINT_FORMAT",
    "CanonicalOrder",
    "canonical_order",
    "fingerprint",
    "map_devices",
    "map_groups",
    "twin_machines",
]

FINGERPRINT_FORMAT = "tagplan.topology.fingerprint/3"
"""Hashed with the canonical form; bump it when the encoding changes."""
DEFAULT_MAX_LEAVES = 2048
"""Leaves of the individualization-refinement search before settling (see module doc)."""


@dataclass(frozen=True, eq=False)
class CanonicalOrder:
    """A cluster's canonical numbering and fingerprint.

    ``x_to_canonical[i]`` is the canonical number of the caller's machine, device or
    group ``i``; the ``canonical_to_x`` properties are the inverse permutations. A
    strategy stored in canonical numbering is remapped to another cluster with the same
    fingerprint through ``other.canonical_to_device[self.device_to_canonical]``
    (:func:`map_devices`).
    """

    fingerprint: str
    machine_to_canonical: np.ndarray
    """(M,) int64."""
    device_to_canonical: np.ndarray
    """(D,) int64."""
    group_to_canonical: np.ndarray
    """(G,) int64."""
    exact: bool
    """False when the search hit ``max_leaves`` (see the module docstring)."""

    @property
    def canonical_to_machine(self) -> np.ndarray:
        """(M,) int64: the caller's machine at each canonical position."""
        return np.argsort(self.machine_to_canonical)

    @property
    def canonical_to_device(self) -> np.ndarray:
        """(D,) int64: the caller's device at each canonical position."""
        return np.argsort(self.device_to_canonical)

    @property
    def canonical_to_group(self) -> np.ndarray:
        """(G,) int64: the caller's device group at each canonical position."""
        return np.argsort(self.group_to_canonical)


def canonical_order(cluster: Cluster, *, max_leaves: int = DEFAULT_MAX_LEAVES) -> CanonicalOrder:
    """The canonical numbering of ``cluster``'s machines, devices and groups."""
    invariants = _machine_invariants(cluster)
    inv_code = _rank([invariants[m] for m in range(cluster.num_machines)])
    link_code = _link_codes(cluster)
    machine_order, exact = _canonical_machines(inv_code, link_code, max_leaves)

    machine_rank = np.empty(cluster.num_machines, dtype=np.int64)
    machine_rank[machine_order] = np.arange(cluster.num_machines)
    device_order = np.lexsort(
        (cluster.device_local_index, cluster.device_type, machine_rank[cluster.device_machine])
    )
    group_order = np.lexsort((cluster.group_type, machine_rank[cluster.group_machine]))

    payload = {
        "format": FINGERPRINT_FORMAT,
        "gpu_types": [
            [
                name,
                float(cluster.type_peak_fp32_flops[t]),
                float(cluster.type_peak_fp16_flops[t]),
                float(cluster.type_peak_tf32_flops[t]),
                bool(cluster.type_winograd[t]),
                int(cluster.type_gemm_tile[t]),
                int(cluster.type_multiprocessors[t]),
                int(cluster.type_memory_bytes[t]),
                float(cluster.type_memory_bandwidth_bytes_per_s[t]),
            ]
            for t, name in enumerate(cluster.type_names)
        ],
        "machines": [invariants[m] for m in machine_order],
        "links": [
            [
                float(cluster.machine_bandwidth_bytes_per_s[a, b]),
                float(cluster.machine_latency_s[a, b]),
            ]
            for i, a in enumerate(machine_order)
            for b in machine_order[i + 1 :]
        ],
    }
    text = json.dumps(payload, separators=(",", ":"), allow_nan=False)
    return CanonicalOrder(
        fingerprint=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        machine_to_canonical=machine_rank,
        device_to_canonical=_inverse(device_order),
        group_to_canonical=_inverse(group_order),
        exact=exact,
    )


def fingerprint(cluster: Cluster, *, max_leaves: int = DEFAULT_MAX_LEAVES) -> str:
    """Hex SHA-256 of the canonical form: equal for renamed/reordered/renumbered clusters."""
    return canonical_order(cluster, max_leaves=max_leaves).fingerprint


def twin_machines(cluster: Cluster) -> np.ndarray:
    """(M,) int64: the lowest machine each machine is a twin of (the same invariant and the
    same links to every other machine: module docstring)."""
    invariants = _machine_invariants(cluster)
    inv_code = _rank([invariants[m] for m in range(cluster.num_machines)])
    return _twin_classes(inv_code, _link_codes(cluster))


def map_devices(source: Cluster, target: Cluster) -> np.ndarray:
    """(D,) int64: for each device of ``source``, the matching device of ``target``.

    The match keeps GPU type, machine and every path figure, so a strategy for
    ``source`` runs unchanged on ``target``. Raises :class:`InvalidInput` when the two
    clusters are not the same up to naming.
    """
    a, b = _matching_orders(source, target)
    return b.canonical_to_device[a.device_to_canonical]


def map_groups(source: Cluster, target: Cluster) -> np.ndarray:
    """(G,) int64: for each device group of ``source``, the matching group of ``target``."""
    a, b = _matching_orders(source, target)
    return b.canonical_to_group[a.group_to_canonical]


def _matching_orders(source: Cluster, target: Cluster) -> tuple[CanonicalOrder, CanonicalOrder]:
    a, b = canonical_order(source), canonical_order(target)
    if a.fingerprint != b.fingerprint:
        raise InvalidInput(
            "the clusters differ (fingerprints "
            f"{a.fingerprint[:12]} and {b.fingerprint[:12]}); a strategy cannot be remapped"
        )
    return a, b


def _machine_invariants(cluster: Cluster) -> list[list[object]]:
    """Per machine: [[type, count], ...] by type name, intra bandwidth, intra latency."""
    counts = np.zeros((cluster.num_machines, cluster.num_types), dtype=np.int64)
    np.add.at(counts, (cluster.device_machine, cluster.device_type), 1)
    return [
        [
            [[cluster.type_names[t], int(counts[m, t])] for t in np.flatnonzero(counts[m])],
            float(cluster.machine_intra_bandwidth_bytes_per_s[m]),
            float(cluster.machine_intra_latency_s[m]),
        ]
        for m in range(cluster.num_machines)
    ]


def _rank(values: list[list[object]]) -> np.ndarray:
    """Dense ranks of ``values`` in sorted order (equal values share a rank)."""
    keys = [_as_tuple(v) for v in values]
    index = {k: i for i, k in enumerate(sorted(set(keys)))}
    return np.array([index[k] for k in keys], dtype=np.int64)


def _as_tuple(value: object) -> object:
    """Nested lists as nested tuples: hashable and ordered independently of input order."""
    if isinstance(value, list):
        return tuple(_as_tuple(v) for v in value)
    return value


def _link_codes(cluster: Cluster) -> np.ndarray:
    """(M, M) int64: a dense rank for each machine pair's (bandwidth, latency); -1 diagonal."""
    m = cluster.num_machines
    pairs = np.stack(
        [cluster.machine_bandwidth_bytes_per_s.ravel(), cluster.machine_latency_s.ravel()], 1
    )
    _, codes = np.unique(pairs, axis=0, return_inverse=True)
    codes = codes.reshape(m, m).astype(np.int64)
    np.fill_diagonal(codes, -1)
    return codes


def _compress(colors: np.ndarray) -> np.ndarray:
    return np.unique(colors, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _refine(colors: np.ndarray, links: np.ndarray) -> np.ndarray:
    """Weisfeiler-Lehman refinement to a stable colouring; keeps the order of classes."""
    while True:
        k = int(colors.max()) + 1
        keys = links * k + colors[None, :]
        np.fill_diagonal(keys, -1)
        signature = np.concatenate([colors[:, None], np.sort(keys, axis=1)], axis=1)
        refined = _compress_rows(signature)
        if refined.max() == colors.max():
            return refined
        colors = refined


def _compress_rows(rows: np.ndarray) -> np.ndarray:
    return np.unique(rows, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _twin_classes(colors: np.ndarray, links: np.ndarray) -> np.ndarray:
    """(M,) int64: the smallest machine each machine is a twin of (same colour, same links)."""
    m = len(colors)
    twin = np.arange(m)
    for a in range(m):
        if twin[a] != a:
            continue
        candidates = np.flatnonzero((colors == colors[a]) & (twin == np.arange(m)))
        candidates = candidates[candidates > a]
        if candidates.size == 0:
            continue
        differs = links[candidates] != links[a][None, :]
        differs[:, a] = False
        differs[np.arange(candidates.size), candidates] = False
        twin[candidates[~differs.any(axis=1)]] = a
    return twin


def _canonical_machines(
    inv_code: np.ndarray, links: np.ndarray, max_leaves: int
) -> tuple[np.ndarray, bool]:
    """Canonical machine order by individualization-refinement; and whether it is exact."""
    m = len(inv_code)
    twins = _twin_classes(inv_code, links)
    best_order: np.ndarray | None = None
    best_code: np.ndarray | None = None
    leaves = 0
    stack = [_refine(_compress(inv_code), links)]
    while stack:
        colors = stack.pop()
        if colors.max() == m - 1:  # discrete: every machine has its own colour
            order = np.argsort(colors)
            code = links[np.ix_(order, order)].ravel()
            if best_code is None or _lexicographically_less(code, best_code):
                best_order, best_code = order, code
            leaves += 1
            if leaves >= max_leaves and stack:
                return best_order, False
            continue
        sizes = np.bincount(colors)
        cell = np.flatnonzero(colors == np.flatnonzero(sizes > 1)[0])
        _, first = np.unique(twins[cell], return_index=True)
        representatives = cell[np.sort(first)]
        if representatives.size == 1:
            # All twins: any order of them is equivalent, so fix it at once.
            split = colors * m
            split[cell] += np.arange(cell.size)
            stack.append(_refine(_compress(split), links))
            continue
        for v in representatives[::-1]:  # pushed in reverse so the first is tried first
            split = colors * 2 + 1
            split[v] -= 1
            stack.append(_refine(_compress(split), links))
    assert best_order is not None
    return best_order, True


def _lexicographically_less(a: np.ndarray, b: np.ndarray) -> bool:
    differ = np.flatnonzero(a != b)
    return bool(differ.size) and bool(a[differ[0]] < b[differ[0]])


def _inverse(order: np.ndarray) -> np.ndarray:
    inverse = np.empty_like(order, dtype=np.int64)
    inverse[order] = np.arange(order.size)
    return inverse
