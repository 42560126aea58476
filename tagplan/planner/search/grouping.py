"""Op grouping (TAG §4.1.1): METIS partitions the graph into at most 60 op groups,
minimizing the tensor bytes on cut edges while keeping each group's compute time within a
balance factor of 2.

Ops that must stay together are fused into *atoms* before partitioning: a colocation
class (a variable, its reads and updates) and a parameter with its optimizer slots and
update region (TAG §4.1.1: "a parameter stays with its apply op"). Vertex weight is the
atom's compute time, edge weight the bytes of the tensors between atoms. METIS works on
an undirected graph and keeps a layer's forward and backward ops together (they share
its activations), so the group graph of a training step has cycles: layer 2's group
feeds layer 1's through the backward pass. They are kept — contracting them would merge
the whole step into one group — and groups are numbered by their first op in
topological order. (docs/design.md §7 asked for a DAG; for training graphs only separating
forward from backward gives one, at the cost of the transfers METIS saves.)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pymetis

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.options import DEFAULT_MAX_GROUPS
from tagplan.planner.topology import Cluster
from tagplan.planner.unionfind import UnionFind

__all__ = ["Grouping", "atoms_of", "cluster_mean_op_time_s", "group_ops", "grouping_of", "op_edges"]

DEFAULT_BALANCE = 2.0


@dataclass(frozen=True, eq=False)
class Grouping:
    """Op groups of a graph: ``op_group[i]`` is op ``i``'s group, groups in DAG order."""

    op_group: np.ndarray  # int32 per op
    group_time_s: np.ndarray  # float64: compute time of each group
    group_param_bytes: np.ndarray  # int64: bytes of the parameters each group holds
    edge_src: np.ndarray  # int32: group edges (data between groups)
    edge_dst: np.ndarray  # int32
    edge_bytes: np.ndarray  # int64: bytes on each group edge

    @property
    def num_groups(self) -> int:
        return len(self.group_time_s)

    def ops(self, group: int) -> np.ndarray:
        return np.flatnonzero(self.op_group == group)


def atoms_of(ir: GraphIR) -> np.ndarray:
    """Atom id per op: colocation classes joined with each parameter's update region."""
    sets = UnionFind(ir.num_ops)
    first_of_class: dict[int, int] = {}
    for op in range(ir.num_ops):
        root = first_of_class.setdefault(int(ir.colocation[op]), op)
        sets.union(op, root)
    params = ir.parameters
    for row in range(len(params)):
        anchor = int(params.variable_op[row])
        members = [int(params.apply_op[row])]
        members += params.slot_op[params.slot_ptr[row] : params.slot_ptr[row + 1]].tolist()
        members += params.region_op[params.region_ptr[row] : params.region_ptr[row + 1]].tolist()
        for op in members:
            sets.union(op, anchor)
    return sets.labels()


def op_edges(ir: GraphIR) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Directed data edges (producer op, consumer op, bytes) plus control edges (0 bytes)."""
    consumers = ir.tensor_consumer_op
    producers = np.repeat(ir.tensor_producer, np.diff(ir.tensor_consumer_ptr))
    nbytes = np.repeat(ir.tensor_bytes, np.diff(ir.tensor_consumer_ptr))
    control_dst = np.repeat(np.arange(ir.num_ops), np.diff(ir.control_ptr))
    src = np.concatenate([producers, ir.control_pred]).astype(np.int64)
    dst = np.concatenate([consumers, control_dst]).astype(np.int64)
    weights = np.concatenate([nbytes, np.zeros(len(control_dst), dtype=np.int64)])
    return src, dst, weights


@contextmanager
def _quiet_stdout() -> Iterator[None]:
    """METIS prints warnings from C straight to file descriptor 1 (e.g. when it leaves a
    part empty, which the grouping tolerates); keep them off the product's output."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as devnull:
            os.dup2(devnull.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _metis(
    labels: np.ndarray,
    weights: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    nbytes: np.ndarray,
    parts: int,
    balance: float,
    seed: int,
) -> np.ndarray:
    count = int(labels.max()) + 1
    a, b = labels[src], labels[dst]
    keep = a != b
    pairs = np.concatenate([np.stack([a[keep], b[keep]], 1), np.stack([b[keep], a[keep]], 1)])
    kbytes = np.concatenate([nbytes[keep], nbytes[keep]]) // 1024 + 1
    order = np.lexsort((pairs[:, 1], pairs[:, 0]))
    pairs, kbytes = pairs[order], kbytes[order]
    unique, first = np.unique(pairs, axis=0, return_index=True)
    summed = np.add.reduceat(kbytes, first) if len(first) else kbytes[:0]
    xadj = (
        np.searchsorted(unique[:, 0], np.arange(count + 1))
        if len(unique)
        else np.zeros(count + 1, dtype=np.int64)
    )
    options = pymetis.Options(seed=seed, ufactor=round((balance - 1) * 1000))
    vweights = np.maximum(1, np.round(weights * 1e6)).astype(np.int64)
    with _quiet_stdout():
        _, membership = pymetis.part_graph(
            parts,
            pymetis.CSRAdjacency(
                xadj.astype(np.int64).tolist(), unique[:, 1].astype(np.int64).tolist()
            ),
            vweights=vweights.tolist(),
            eweights=np.minimum(summed, 2**31 - 1).astype(np.int64).tolist(),
            options=options,
        )
    return np.asarray(membership, dtype=np.int32)


def _topological_numbering(groups: np.ndarray) -> np.ndarray:
    """Number groups by their first op in topological order (ops are numbered so)."""
    count = int(groups.max()) + 1
    first = np.full(count, len(groups), dtype=np.int64)
    np.minimum.at(first, groups, np.arange(len(groups)))
    rank = np.empty(count, dtype=np.int32)
    rank[np.argsort(first, kind="stable")] = np.arange(count, dtype=np.int32)
    return rank[groups]


def cluster_mean_op_time_s(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> np.ndarray:
    """Each op's time at the job's batch averaged over the cluster's GPU types (TAG §4.1.1:
    "total computation time, averaged over measured running time on different devices")."""
    types = sorted(set(cluster.device_type.tolist()))
    return np.mean([costs.op_times(t, ir.batch_size).seconds for t in types], axis=0)


def group_ops(
    ir: GraphIR,
    op_time_s: np.ndarray,
    *,
    max_groups: int = DEFAULT_MAX_GROUPS,
    balance: float = DEFAULT_BALANCE,
    seed: int = 0,
) -> Grouping:
    """Partition ``ir`` into at most ``max_groups`` op groups (TAG §4.1.1).

    ``op_time_s`` is each op's compute time (e.g. averaged over the cluster's GPU types);
    ``balance`` is METIS's allowed ratio of the heaviest group to the average.
    """
    if max_groups < 1:
        raise InvalidInput(f"max_groups must be at least 1, got {max_groups}")
    if balance < 1:
        raise InvalidInput(f"balance must be at least 1, got {balance}")
    atoms = atoms_of(ir)
    count = int(atoms.max()) + 1
    atom_time = np.bincount(atoms, weights=op_time_s, minlength=count)
    if count <= max_groups or count // 4 < 2:
        groups = atoms
    else:
        # METIS needs several vertices per part to bisect; small graphs get fewer parts
        parts = min(max_groups, count // 4)
        src, dst, nbytes = op_edges(ir)
        groups = _metis(atoms, atom_time, src, dst, nbytes, parts, balance, seed)[atoms]
    return grouping_of(
        ir, op_time_s, _topological_numbering(np.unique(groups, return_inverse=True)[1])
    )


def grouping_of(ir: GraphIR, op_time_s: np.ndarray, groups: np.ndarray) -> Grouping:
    """The :class:`Grouping` of the op groups ``groups`` (ids ``0 .. n - 1`` in DAG
    order, as :func:`group_ops` numbers them): their times, parameters and edges. Rebuilds
    a grouping that was computed once and passed on as its ``op_group``."""
    groups = np.asarray(groups, dtype=np.int32)
    if groups.shape != (ir.num_ops,) or (len(groups) and groups.min() < 0):
        raise InvalidInput(f"op groups need one id of at least 0 per op ({ir.num_ops} ops)")
    src, dst, nbytes = op_edges(ir)
    num = int(groups.max()) + 1
    a, b = groups[src], groups[dst]
    cut = a != b
    pairs, inverse = np.unique(np.stack([a[cut], b[cut]], 1), axis=0, return_inverse=True)
    edge_bytes = np.bincount(inverse.ravel(), weights=nbytes[cut], minlength=len(pairs))
    params = ir.parameters
    return Grouping(
        op_group=groups,
        group_time_s=np.bincount(groups, weights=op_time_s, minlength=num),
        group_param_bytes=np.bincount(
            groups[params.variable_op], weights=params.bytes, minlength=num
        ).astype(np.int64),
        edge_src=pairs[:, 0].astype(np.int32) if len(pairs) else np.zeros(0, np.int32),
        edge_dst=pairs[:, 1].astype(np.int32) if len(pairs) else np.zeros(0, np.int32),
        edge_bytes=edge_bytes.astype(np.int64),
    )
