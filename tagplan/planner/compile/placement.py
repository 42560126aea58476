"""Where every op instance runs under a strategy: the first half of the rewrite rules
(TAG §4.3.1), shared by the task-graph and GraphDef back ends.

Per op, from its group's decision and its split category (TAG §4.1.1):

* a ``replicate-*`` group runs its batch-splittable ops (*split-concat*, *split-sum*) as
  one instance per replica, each on a contiguous share of the batch (:attr:`Mode.SPLIT`);
  its other ops run once on the group's first GPU when they read batch data (a loss
  ``Mean`` needs the whole batch), or on every GPU of the group when they do not (a
  weight read or transform is cheaper to repeat than to send);
* a *split-sum* op without batch input (an ``AddN`` of partial gradients) runs per
  replica, adding up that replica's partials, when every partial it reads comes from
  replicas laid out exactly as its own (same GPUs, same rows); otherwise it is a
  non-batch op like any other and reads the summed partials;
* a *split-concat* op without batch input makes batch rows from nothing (a range of the
  examples' positions, ``counts_rows`` in :mod:`tagplan.planner.graph.batch`): split,
  each replica counts its own rows;
* parameters follow their synchronization (TAG §4.2): with AllReduce the variable, its
  optimizer slots and its update are mirrored on every GPU of the group (identical
  initial values, identical updates); with a parameter server they live on the PS GPU.
  So does an embedding table updated sparsely: mirrored, every replica looks up its own
  rows and applies every replica's gradient rows (an AllGather of rows); on a parameter
  server, the classic PS layout, the table, its lookups and its sparse updates run
  there, the replicas pulling the rows their batch reads and pushing back the gradient
  rows, never the table;
* a ``duplicate`` group runs every op on every GPU of the group with the full batch;
* a ``model-parallel`` group runs each op once on the GPU the strategy assigned it;
* a pipeline stage's group runs its split ops once per replica per micro-batch: the
  batch is cut into equal micro-batches and each micro-batch among the group's replicas
  by their shares (:func:`micro_batch_slices`), so a micro-batch's rows are the same in
  every stage however many GPUs each has.

Ops TensorFlow must colocate (a variable with its reads and updates) take the placement
of the class's variable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tagplan.planner.graph.batch import Aggregation, SplitCategory
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.strategy import Mode, Option, ResolvedStrategy

__all__ = [
    "Placement",
    "batch_slices",
    "has_batch_input",
    "micro_batch_slices",
    "parameter_ops",
    "place",
    "sums_partials",
]


@dataclass(frozen=True, eq=False)
class Placement:
    """Instances of every op: ``inst_*[inst_ptr[i]:inst_ptr[i + 1]]`` belong to op ``i``.

    An instance runs on ``inst_device`` over the batch rows ``[inst_lo, inst_hi)`` (the
    whole batch unless the op is split).
    """

    op_mode: np.ndarray  # int8 Mode
    inst_ptr: np.ndarray  # int32
    inst_device: np.ndarray  # int32
    inst_lo: np.ndarray  # int32
    inst_hi: np.ndarray  # int32
    batch_size: int

    def instances(self, op: int) -> range:
        return range(int(self.inst_ptr[op]), int(self.inst_ptr[op + 1]))

    def devices(self, op: int) -> np.ndarray:
        return self.inst_device[self.inst_ptr[op] : self.inst_ptr[op + 1]]

    def local_batch(self, inst: int) -> int:
        return int(self.inst_hi[inst] - self.inst_lo[inst])

    @property
    def num_instances(self) -> int:
        return len(self.inst_device)


def batch_slices(weights: np.ndarray, batch_size: int) -> np.ndarray:
    """Row boundaries ``[0, ..., batch_size]`` giving each replica its share of the batch
    (largest remainder, so the shares sum to the batch exactly)."""
    exact = weights / weights.sum() * batch_size
    counts = np.floor(exact).astype(np.int64)
    short = batch_size - int(counts.sum())
    if short > 0:
        counts[np.argsort(-(exact - counts), kind="stable")[:short]] += 1
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)


def micro_batch_slices(weights: np.ndarray, batch_size: int, micro_batches: int) -> np.ndarray:
    """Row boundaries of replicas laid out micro-batch-major (``weights`` repeats the
    replicas' shares once per micro-batch): micro-batch ``j`` gets the rows
    ``batch_slices(ones(micro_batches), batch_size)[j:j + 2]``, which its replicas share
    by weight."""
    if micro_batches == 1:
        return batch_slices(weights, batch_size)
    outer = batch_slices(np.ones(micro_batches), batch_size)
    per = len(weights) // micro_batches
    bounds = [outer[:1]]
    for j in range(micro_batches):
        inner = batch_slices(weights[j * per : (j + 1) * per], int(outer[j + 1] - outer[j]))
        bounds.append(inner[1:] + outer[j])
    return np.concatenate(bounds).astype(np.int32)


def _variable_of_class(ir: GraphIR) -> dict[int, int]:
    """Colocation class -> its variable op (the class's first op holding bytes)."""
    found: dict[int, int] = {}
    for op in np.flatnonzero(ir.variable_bytes > 0).tolist():
        found.setdefault(int(ir.colocation[op]), op)
    return found


def has_batch_input(ir: GraphIR) -> np.ndarray:
    """Per op: does any input carry the batch dimension."""
    reader = ir.input_reader
    found = np.zeros(ir.num_ops, dtype=bool)
    found[reader[ir.tensor_batch_axis[ir.op_input_tensor] >= 0]] = True
    return found


def sums_partials(ir: GraphIR) -> np.ndarray:
    """Per op: a *split-sum* op without batch input, which adds up partial sums (an
    ``AddN`` of partial gradients): split, each replica reads its own partials."""
    return (ir.split_category == SplitCategory.SPLIT_SUM) & ~has_batch_input(ir)


def _partial_producers(ir: GraphIR, op: int) -> list[int]:
    """The producers of the partial sums ``op`` reads."""
    inputs = ir.inputs(op)
    partial = ir.tensor_aggregation[inputs] == Aggregation.SUM
    return ir.tensor_producer[inputs[partial]].tolist()


def parameter_ops(ir: GraphIR) -> np.ndarray:
    """Per op: is it a parameter's variable, optimizer slot or update op, or a sparse
    parameter's table or slot (its lookups and updates follow it by colocation)."""
    params, tables = ir.parameters, ir.sparse_parameters
    found = np.zeros(ir.num_ops, dtype=bool)
    for ops in (params.variable_op, params.slot_op, params.region_op):
        found[ops] = True
    found[tables.variable_op] = True
    found[tables.slot_op] = True
    return found


def _rows(devices: np.ndarray, lo: np.ndarray | int, hi: np.ndarray | int) -> np.ndarray:
    """Instances as an ``(n, 3)`` int32 array of (device, lo, hi)."""
    rows = np.empty((len(devices), 3), dtype=np.int32)
    rows[:, 0], rows[:, 1], rows[:, 2] = devices, lo, hi
    return rows


def _placed(mode: Mode, rows: np.ndarray) -> tuple[int, np.ndarray]:
    """``(mode, rows)``; one replica, or one GPU: nothing is split or copied."""
    return int(Mode.SINGLE if len(rows) == 1 else mode), rows


class _GroupLayout:
    """``(mode, rows)`` for each kind of op of one group (the rules of :func:`place`)."""

    def __init__(self, resolved: ResolvedStrategy, group: int, batch: int) -> None:
        option = resolved.option(group)
        replica_devices, weights = resolved.replicas(group)
        bounds = micro_batch_slices(weights, batch, int(resolved.group_micro_batches[group]))
        devices = resolved.devices(group)
        if option in (Option.REPLICATE_ALLREDUCE, Option.REPLICATE_PS):
            # a GPU whose replicas get no rows (more replicas than examples) is left out
            devices = np.unique(replica_devices[np.diff(bounds) > 0])
        everywhere = _placed(Mode.DUPLICATE, _rows(devices, 0, batch))
        self.model_parallel = option == Option.MODEL_PARALLEL
        if option == Option.DUPLICATE:
            self.parameter = self.no_batch = self.no_split = self.split = everywhere
            return
        if option == Option.REPLICATE_PS:
            ps = resolved.group_ps_device[group : group + 1]
            self.parameter = _placed(Mode.SINGLE, _rows(ps, 0, batch))
        else:  # mirrored parameters
            self.parameter = everywhere
        # cheap non-batch work, and SFB's duplicated gradient subgraph (TAG §4.2.3: every
        # replica computes the whole gradient)
        self.no_batch = everywhere
        self.no_split = _placed(Mode.SINGLE, everywhere[1][:1])  # on the first GPU
        rows = np.flatnonzero(bounds[1:] > bounds[:-1])
        split = _rows(replica_devices[rows], bounds[rows], bounds[rows + 1])
        self.split = _placed(Mode.SPLIT, split)


def _group_layouts(resolved: ResolvedStrategy, batch: int) -> list[_GroupLayout]:
    """Every group's layout; groups with the same decision share one (``dp-ps`` has a
    group per parameter, differing only in the PS device)."""
    shared: dict[tuple, _GroupLayout] = {}
    layouts = []
    for group in range(resolved.num_groups):
        devices, weights = resolved.replicas(group)
        option, ps = int(resolved.group_option[group]), int(resolved.group_ps_device[group])
        micro = int(resolved.group_micro_batches[group])
        key = (option, devices.tobytes(), weights.tobytes(), ps, micro)
        if key not in shared:
            shared[key] = _GroupLayout(resolved, group, batch)
        layouts.append(shared[key])
    return layouts


def place(ir: GraphIR, resolved: ResolvedStrategy) -> Placement:
    """Apply the placement rules of the module docstring to every op."""
    batch = ir.batch_size
    reads_batch = has_batch_input(ir)
    batch_input = reads_batch.tolist()
    parameter_op = parameter_ops(ir).tolist()
    no_split = (ir.split_category == SplitCategory.NONE).tolist()
    adds_partials = sums_partials(ir).tolist()
    # split-concat without a batch input: rows made from nothing (the examples' positions)
    makes_rows = ((ir.split_category == SplitCategory.SPLIT_CONCAT) & ~reads_batch).tolist()
    sfb_op = resolved.sfb_op.tolist()
    layouts = _group_layouts(resolved, batch)
    on_device: dict[int, tuple[int, np.ndarray]] = {}  # model-parallel placements

    modes: list[int] = []
    rows: list[np.ndarray] = []
    for op, group in enumerate(resolved.op_group.tolist()):
        layout = layouts[group]
        if layout.model_parallel:
            device = int(resolved.op_device[op])
            if device not in on_device:
                on_device[device] = _placed(Mode.SINGLE, _rows(np.array([device]), 0, batch))
            mode, placed = on_device[device]
        elif parameter_op[op]:  # variables, optimizer slots and updates
            mode, placed = layout.parameter
        elif (
            adds_partials[op]
            and not sfb_op[op]
            and all(
                modes[p] == layout.split[0] and np.array_equal(rows[p], layout.split[1])
                for p in _partial_producers(ir, op)
            )
        ):
            mode, placed = layout.split
        elif (not batch_input[op] and not makes_rows[op]) or sfb_op[op]:
            mode, placed = layout.no_batch
        elif no_split[op]:  # stateful ops are here too
            mode, placed = layout.no_split
        else:
            mode, placed = layout.split
        modes.append(mode)
        rows.append(placed)

    # colocated ops (reads, updates, slots) follow their variable's placement
    variable_of, split_mode = _variable_of_class(ir), int(Mode.SPLIT)
    for op, colocation in enumerate(ir.colocation.tolist()):
        variable = variable_of.get(colocation)
        if variable is None or variable == op:
            continue
        mirrors = set(rows[variable][:, 0].tolist())
        if modes[op] == split_mode and mirrors.issuperset(rows[op][:, 0].tolist()):
            continue  # a split read (an embedding lookup) of a variable mirrored on its GPUs
        modes[op], rows[op] = modes[variable], rows[variable]

    ptr = np.zeros(ir.num_ops + 1, dtype=np.int32)
    ptr[1:] = np.cumsum([len(r) for r in rows])
    flat = np.concatenate(rows) if rows else np.zeros((0, 3), dtype=np.int32)
    return Placement(
        op_mode=np.array(modes, dtype=np.int8),
        inst_ptr=ptr,
        inst_device=np.ascontiguousarray(flat[:, 0]),
        inst_lo=np.ascontiguousarray(flat[:, 1]),
        inst_hi=np.ascontiguousarray(flat[:, 2]),
        batch_size=batch,
    )
