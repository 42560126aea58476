"""The order a compile takes: chunk by chunk, then what crosses between chunks.

The compiler cuts the ops into *chunks* once per graph and cluster: the op groups the
search groups them into by default, so that a search's decision changes whole chunks.
Each chunk's ops are compiled in op order with the inputs made inside the chunk alone (a
*fragment*: the instances, the transports among them, the AllReduces of gradients read
there), then, chunk by chunk, every read of one of its tensors by another chunk (its
*crossing*: the transfers, joins, cuts, sums and AllReduces that bring them). A fragment
depends on the placement of its chunk's ops alone and a crossing on those of its chunk
and the reading chunks, so a search, whose neighbouring strategies change one or a few
groups, compiles each once per placement and splices it in after
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

import numpy as np

from tagplan.planner.graph.ir import GraphIR

__all__ = ["Walk", "walk"]


@dataclass(frozen=True, eq=False)
class Walk:
    """The order of one chunking of the ops: chunk ``k`` (in ascending chunk id) is
    compiled ``k``-th, its ops ``ops[k]`` (ascending) reading ``inputs[k][i]`` (the inputs
    of ``ops[k][i]`` made in the chunk, in input order). Then, chunk by chunk, the tensors
    it makes that other chunks read: ``crossings[k]`` lists them by tensor, each with its
    readers in op order and how many of each reader's inputs it is; ``readers[k]`` are the
    chunks those readers are in. ``op_order`` lists the ops chunk by chunk,
    ``op_bounds[k]:op_bounds[k + 1]`` those of the ``k``-th."""

    ops: tuple[list[int], ...]
    inputs: tuple[list[list[int]], ...]
    crossings: tuple[tuple[tuple[int, tuple[tuple[int, int], ...]], ...], ...]
    readers: tuple[tuple[int, ...], ...]
    op_order: np.ndarray
    op_bounds: np.ndarray

    @property
    def num_chunks(self) -> int:
        return len(self.ops)

    def exported(self, k: int) -> frozenset[int]:
        """The tensors of chunk ``k`` that other chunks read."""
        return frozenset(tensor for tensor, _ in self.crossings[k])


def walk(ir: GraphIR, chunk: np.ndarray) -> Walk:
    """The walk of ``ir`` in the chunks ``chunk`` (an id per op)."""
    chunk_of = chunk.tolist()
    producer = ir.tensor_producer.tolist()
    op_order = np.argsort(chunk, kind="stable").astype(np.int64)
    ids, starts = np.unique(chunk[op_order], return_index=True)
    position = {int(c): k for k, c in enumerate(ids.tolist())}
    ops: list[list[int]] = [[] for _ in position]
    inputs: list[list[list[int]]] = [[] for _ in position]
    crossing: list[dict[int, dict[int, int]]] = [{} for _ in position]
    readers: list[set[int]] = [set() for _ in position]
    for op, tensors in enumerate(ir.input_lists):
        k = position[chunk_of[op]]
        inside = [t for t in tensors if chunk_of[producer[t]] == chunk_of[op]]
        ops[k].append(op)
        inputs[k].append(tensors if len(inside) == len(tensors) else inside)
        for tensor in tensors:
            made = position[chunk_of[producer[tensor]]]
            if made != k:
                reads = crossing[made].setdefault(tensor, {})
                reads[op] = reads.get(op, 0) + 1
                readers[made].add(k)
    return Walk(
        ops=tuple(ops),
        inputs=tuple(inputs),
        crossings=tuple(
            tuple((tensor, tuple(reads.items())) for tensor, reads in sorted(c.items()))
            for c in crossing
        ),
        readers=tuple(tuple(sorted(r)) for r in readers),
        op_order=op_order,
        op_bounds=np.append(starts, len(op_order)).astype(np.int64),
    )
