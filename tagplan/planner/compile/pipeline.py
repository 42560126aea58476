"""Pipeline schedules as orders of phases on each GPU, for both back ends.

A pipelined strategy (:class:`~tagplan.planner.strategy.Pipeline`) cuts the batch into
``m`` micro-batches; every split op of a stage's groups runs once per micro-batch and
replica (:func:`~.placement.micro_batch_slices`). On one GPU of stage ``s`` a *phase* is
``(F, j)``, the forward instances of micro-batch ``j`` (split ops the loss depends on), or
``(B, j)``, the rest of its split instances (the backward pass and anything else reading
the micro-batch). The schedule fixes the order of the phases (:func:`stage_order`) and
both back ends enforce it the same way: between consecutive phases on a GPU, one
zero-time barrier (a ``NoOp`` in the GraphDef) that waits for every instance of the
first and that every instance of the second waits for (:func:`phase_barriers`). After
its last phase a GPU flushes: the stage's optimizer updates wait for it, so that they do
not hold back the backward pass the earlier stages wait for. Gradients are accumulated
as the micro-batches' partials come in (a running sum, one two-input ``AddN`` each).

With ``p`` stages of equal times ``t_f`` and ``t_b`` per micro-batch and free
communication, both schedules take ``(m + p - 1)(t_f + t_b)`` and leave each stage idle
a fraction ``(p - 1) / (m + p - 1)`` of it (GPipe §2.3, "bubble"); stage ``s`` under
``1f1b`` holds at most ``min(p - s, m)`` micro-batches' activations at once, under
``gpipe`` all ``m`` (PipeDream-Flush, Narayanan et al. 2021 §2.2).

A control dependency on a micro-batched op holds micro-batch by micro-batch
(:func:`control_pairs`): an instance waits for the predecessor's instances whose rows
overlap its own, as TensorFlow's replicas of a subgraph each keep their own control edges,
and an op that is not micro-batched (a constant the gradient code creates after a
gradient) waits for the first micro-batch; waiting for every micro-batch would join them.

Micro-batches are independent only up to an op that needs the whole batch: an op that is
not micro-batched (of category *none*, or of a group outside the stages) between
micro-batched ops would join them all (and deadlock ``1f1b``), so such a strategy is
refused with the op's name; so is one whose forward pass goes back from a stage to an
earlier one, and one where an op reads per-replica values made in another stage (a
batch norm's saved statistics, which it would read averaged over every micro-batch; a
slice's shape, which would be another replica's).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order

from tagplan.planner.compile.placement import Placement, batch_slices
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.batch import Aggregation
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.strategy import Mode, ResolvedStrategy, Schedule

__all__ = [
    "BACKWARD",
    "FORWARD",
    "PhaseBarrier",
    "control_pairs",
    "first_micro_batch_rows",
    "forward_ops",
    "micro_batched_ops",
    "phase_barriers",
    "stage_order",
]

FORWARD, BACKWARD = 0, 1

PhaseBarrier = tuple[str, np.ndarray, np.ndarray]  # name, instances it waits for, releases


def stage_order(
    schedule: Schedule, stage: int, num_stages: int, micro_batches: int
) -> list[tuple[int, int]]:
    """The ``(FORWARD | BACKWARD, micro-batch)`` phases of ``stage`` in the order it runs
    them: GPipe's every forward then every backward; 1F1B's ``p - s - 1`` warm-up
    forwards, then one forward and one backward in turn, then the remaining backwards."""
    m = micro_batches
    if schedule == Schedule.GPIPE:
        return [(FORWARD, j) for j in range(m)] + [(BACKWARD, j) for j in range(m)]
    warmup = min(num_stages - stage - 1, m)
    order = [(FORWARD, j) for j in range(warmup)]
    for j in range(m - warmup):
        order += [(FORWARD, warmup + j), (BACKWARD, j)]
    return order + [(BACKWARD, j) for j in range(m - warmup, m)]


@lru_cache(maxsize=8)
def forward_ops(ir: GraphIR) -> np.ndarray:
    """Per op: does the loss depend on it (the loss op included)."""
    if ir.loss_op < 0:
        raise InvalidInput(
            "a pipeline needs the graph's loss to tell forward from backward ops; "
            "name it when importing the graph"
        )
    loss = np.zeros(ir.num_ops, dtype=bool)
    loss[ir.loss_op] = True
    return _reach(ir, loss, downstream=False)


def micro_batched_ops(resolved: ResolvedStrategy, placement: Placement) -> np.ndarray:
    """Per op: split in a pipeline stage, one instance per micro-batch and replica."""
    return (placement.op_mode == Mode.SPLIT) & (resolved.group_stage[resolved.op_group] >= 0)


def control_pairs(
    placement: Placement, pred: int, succ: int, whole_succ_rows: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(pred instances, succ instances)``: each instance of ``succ`` waits for the
    instances of micro-batched ``pred`` whose rows overlap its own; a ``succ`` that is
    not micro-batched (``whole_succ_rows``: the end of the first micro-batch's rows)
    waits for the first micro-batch, which keeps the order TensorFlow's edge asks for
    without joining the micro-batches."""
    p, s = placement.instances(pred), placement.instances(succ)
    p_lo, p_hi = placement.inst_lo[p.start : p.stop], placement.inst_hi[p.start : p.stop]
    s_lo, s_hi = placement.inst_lo[s.start : s.stop], placement.inst_hi[s.start : s.stop]
    if whole_succ_rows is not None:
        s_lo, s_hi = np.zeros_like(s_lo), np.full_like(s_hi, whole_succ_rows)
    overlap = (p_lo[:, None] < s_hi[None, :]) & (s_lo[None, :] < p_hi[:, None])
    i, j = np.nonzero(overlap)
    return i + p.start, j + s.start


def first_micro_batch_rows(resolved: ResolvedStrategy, batch_size: int) -> int:
    """The end of micro-batch 0's rows (the whole batch without a pipeline)."""
    pipeline = resolved.pipeline
    if pipeline is None:
        return batch_size
    return int(batch_slices(np.ones(pipeline.micro_batches), batch_size)[1])


def _reach(ir: GraphIR, sources: np.ndarray, *, downstream: bool) -> np.ndarray:
    """Ops reachable from ``sources`` (included) over data edges, towards readers or
    towards producers: one breadth-first search from a node joined to every source."""
    producer = ir.tensor_producer[ir.op_input_tensor]
    tails, heads = (producer, ir.input_reader) if downstream else (ir.input_reader, producer)
    start = ir.num_ops  # the added node
    firsts = np.flatnonzero(sources)
    rows = np.concatenate([tails, np.full(len(firsts), start)])
    cols = np.concatenate([heads, firsts])
    size = ir.num_ops + 1
    graph = csr_matrix((np.ones(len(rows), dtype=np.int8), (rows, cols)), shape=(size, size))
    found = np.zeros(size, dtype=bool)
    found[breadth_first_order(graph, start, directed=True, return_predecessors=False)] = True
    return found[: ir.num_ops]


def _check_no_gather(ir: GraphIR, micro_batched: np.ndarray) -> None:
    """Refuse an op that is not micro-batched between micro-batched ops: it would wait
    for every micro-batch before any could go on."""
    joins = (
        _reach(ir, micro_batched, downstream=True)
        & _reach(ir, micro_batched, downstream=False)
        & ~micro_batched
    )
    if joins.any():
        op = int(np.flatnonzero(joins)[0])
        raise InvalidInput(
            f"pipeline: {ir.op_names[op]!r} runs on the whole batch between micro-batched "
            "ops; micro-batches cannot flow past it (stage its group, or make it a "
            "replicated group of a stage)"
        )


def _check_stage_edges(
    ir: GraphIR, op_stage: np.ndarray, micro_batched: np.ndarray, forward: np.ndarray
) -> None:
    """Refuse data between micro-batched ops that a pipeline cannot run: a forward pass
    going from a stage back to an earlier one (micro-batch ``j`` of the earlier stage
    would wait for a later stage that waits for it), and per-replica values read in
    another stage than the one that made them: batch statistics (the reader would get
    their average over every micro-batch) and shapes (another replica's rows)."""
    reader = ir.input_reader
    producer = ir.tensor_producer[ir.op_input_tensor]
    both = micro_batched[producer] & micro_batched[reader]
    statistics = np.isin(
        ir.tensor_aggregation[ir.op_input_tensor], (Aggregation.MEAN, Aggregation.LOCAL)
    )
    rules = (
        (
            both & forward[producer] & forward[reader] & (op_stage[producer] > op_stage[reader]),
            "{p} of stage {ps} feeds {r} of stage {rs}; the stages must follow the forward pass",
        ),
        (
            both & statistics & (op_stage[producer] != op_stage[reader]),
            "{r} of stage {rs} reads the per-replica statistics or shape of {p} of stage "
            "{ps}; they must share a stage",
        ),
    )
    for found, message in rules:
        if found.any():
            edge = int(np.flatnonzero(found)[0])
            p, r = int(producer[edge]), int(reader[edge])
            names = {"p": repr(ir.op_names[p]), "r": repr(ir.op_names[r])}
            stages = {"ps": int(op_stage[p]), "rs": int(op_stage[r])}
            raise InvalidInput("pipeline: " + message.format(**names, **stages))


def _staged_updates(ir: GraphIR, op_stage: np.ndarray, placement: Placement) -> np.ndarray:
    """Instances of the staged parameters' updates (the optimizer's apply ops)."""
    apply_ops = ir.parameters.apply_op[op_stage[ir.parameters.apply_op] >= 0]
    if not len(apply_ops):
        return np.zeros(0, dtype=np.int64)
    ptr = placement.inst_ptr
    return np.concatenate([np.arange(ptr[op], ptr[op + 1]) for op in apply_ops.tolist()])


def phase_barriers(
    ir: GraphIR, resolved: ResolvedStrategy, placement: Placement
) -> list[PhaseBarrier]:
    """The barriers that order every staged GPU's phases by the schedule (empty without a
    pipeline)."""
    pipeline = resolved.pipeline
    if pipeline is None:
        return []
    op_stage = resolved.group_stage[resolved.op_group]
    staged_split = micro_batched_ops(resolved, placement)
    _check_no_gather(ir, staged_split)
    forward = forward_ops(ir)
    _check_stage_edges(ir, op_stage, staged_split, forward)
    op_of = np.repeat(np.arange(ir.num_ops), np.diff(placement.inst_ptr))
    insts = np.flatnonzero(staged_split[op_of])
    if not len(insts):
        return []
    m, num_stages = pipeline.micro_batches, len(pipeline.stages)
    outer = batch_slices(np.ones(m), ir.batch_size)
    micro = np.searchsorted(outer, placement.inst_lo[insts], side="right") - 1
    kind = np.where(forward[op_of[insts]], FORWARD, BACKWARD)
    stage = op_stage[op_of[insts]]
    rank = np.empty(len(insts), dtype=np.int64)
    for s in range(num_stages):
        table = np.empty((2, m), dtype=np.int64)
        for position, (k, j) in enumerate(stage_order(pipeline.schedule, s, num_stages, m)):
            table[k, j] = position
        here = stage == s
        rank[here] = table[kind[here], micro[here]]
    device = placement.inst_device[insts]
    order = np.lexsort((rank, device))
    insts, rank, device = insts[order], rank[order], device[order]
    kind, micro = kind[order], micro[order]
    keys = np.stack([device, rank])
    starts = np.flatnonzero(np.r_[True, (keys[:, 1:] != keys[:, :-1]).any(axis=0)])
    ends = np.r_[starts[1:], len(insts)]
    barriers: list[PhaseBarrier] = []
    updates = _staged_updates(ir, op_stage, placement)
    for a in range(len(starts)):
        first = starts[a]
        if a + 1 == len(starts) or device[first] != device[starts[a + 1]]:  # the flush
            released = updates[placement.inst_device[updates] == device[first]]
            if len(released):
                name = f"pipeline/gpu_{int(device[first])}/flush"
                barriers.append((name, insts[first : ends[a]], released))
            continue
        second = starts[a + 1]
        phase = f"{'FB'[int(kind[second])]}{int(micro[second])}"
        name = f"pipeline/gpu_{int(device[first])}/before_{phase}"
        barriers.append((name, insts[first : ends[a]], insts[second : ends[a + 1]]))
    return barriers
