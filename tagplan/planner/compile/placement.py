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
from functools import lru_cache

import numpy as np

from tagplan.planner.csr import row_ranges
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


def _group_layouts(resolved: ResolvedStrategy, batch: int) -> tuple[list[_GroupLayout], np.ndarray]:
    """The distinct layouts of the groups and each group's index among them; groups with
    the same decision share one (``dp-ps`` has a group per parameter, differing only in
    the PS device)."""
    shared: dict[tuple, int] = {}
    layouts: list[_GroupLayout] = []
    layout_of = np.zeros(resolved.num_groups, dtype=np.int64)
    for group in range(resolved.num_groups):
        devices, weights = resolved.replicas(group)
        option, ps = int(resolved.group_option[group]), int(resolved.group_ps_device[group])
        micro = int(resolved.group_micro_batches[group])
        key = (option, devices.tobytes(), weights.tobytes(), ps, micro)
        if key not in shared:
            shared[key] = len(layouts)
            layouts.append(_GroupLayout(resolved, group, batch))
        layout_of[group] = shared[key]
    return layouts, layout_of


# what a layout places each op as, in the order of its choices (:func:`place`)
_PARAMETER, _NO_BATCH, _NO_SPLIT, _SPLIT = range(4)


@dataclass(frozen=True, eq=False)
class _OpFacts:
    """What the rules read of a graph alone, the same for every strategy placed on it."""

    kinds: np.ndarray  # the layout's placement each op takes, before SFB (_PARAMETER, ...)
    parameter: np.ndarray  # bool per op: parameter_ops
    partial_producers: dict[int, list[int]]  # per op that sums partials: their producers
    followers: np.ndarray  # ops colocated with a variable of their class, not it
    variable: np.ndarray  # each follower's variable


@lru_cache(maxsize=8)
def _op_facts(ir: GraphIR) -> _OpFacts:
    """:class:`_OpFacts` of ``ir``, worked out once per graph: the kinds by the rules of
    the module docstring (variables, optimizer slots and updates first, then cheap
    non-batch work, ops that cannot be split, the batch-splittable rest), the producers of
    the partial sums each op that adds them up reads, and each colocated op's variable (the
    class's first op holding bytes)."""
    reads_batch = has_batch_input(ir)
    # split-concat without a batch input: rows made from nothing (the examples' positions)
    makes_rows = (ir.split_category == SplitCategory.SPLIT_CONCAT) & ~reads_batch
    parameter = parameter_ops(ir)
    kinds = np.full(ir.num_ops, _SPLIT, dtype=np.int64)
    kinds[ir.split_category == SplitCategory.NONE] = _NO_SPLIT  # stateful ops are here too
    kinds[~reads_batch & ~makes_rows] = _NO_BATCH
    kinds[parameter] = _PARAMETER
    partial_producers = {}
    for op in np.flatnonzero(sums_partials(ir) & ~parameter).tolist():
        inputs = ir.inputs(op)
        partial = ir.tensor_aggregation[inputs] == Aggregation.SUM
        partial_producers[op] = ir.tensor_producer[inputs[partial]].tolist()
    variable_of: dict[int, int] = {}  # colocation class -> its variable
    for op in np.flatnonzero(ir.variable_bytes > 0).tolist():
        variable_of.setdefault(int(ir.colocation[op]), op)
    variable = np.array([variable_of.get(c, -1) for c in ir.colocation.tolist()], np.int64)
    followers = np.flatnonzero((variable >= 0) & (variable != np.arange(ir.num_ops)))
    return _OpFacts(kinds, parameter, partial_producers, followers, variable[followers])


def place(ir: GraphIR, resolved: ResolvedStrategy) -> Placement:
    """Apply the placement rules of the module docstring to every op. Each op takes one of
    a few *choices* (a mode and its instances: a layout's placement of one kind of op,
    or a model-parallel op's GPU), so the rules run over arrays of choice numbers and the
    instances are gathered once."""
    batch = ir.batch_size
    layouts, layout_of = _group_layouts(resolved, batch)
    choices = [
        placed
        for layout in layouts
        for placed in (layout.parameter, layout.no_batch, layout.no_split, layout.split)
    ]
    facts = _op_facts(ir)
    kinds = facts.kinds.copy()
    kinds[resolved.sfb_op & ~facts.parameter] = _NO_BATCH  # SFB's duplicated gradient subgraph
    op_group = resolved.op_group.astype(np.int64)
    choice = layout_of[op_group] * 4 + kinds
    model_parallel = np.array([layout.model_parallel for layout in layouts])[layout_of][op_group]
    if model_parallel.any():
        devices, index = np.unique(resolved.op_device[model_parallel], return_inverse=True)
        choice[model_parallel] = len(choices) + index
        choices += [_placed(Mode.SINGLE, _rows(np.array([d]), 0, batch)) for d in devices]
    for op, producers in facts.partial_producers.items():  # in graph order: producers first
        if resolved.sfb_op[op] or model_parallel[op]:
            continue
        split = int(layout_of[op_group[op]]) * 4 + _SPLIT
        if all(_same_placement(choices[int(choice[p])], choices[split]) for p in producers):
            choice[op] = split
    _follow_variables(facts, choices, choice)
    return _gathered(choices, choice, batch)


def _same_placement(a: tuple[int, np.ndarray], b: tuple[int, np.ndarray]) -> bool:
    return a is b or (a[0] == b[0] and np.array_equal(a[1], b[1]))


def _follow_variables(
    facts: _OpFacts, choices: list[tuple[int, np.ndarray]], choice: np.ndarray
) -> None:
    """Colocated ops (reads, updates, slots) take their variable's choice, but for a split
    read (an embedding lookup) of a variable mirrored on its GPUs."""
    follows, variable = facts.followers, facts.variable
    if not len(follows):
        return
    pairs = np.stack([choice[follows], choice[variable]], axis=1)
    unique, inverse = np.unique(pairs, axis=0, return_inverse=True)
    split_mode = int(Mode.SPLIT)
    keeps = np.array(
        [
            choices[own][0] == split_mode
            and set(choices[mirror][1][:, 0].tolist()).issuperset(choices[own][1][:, 0].tolist())
            for own, mirror in unique.tolist()
        ],
        dtype=bool,
    )
    moved = ~keeps[inverse.reshape(-1)]
    choice[follows[moved]] = choice[variable[moved]]


def _gathered(choices: list[tuple[int, np.ndarray]], choice: np.ndarray, batch: int) -> Placement:
    """The placement of ops taking ``choices[choice[op]]``."""
    rows = [placed[1] for placed in choices]
    choice_ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    choice_ptr[1:] = np.cumsum([len(r) for r in rows])
    instances, counts = row_ranges(choice_ptr, choice)
    flat = np.concatenate(rows)[instances]
    ptr = np.zeros(len(choice) + 1, dtype=np.int32)
    ptr[1:] = np.cumsum(counts)
    modes = np.array([placed[0] for placed in choices], dtype=np.int8)
    return Placement(
        op_mode=modes[choice],
        inst_ptr=ptr,
        inst_device=np.ascontiguousarray(flat[:, 0]),
        inst_lo=np.ascontiguousarray(flat[:, 1]),
        inst_hi=np.ascontiguousarray(flat[:, 2]),
        batch_size=batch,
    )
