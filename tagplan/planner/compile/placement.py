"""Where every op instance runs under a strategy: the first half of the rewrite rules
(TAG §4.3.1), shared by the task-graph and GraphDef back ends.

Per op, from its group's decision and its split category (TAG §4.1.1):

* a ``replicate-*`` group runs its batch-splittable ops (*split-concat*, *split-sum*) as
  one instance per replica, each on a contiguous share of the batch (:attr:`Mode.SPLIT`);
  its other ops run once on the group's first GPU when they read batch data (a loss
  ``Mean`` needs the whole batch), or on every GPU of the group when they do not (a
  weight read or transform is cheaper to repeat than to send);
* parameters follow their synchronization (TAG §4.2): with AllReduce the variable, its
  optimizer slots and its update are mirrored on every GPU of the group (identical
  initial values, identical updates); with a parameter server they live on the PS GPU;
* a ``duplicate`` group runs every op on every GPU of the group with the full batch;
* a ``model-parallel`` group runs each op once on the GPU the strategy assigned it.

Ops TensorFlow must colocate (a variable with its reads and updates) take the placement
of the class's variable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tagplan.planner.graph.batch import SplitCategory
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.strategy import Mode, Option, ResolvedStrategy

__all__ = ["Placement", "batch_slices", "place"]


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


def _variable_of_class(ir: GraphIR) -> dict[int, int]:
    """Colocation class -> its variable op (the class's first op holding bytes)."""
    found: dict[int, int] = {}
    for op in np.flatnonzero(ir.variable_bytes > 0).tolist():
        found.setdefault(int(ir.colocation[op]), op)
    return found


def place(ir: GraphIR, resolved: ResolvedStrategy) -> Placement:
    """Apply the placement rules of the module docstring to every op."""
    batch = ir.batch_size
    has_batch_input = np.zeros(ir.num_ops, dtype=bool)
    for op in range(ir.num_ops):
        has_batch_input[op] = bool((ir.tensor_batch_axis[ir.inputs(op)] >= 0).any())
    parameter_ops: dict[int, int] = {}  # op -> parameter row, for variables, slots, updates
    params = ir.parameters
    for row in range(len(params)):
        parameter_ops[int(params.variable_op[row])] = row
        for op in params.slot_op[params.slot_ptr[row] : params.slot_ptr[row + 1]]:
            parameter_ops[int(op)] = row
        for op in params.region_op[params.region_ptr[row] : params.region_ptr[row + 1]]:
            parameter_ops[int(op)] = row

    modes = np.zeros(ir.num_ops, dtype=np.int8)
    rows: list[list[tuple[int, int, int]]] = [[] for _ in range(ir.num_ops)]
    slices_of_group: dict[int, np.ndarray] = {}

    def full_on(devices: np.ndarray) -> list[tuple[int, int, int]]:
        return [(int(d), 0, batch) for d in devices]

    for op in range(ir.num_ops):
        group = int(resolved.op_group[op])
        option = resolved.option(group)
        replica_devices, weights = resolved.replicas(group)
        bounds = slices_of_group.get(group)
        if bounds is None:
            bounds = slices_of_group[group] = batch_slices(weights, batch)
        devices = resolved.devices(group)
        if option in (Option.REPLICATE_ALLREDUCE, Option.REPLICATE_PS):
            # a GPU whose replicas get no rows (more replicas than examples) is left out
            devices = np.unique(replica_devices[np.diff(bounds) > 0])
        if option == Option.MODEL_PARALLEL:
            modes[op], rows[op] = Mode.SINGLE, full_on(resolved.op_device[op : op + 1])
        elif option == Option.DUPLICATE:
            modes[op], rows[op] = Mode.DUPLICATE, full_on(devices)
        elif op in parameter_ops and option == Option.REPLICATE_PS:
            ps = resolved.group_ps_device[group : group + 1]
            modes[op], rows[op] = Mode.SINGLE, full_on(ps)
        elif op in parameter_ops or not has_batch_input[op] or resolved.sfb_op[op]:
            # mirrored state, cheap non-batch work, and SFB's duplicated gradient subgraph
            # (TAG §4.2.3: every replica computes the whole gradient)
            modes[op], rows[op] = Mode.DUPLICATE, full_on(devices)
        elif ir.split_category[op] == SplitCategory.NONE:  # stateful ops are here too
            modes[op], rows[op] = Mode.SINGLE, full_on(devices[:1])
        else:
            modes[op] = Mode.SPLIT
            rows[op] = [
                (int(d), int(bounds[r]), int(bounds[r + 1]))
                for r, d in enumerate(replica_devices)
                if bounds[r + 1] > bounds[r]
            ]
        if len(rows[op]) == 1:  # one replica, or one GPU: nothing is split or copied
            modes[op] = Mode.SINGLE

    # colocated ops (reads, updates, slots) follow their variable's placement
    variable_of = _variable_of_class(ir)
    for op in range(ir.num_ops):
        variable = variable_of.get(int(ir.colocation[op]))
        if variable is None or variable == op:
            continue
        mirrors = {row[0] for row in rows[variable]}
        if modes[op] == Mode.SPLIT and {row[0] for row in rows[op]} <= mirrors:
            continue  # a split read (an embedding lookup) of a variable mirrored on its GPUs
        modes[op], rows[op] = modes[variable], list(rows[variable])

    ptr = np.zeros(ir.num_ops + 1, dtype=np.int32)
    ptr[1:] = np.cumsum([len(r) for r in rows])
    flat = [entry for row in rows for entry in row]
    return Placement(
        op_mode=modes,
        inst_ptr=ptr,
        inst_device=np.array([e[0] for e in flat], dtype=np.int32),
        inst_lo=np.array([e[1] for e in flat], dtype=np.int32),
        inst_hi=np.array([e[2] for e in flat], dtype=np.int32),
        batch_size=batch,
    )
