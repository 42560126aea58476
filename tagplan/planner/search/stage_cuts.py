"""Where a pipeline cuts the model: each op's stage (:func:`op_stages`), for the layouts
of :mod:`.pipeline_stages`.

The forward ops that will run per micro-batch (splittable, reading batch data) are taken
in topological order and cut into ``p`` runs whose compute times are in proportion to
``shares`` (each stage's aggregate GPU speed for tagplan's candidates, equal shares for
the hand-configured baseline); a prefix of a topological order never feeds an earlier
run, so the forward pass goes stage by stage. tagplan moves each cut, within a window of
``slack`` of the smaller neighbouring stage's share, to where the fewest activation
bytes cross it (the bytes every micro-batch sends forward and its gradient sends back:
VGG19's two stages split after a pooling, before block 3, rather than inside block 3);
the baseline cuts where the compute is balanced. Every other op follows its neighbours:
a forward op without batch input (a weight read) the first stage that reads it; a
backward op the latest stage among the outputs of micro-batched forward ops it reads
(its layer's activations and saved batch statistics, not a mask every later layer
reads), or, reading gradients only, the earliest stage they come from (a second set of
candidates puts every backward op with the earliest stage of the batch data it reads);
what reads nothing staged the first stage that reads it; and the ops TensorFlow must
colocate (a variable, its reads, slots and update) the earliest stage among their
forward ops (the layer that reads the weight).

A graph is cut for every layout, so what the cuts walk of it is built once per graph
(:class:`_StageGraph`, Python lists: the walks visit ops one by one).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tagplan.planner.compile.pipeline import forward_ops
from tagplan.planner.compile.placement import has_batch_input
from tagplan.planner.graph.batch import Aggregation, SplitCategory
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.search.grouping import atoms_of

__all__ = ["op_stages", "variable_atoms"]

_SETTLE_SWEEPS = 4  # label-propagation sweeps over the backward ops


def op_stages(
    ir: GraphIR,
    op_time_s: np.ndarray,
    shares: np.ndarray,
    *,
    slack: float = 0.0,
    by_layer: bool = True,
) -> np.ndarray:
    """Each op's stage (``0 .. len(shares) - 1``) by the cuts of the module docstring."""
    num_stages = len(shares)
    graph = _stage_graph(ir)
    ops = graph.cut_ops
    stage = np.full(ir.num_ops, -1, dtype=np.int64)
    seconds = op_time_s[ops]
    total = float(seconds.sum())
    done = np.cumsum(seconds) / total if total > 0 else np.zeros(len(ops))  # after op k
    fractions = shares / shares.sum()
    stage[ops] = 0
    for boundary, target in enumerate(np.cumsum(fractions)[:-1].tolist()):
        window = slack * min(fractions[boundary], fractions[boundary + 1])
        before = done - seconds / total / 2 if total > 0 else done  # an op's middle
        allowed = np.flatnonzero(np.abs(before - target) <= window)
        first = int(np.searchsorted(before, target, side="right"))  # the balanced cut
        if len(allowed):
            first = int(allowed[np.argmin(graph.crossing[allowed])])  # the first of equals
        stage[ops[first:]] = boundary + 1
    staged: list[int] = stage.tolist()
    readers = graph.readers
    for op in graph.cut_list[::-1]:  # a shape is taken where it is read
        if graph.makes_shapes[op]:
            staged[op] = _first_reader(staged, readers[op], default=staged[op])
    for op in graph.forward_list[::-1]:  # forward ops without batch: first reader
        if staged[op] < 0:
            staged[op] = _first_reader(staged, readers[op], default=-1)
    for op in range(ir.num_ops):  # backward ops: with the activations of their layer
        if staged[op] < 0:
            staged[op] = _backward_stage(graph, staged, by_layer, op)
    for op in range(ir.num_ops - 1, -1, -1):  # reading nothing staged: first reader
        if staged[op] < 0:
            staged[op] = _first_reader(staged, readers[op], default=num_stages - 1)
    _settle_backward(graph, staged)
    stage = np.asarray(staged, dtype=np.int64)
    atoms, _ = variable_atoms(ir)  # with the earliest forward op among them, else the earliest
    count = int(atoms.max()) + 1
    earliest = np.full(count, num_stages, dtype=np.int64)
    np.minimum.at(earliest, atoms, stage)
    forward = graph.forward
    forward_first = np.full(count, num_stages, dtype=np.int64)
    np.minimum.at(forward_first, atoms[forward], stage[forward])
    chosen = np.where(forward_first < num_stages, forward_first, earliest)
    return chosen[atoms]


def _first_reader(stage: list[int], readers: list[int], *, default: int) -> int:
    """The earliest stage among ``readers`` already staged, else ``default``."""
    return min((stage[r] for r in readers if stage[r] >= 0), default=default)


@lru_cache(maxsize=8)
def variable_atoms(ir: GraphIR) -> tuple[np.ndarray, np.ndarray]:
    """Each op's atom (:func:`~.grouping.atoms_of`) and, per atom, whether it holds a
    variable."""
    atoms = atoms_of(ir)
    holds = np.zeros(int(atoms.max()) + 1, dtype=bool)
    holds[atoms[ir.variable_bytes > 0]] = True
    return atoms, holds


@dataclass(frozen=True, eq=False)
class _StageGraph:
    """What the cuts walk of one graph, the same for every layout: the forward ops and
    the micro-batched ones among them (``cut_*``, in topological order, with the bytes
    a cut before each crosses), per op its readers, the producers of its inputs (all of
    them; those of a replica's shapes, of batch data, of micro-batched forward outputs),
    whether it makes shapes only, and the bytes its inputs and outputs weigh where they
    are made and read; and the backward ops that label propagation may move. Python
    lists: the walks visit ops one by one."""

    forward: np.ndarray  # bool per op
    forward_list: list[int]
    cut_ops: np.ndarray
    cut_list: list[int]
    crossing: np.ndarray
    readers: list[list[int]]
    producers: list[list[int]]
    shape_producers: list[list[int]]
    data_producers: list[list[int]]
    layer_producers: list[list[int]]  # of outputs of micro-batched forward ops
    makes_shapes: list[bool]
    input_bytes: list[list[tuple[int, int]]]  # per input: its producer, its bytes
    output_bytes: list[list[tuple[list[int], int]]]  # per output: its readers, its bytes
    movable_list: list[int]
    movable_readers: list[list[int]]  # per op, the movable ops reading its outputs
    movable_producers: list[list[int]]  # per op, the movable ops making its inputs


@lru_cache(maxsize=8)
def _stage_graph(ir: GraphIR) -> _StageGraph:
    """The :class:`_StageGraph` of ``ir``, built once per graph."""
    forward = forward_ops(ir)
    cut = forward & has_batch_input(ir) & (ir.split_category != SplitCategory.NONE)
    cut_ops = np.flatnonzero(cut)
    producer = ir.tensor_producer.tolist()
    shape = (ir.tensor_aggregation == Aggregation.LOCAL).tolist()
    carries = (ir.tensor_batch_axis >= 0).tolist()
    inputs = ir.input_lists
    outputs = [ir.outputs(op) for op in range(ir.num_ops)]
    movable = _movable(ir, forward).tolist()
    readers = _readers(ir)
    producers = [[producer[t] for t in tensors] for tensors in inputs]
    nbytes = ir.tensor_bytes.tolist()
    consumers = [ir.consumers(t).tolist() for t in range(ir.num_tensors)]
    cut_mask = cut.tolist()
    return _StageGraph(
        forward=forward,
        forward_list=np.flatnonzero(forward).tolist(),
        cut_ops=cut_ops,
        cut_list=cut_ops.tolist(),
        crossing=_crossing_bytes(ir, cut_ops),
        readers=readers,
        producers=producers,
        shape_producers=[[producer[t] for t in tensors if shape[t]] for tensors in inputs],
        data_producers=[[producer[t] for t in tensors if carries[t]] for tensors in inputs],
        layer_producers=[[p for p in found if cut_mask[p]] for found in producers],
        makes_shapes=[len(out) > 0 and all(shape[t] for t in out) for out in outputs],
        input_bytes=[[(producer[t], nbytes[t]) for t in tensors] for tensors in inputs],
        output_bytes=[[(consumers[t], nbytes[t]) for t in out] for out in outputs],
        movable_list=[op for op in range(ir.num_ops) if movable[op]],
        movable_readers=[[r for r in found if movable[r]] for found in readers],
        movable_producers=[[p for p in found if movable[p]] for found in producers],
    )


def _movable(ir: GraphIR, forward: np.ndarray) -> np.ndarray:
    """The backward ops label propagation may move (:func:`_settle_backward`): not those
    holding or next to per-replica values (statistics, shapes), nor ops colocated with a
    variable."""
    atoms, holds = variable_atoms(ir)
    per_replica = np.isin(ir.tensor_aggregation, (Aggregation.MEAN, Aggregation.LOCAL))
    reads_value = np.zeros(ir.num_ops, dtype=bool)
    reader = ir.input_reader
    reads_value[reader[per_replica[ir.op_input_tensor]]] = True
    makes_value = np.zeros(ir.num_ops, dtype=bool)
    makes_value[ir.tensor_producer[per_replica]] = True
    return ~forward & ~holds[atoms] & ~reads_value & ~makes_value


def _settle_backward(graph: _StageGraph, stage: list[int]) -> None:
    """Move backward ops, a few sweeps over them, to the stage among their neighbours'
    that the fewest bytes of their inputs and outputs cross to (label propagation): a
    gradient that only reads gradients joins the stage of the layer it flows into
    rather than staying where it came from. Only the movable ops move (:func:`_movable`).
    An op is weighed again only once a neighbour has moved since it was last weighed: its
    choice depends on nothing else, so the sweeps end as if every op were weighed."""
    dirty = set(graph.movable_list)
    for _ in range(_SETTLE_SWEEPS):
        moved = 0
        for op in graph.movable_list:
            if op not in dirty:
                continue
            dirty.discard(op)
            cost: dict[int, float] = {}
            for made_by, nbytes in graph.input_bytes[op]:
                where = stage[made_by]
                cost[where] = cost.get(where, 0.0) + nbytes
            for readers, nbytes in graph.output_bytes[op]:
                for where in {stage[c] for c in readers}:
                    cost[where] = cost.get(where, 0.0) + nbytes
            # the backward pass goes stage by stage back: not below what it feeds,
            # not above the gradients it reads
            low = max((stage[c] for c in graph.movable_readers[op]), default=0)
            high = min((stage[p] for p in graph.movable_producers[op]), default=1 << 30)
            cost = {s: c for s, c in cost.items() if low <= s <= high}
            if not cost:
                continue
            total = sum(cost.values())
            current = stage[op]
            best = max(cost, key=lambda s: (cost[s], s == current))  # the most bytes kept
            if best != current and total - cost[best] < total - cost.get(current, 0.0):
                stage[op] = best
                moved += 1
                dirty.update(graph.movable_readers[op])
                dirty.update(graph.movable_producers[op])
        if not moved:
            break


def _backward_stage(graph: _StageGraph, stage: list[int], by_layer: bool, op: int) -> int:
    """The stage of an op outside the forward pass: where the replica shapes it reads were
    taken; else, ``by_layer``, the latest stage among the outputs of micro-batched forward
    ops it reads (its layer's activations and saved statistics, which must be read where
    they were made, not a mask or an encoder output every later stage reads); without
    any, the earliest among the batch data it reads (gradients coming back), else among
    all it reads; -1 when nothing it reads is staged yet."""
    shapes = [stage[p] for p in graph.shape_producers[op]]
    if shapes and max(shapes) >= 0:  # a replica's shape is read where it was taken
        return max(shapes)
    if by_layer:
        made = [stage[p] for p in graph.layer_producers[op]]
        if made and max(made) >= 0:
            return max(made)
    for producers in (graph.data_producers[op], graph.producers[op]):
        found = [s for s in [stage[p] for p in producers] if s >= 0]
        if found:
            return min(found)
    return -1


def _crossing_bytes(ir: GraphIR, ops: np.ndarray) -> np.ndarray:
    """``crossing[k]``: bytes of the outputs of ``ops[:k]`` that ``ops[k:]`` read (a cut
    before position ``k``)."""
    position = np.full(ir.num_ops, -1, dtype=np.int64)
    position[ops] = np.arange(len(ops))
    change = np.zeros(len(ops) + 1)
    for k, op in enumerate(ops.tolist()):
        for tensor in ir.outputs(op):
            readers = position[ir.consumers(tensor)]
            last = int(readers.max()) if len(readers) else -1
            if last > k:
                change[k + 1] += float(ir.tensor_bytes[tensor])
                change[last + 1] -= float(ir.tensor_bytes[tensor])
    return np.cumsum(change)[: len(ops)]


def _readers(ir: GraphIR) -> list[list[int]]:
    """Per op, the ops reading any of its outputs."""
    found: list[list[int]] = [[] for _ in range(ir.num_ops)]
    reader = ir.input_reader.tolist()
    for op, tensor in zip(reader, ir.op_input_tensor.tolist(), strict=True):
        found[int(ir.tensor_producer[tensor])].append(op)
    return found
