"""The order a compile takes: chunk by chunk, then what crosses between chunks.

Both back ends cut the ops into the same *chunks* once per graph and cluster
(:func:`default_walk`): the op groups the search groups them into by default, so that a
search's decision changes whole chunks.
Each chunk's ops are compiled in op order with the inputs made inside the chunk alone (a
*fragment*: the instances, the transports among them, the AllReduces of gradients read
there), then every read of a tensor by another chunk than its own, in *crossings* (the
transfers, joins, cuts, sums and AllReduces that bring them), one per chunk and set of
chunks reading its tensors. A fragment depends on the placement of its chunk's ops alone
and a crossing on those of its chunk and the reading chunks, so a search, whose
neighbouring strategies change one or a few groups, compiles each once per placement and
splices it in after
(:class:`~.task_compiler.TaskCompiler`, docs/design.md §5).

The order is valid for any chunking: op order is topological, so a chunk's reads inside
it come after what they read; the crossings come after every fragment; and every copy of
a tensor (moved, cut, joined, added up or reduced) depends on that tensor's producers
alone, so a reader may take a copy that another chunk's reader or a later op made
without making a cycle. It depends on the chunking, not on the strategy's op groups: a
placement compiles to the same task graph whatever groups a strategy names it by.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.search.grouping import cluster_mean_op_time_s, group_ops
from tagplan.planner.topology import Cluster

__all__ = ["Crossing", "Walk", "default_walk", "walk"]


class Crossing(NamedTuple):
    """Reads of tensors of chunk ``chunk`` by the ops of other chunks, all of them read by
    the chunks ``readers`` (positions, ascending) and no others: per tensor (ascending),
    each reader in op order with how many of its inputs the tensor is."""

    chunk: int
    readers: tuple[int, ...]
    reads: tuple[tuple[int, tuple[tuple[int, int], ...]], ...]


@dataclass(frozen=True, eq=False)
class Walk:
    """The order of one chunking of the ops: chunk ``k`` (in ascending chunk id) is
    compiled ``k``-th, its ops ``ops[k]`` (ascending) reading ``inputs[k][i]`` (the inputs
    of ``ops[k][i]`` made in the chunk, in input order). Then the ``crossings``, by chunk
    and then by first tensor; ``exported[k]`` are the tensors of chunk ``k`` other chunks
    read. ``op_order`` lists the ops chunk by chunk, ``op_bounds[k]:op_bounds[k + 1]``
    those of the ``k``-th; ``position[op]`` is the chunk ``op`` is in, by position.

    A crossing keeps together the tensors that the same chunks read, so that a strategy
    that changes one chunk's placement recompiles only the reads of what that chunk reads
    (and of what the same tensors' other readers read, which a copy may serve too)."""

    ops: tuple[list[int], ...]
    inputs: tuple[list[list[int]], ...]
    crossings: tuple[Crossing, ...]
    exported: tuple[frozenset[int], ...]
    op_order: np.ndarray
    op_bounds: np.ndarray
    position: np.ndarray

    @property
    def num_chunks(self) -> int:
        return len(self.ops)


def default_walk(ir: GraphIR, cluster: Cluster) -> Walk:
    """The walk both back ends compile ``ir`` for ``cluster`` in: chunks are the op groups
    a search groups the graph into by default (TAG §4.1.1), by the cost model's op times
    without profiles, so that every compile of a graph for a cluster agrees on them."""
    op_time_s = cluster_mean_op_time_s(ir, cluster, OpCostModel(ir, cluster))
    return walk(ir, group_ops(ir, op_time_s).op_group)


def walk(ir: GraphIR, chunk: np.ndarray) -> Walk:
    """The walk of ``ir`` in the chunks ``chunk`` (an id per op)."""
    chunk_of = chunk.tolist()
    producer = ir.tensor_producer.tolist()
    op_order = np.argsort(chunk, kind="stable").astype(np.int64)
    ids, starts = np.unique(chunk[op_order], return_index=True)
    position = {int(c): k for k, c in enumerate(ids.tolist())}
    ops: list[list[int]] = [[] for _ in position]
    inputs: list[list[list[int]]] = [[] for _ in position]
    reads: dict[int, dict[int, int]] = {}  # per tensor read across chunks: reader -> count
    for op, tensors in enumerate(ir.input_lists):
        k = position[chunk_of[op]]
        inside = [t for t in tensors if chunk_of[producer[t]] == chunk_of[op]]
        ops[k].append(op)
        inputs[k].append(tensors if len(inside) == len(tensors) else inside)
        for tensor in tensors:
            if chunk_of[producer[tensor]] != chunk_of[op]:
                readers = reads.setdefault(tensor, {})
                readers[op] = readers.get(op, 0) + 1
    units: dict[tuple[int, tuple[int, ...]], list] = {}
    for tensor in sorted(reads):
        readers = tuple(sorted({position[chunk_of[op]] for op in reads[tensor]}))
        made = position[chunk_of[producer[tensor]]]
        units.setdefault((made, readers), []).append((tensor, tuple(reads[tensor].items())))
    exported: list[set[int]] = [set() for _ in position]
    for (made, _), tensors in units.items():
        exported[made].update(tensor for tensor, _ in tensors)
    return Walk(
        ops=tuple(ops),
        inputs=tuple(inputs),
        crossings=tuple(
            Crossing(made, readers, tuple(tensors))
            for (made, readers), tensors in sorted(
                units.items(), key=lambda u: (u[0][0], u[1][0][0])
            )
        ),
        exported=tuple(frozenset(e) for e in exported),
        op_order=op_order,
        op_bounds=np.append(starts, len(op_order)).astype(np.int64),
        position=np.searchsorted(ids, chunk).astype(np.int64),
    )
