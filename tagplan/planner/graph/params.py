"""Trainable parameters, their gradients, the ops that apply them, and optimizer slots.

Two graph styles occur (docs/design.md §2):

* TF1 style: each parameter is updated by one fused apply op (``ResourceApplyAdam``,
  ``ApplyGradientDescent``, ...). Its ``var`` input is the parameter, its ``grad`` input
  the gradient, and its other variable inputs (``m``, ``v``, ``accum``) the slots.
* TF2 concrete functions: variables are captured as ``DT_RESOURCE`` placeholders and a
  Keras optimizer is decomposed into elementwise ops ending in ``AssignSubVariableOp`` /
  ``AssignVariableOp`` / ``AssignAddVariableOp``. A variable is a parameter when a read of
  it reaches the loss and a write to it depends on the batch; its *update region* is grown
  backwards from that write over ops that touch no batch tensor and feed nothing else,
  pulling in the writes of every slot variable read there. The gradient is the one
  batch-dependent tensor that enters the region.

TAG §4.1.1 keeps a parameter with its apply op and optimizer slots; the region is what
the grouping must keep together.

*Sparse parameters* are trainable variables updated through scatter ops, as optimizers
update embedding tables from ``IndexedSlices`` gradients: TF1's Adam scatters into its
slots and then assigns the whole table, its gradient descent scatters into the table,
Keras's SGD and Adagrad scatter into table and accumulator. Their gradient is rows x width
for the batch's ids, not the table, so there is no one gradient tensor to synchronize;
they are found (a variable the loss reads, through a gather or a read, and that a
batch-dependent write or scatter updates, that no dense rule claimed) and counted, with
their slots (variables scattered into whose values flow only into that table's update),
and the compiler places their update ops like any other op.

Why one module: the dense rules and the sparse rule read the same maps of a graph's
variables (their reads, writes, scatters and uses) and each must leave to the other what
it does not claim.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType

import numpy as np

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.parsed import ParsedGraph, attr_value, shape_from_proto
from tagplan.planner.graph.protos import DT_RESOURCE, DTYPE_BYTES, op_registry

__all__ = [
    "SCATTER_OPS",
    "VARIABLE_OPS",
    "WRITE_OPS",
    "FoundParameters",
    "ParameterInfo",
    "SparseParameterInfo",
    "find_parameters",
    "is_variable",
    "variable_bytes",
    "variable_reads",
    "variable_source",
]

VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})
WRITE_OPS = frozenset(
    {
        "AssignVariableOp",
        "AssignSubVariableOp",
        "AssignAddVariableOp",
        "Assign",
        "AssignSub",
        "AssignAdd",
    }
)
SCATTER_OPS = frozenset(
    f"{prefix}Scatter{nd}{kind}"
    for prefix in ("Resource", "")
    for nd in ("", "Nd")
    for kind in ("Add", "Sub", "Update", "Mul", "Div", "Min", "Max")
)
"""Ops that write rows of a variable (``indices``, ``updates``) through its first input."""
_PASS_THROUGH = frozenset({"Identity", "IdentityN"})
_GATHER_OPS = frozenset({"ResourceGather", "ResourceGatherNd", "Gather", "GatherV2", "GatherNd"})


@dataclass(eq=False)
class ParameterInfo:
    """One trainable parameter. Indices are node indices of the parsed graph."""

    variable: int
    gradient: tuple[int, int]  # (producer node, output slot)
    apply: int
    slots: list[int] = field(default_factory=list)
    region: list[int] = field(default_factory=list)  # update ops kept with the parameter
    bytes: int = 0
    slot_bytes: int = 0


@dataclass(eq=False)
class SparseParameterInfo:
    """A trainable variable updated through scatter ops (see the module docstring).
    Indices are node indices of the parsed graph; ``bytes`` is 0 when the graph gives no
    shape for the variable (a captured resource that is only gathered and scattered)."""

    variable: int
    updates: list[int]  # the batch-dependent writes of the variable and of its slots
    slots: list[int] = field(default_factory=list)
    bytes: int = 0
    slot_bytes: int = 0


@dataclass(eq=False)
class FoundParameters:
    """Every trainable parameter of a graph: dense ones and sparse ones."""

    dense: list[ParameterInfo]
    sparse: list[SparseParameterInfo]


def is_variable(graph: ParsedGraph, node: int) -> bool:
    op = graph.ops[node]
    if op in VARIABLE_OPS:
        return True
    return op == "Placeholder" and attr_value(graph.nodes[node], "dtype") == DT_RESOURCE


def variable_source(graph: ParsedGraph, producer: int, slot: int = 0) -> int | None:
    """The variable node a resource (or ref) tensor comes from, through identities."""
    while graph.ops[producer] in _PASS_THROUGH and graph.data_inputs[producer]:
        producer, slot = graph.data_inputs[producer][
            slot if graph.ops[producer] == "IdentityN" else 0
        ]
    return producer if is_variable(graph, producer) else None


def variable_bytes(
    graph: ParsedGraph,
    reads: dict[int, list[int]],
    variable: int,
    writes: dict[int, list[int]] | None = None,
) -> int:
    """Bytes of a variable's value: its ``shape``/``dtype`` attributes, the handle data of a
    captured resource, or else what a read of it (``reads[variable]``) produces or a whole
    write to it (``writes[variable]``: the value assigned) takes."""
    node = graph.nodes[variable]
    shape, dtype = attr_value(node, "shape"), attr_value(node, "dtype")
    if dtype == DT_RESOURCE:
        shapes = node.attr["_handle_shapes"].list.shape if "_handle_shapes" in node.attr else []
        dtypes = attr_value(node, "_handle_dtypes") or []
        shape = shape_from_proto(shapes[0]) if shapes else None
        dtype = dtypes[0] if dtypes else None
    values = [(r, 0) for r in reads.get(variable, [])]
    for write in (writes or {}).get(variable, []):
        if graph.ops[write] in WRITE_OPS and len(graph.data_inputs[write]) > 1:
            values.append(graph.data_inputs[write][1])
    for producer, slot in values:
        if shape is None or dtype is None or -1 in shape:
            shape = graph.output_shapes[producer][slot]
            dtype = graph.output_dtypes[producer][slot]
    if shape is None or dtype is None:
        return 0
    return math.prod(max(d, 0) for d in shape) * DTYPE_BYTES.get(dtype, 4)


def variable_reads(graph: ParsedGraph) -> dict[int, list[int]]:
    """The ``ReadVariableOp`` nodes of each variable."""
    reads: dict[int, list[int]] = {}
    for node, inputs in enumerate(graph.data_inputs):
        if graph.ops[node] == "ReadVariableOp" and inputs:
            variable = variable_source(graph, *inputs[0])
            if variable is not None:
                reads.setdefault(variable, []).append(node)
    return reads


@cache
def _input_positions(op_type: str) -> Mapping[str, int] | None:
    """Each input argument's position in ``op_type``'s inputs (None for an unknown op or
    one with variable-length inputs); asked for every node, so kept per op type."""
    op_def = op_registry().get(op_type)
    if op_def is None or any(a.number_attr or a.type_list_attr for a in op_def.input_arg):
        return None
    return MappingProxyType({arg.name: position for position, arg in enumerate(op_def.input_arg)})


def _gradient_argument(op_type: str) -> str | None:
    """The input that carries the gradient: ``grad`` (Adam, Momentum, ...) or ``delta``
    (gradient descent), for ops that update a ``var`` input."""
    positions = _input_positions(op_type)
    if positions is None or "var" not in positions:
        return None
    return next((name for name in ("grad", "delta") if name in positions), None)


def batch_dependence(
    graph: ParsedGraph, batch_inputs: list[int], *, through_control: bool = False
) -> np.ndarray:
    """Per node: does it depend, transitively, on a batch input?

    Over data edges only, or also over control edges: a variable read ordered after a
    batch-dependent write sees the batch through the variable's state.
    """
    depends = [False] * graph.num_nodes  # a list: read element by element below
    for node in batch_inputs:
        depends[node] = True
    for node in graph.topo_order.tolist():
        if not depends[node]:
            depends[node] = any(depends[p] for p, _ in graph.data_inputs[node]) or (
                through_control and any(depends[p] for p in graph.control_inputs[node])
            )
    return np.array(depends, dtype=bool)


# Training-mode batch norm reads its running mean and variance (inputs 3 and 4) only to
# update them: they do not reach the normalized output the loss is computed from.
_BATCH_NORMS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})


def _loss_ancestors(graph: ParsedGraph, loss: int) -> np.ndarray:
    """Nodes whose value the loss depends on, over data edges."""
    seen = np.zeros(graph.num_nodes, dtype=bool)
    queue = deque([loss])
    seen[loss] = True
    while queue:
        node = queue.popleft()
        inputs = graph.data_inputs[node]
        if graph.ops[node] in _BATCH_NORMS and attr_value(graph.nodes[node], "is_training", True):
            inputs = inputs[:3]
        for producer, _ in inputs:
            if not seen[producer]:
                seen[producer] = True
                queue.append(producer)
    return seen


class _Finder:
    def __init__(
        self,
        graph: ParsedGraph,
        depends: np.ndarray,
        updated_by_batch: np.ndarray,
        touches_batch: np.ndarray,
        loss: int | None,
    ) -> None:
        self.graph = graph
        self.depends = depends
        self.updated_by_batch = updated_by_batch
        self.touches_batch = touches_batch
        self.loss = loss
        self.consumers = graph.consumers()
        self.reads = variable_reads(graph)
        self.writes: dict[int, list[int]] = {}
        self.scatters: dict[int, list[int]] = {}
        self.uses: dict[int, list[int]] = {}  # reads, gathers: ops taking the handle to read
        for node, inputs in enumerate(graph.data_inputs):
            op = graph.ops[node]
            if not inputs:
                continue
            if op in WRITE_OPS or op in SCATTER_OPS:
                variable = variable_source(graph, *inputs[0])
                if variable is not None:
                    target = self.writes if op in WRITE_OPS else self.scatters
                    target.setdefault(variable, []).append(node)
                continue
            if _gradient_argument(op) is not None or op in _PASS_THROUGH:
                continue
            for producer, slot in inputs:
                variable = variable_source(graph, producer, slot)
                if variable is not None:
                    self.uses.setdefault(variable, []).append(node)

    def fused(self) -> list[ParameterInfo]:
        graph = self.graph
        found: list[ParameterInfo] = []
        for node, op in enumerate(graph.ops):
            gradient_argument = _gradient_argument(op)
            if gradient_argument is None:
                continue
            positions = _input_positions(op)
            assert positions is not None
            inputs = graph.data_inputs[node]
            variable = variable_source(graph, *inputs[positions["var"]])
            if variable is None:
                raise InvalidInput(f"apply op {graph.names[node]!r} does not update a variable")
            slots = []
            for name, position in positions.items():
                if name in ("var", gradient_argument):
                    continue
                slot_variable = variable_source(graph, *inputs[position])
                if slot_variable is not None:
                    slots.append(slot_variable)
            found.append(
                ParameterInfo(
                    variable=variable,
                    gradient=inputs[positions[gradient_argument]],
                    apply=node,
                    slots=slots,
                    region=[node],
                )
            )
        return found

    def _reaches_loss(self, variable: int, loss_ancestors: np.ndarray | None) -> bool:
        uses = self.uses.get(variable, [])
        if loss_ancestors is not None:
            return any(loss_ancestors[u] for u in uses)
        return any(
            self.touches_batch[u] or any(self.touches_batch[c] for c, _, _ in self.consumers[u])
            for u in uses
        )

    def _scattered_by_batch(self, variable: int) -> bool:
        return any(self.updated_by_batch[w] for w in self.scatters.get(variable, []))

    def decomposed(self) -> list[ParameterInfo]:
        loss_ancestors = _loss_ancestors(self.graph, self.loss) if self.loss is not None else None
        candidates = [
            v
            for v, writes in self.writes.items()
            if any(self.updated_by_batch[w] for w in writes)
            and self._reaches_loss(v, loss_ancestors)
            and not self._scattered_by_batch(v)
        ]
        found: list[ParameterInfo] = []
        for variable in candidates:
            writes = [w for w in self.writes[variable] if self.updated_by_batch[w]]
            if len(writes) != 1:
                names = [self.graph.names[w] for w in writes]
                raise InvalidInput(
                    f"parameter {self.graph.names[variable]!r} is written by {len(writes)} "
                    f"batch-dependent ops {names}; expected one update"
                )
            info = self._region(variable, writes[0])
            if info is not None:
                found.append(info)
        return found

    def _gathered(self, variable: int) -> bool:
        """Is the variable read by rows (an embedding lookup): a gather of its handle or of
        a read of it?"""
        return any(
            self.graph.ops[u] in _GATHER_OPS
            or any(self.graph.ops[c] in _GATHER_OPS and i == 0 for c, i, _ in self.consumers[u])
            for u in self.uses.get(variable, [])
        )

    def _region(self, variable: int, write: int) -> ParameterInfo | None:
        """The parameter updated by ``write`` with its update region and gradient; None for
        an embedding table whose update several gradient tensors enter (Keras densifies an
        ``IndexedSlices`` gradient once per slot): a sparse parameter."""
        graph = self.graph
        region = {write}
        slots: list[int] = []
        queue = deque([write])
        while queue:
            node = queue.popleft()
            for producer, _ in graph.data_inputs[node]:
                if producer in region or self.touches_batch[producer]:
                    continue
                if is_variable(graph, producer):
                    continue
                read_of = (
                    variable_source(graph, *graph.data_inputs[producer][0])
                    if graph.ops[producer] == "ReadVariableOp"
                    else None
                )
                if read_of is not None and read_of != variable and read_of not in slots:
                    slot_writes = [
                        w for w in self.writes.get(read_of, []) if self.updated_by_batch[w]
                    ]
                    if slot_writes:
                        slots.append(read_of)
                        for slot_write in slot_writes:
                            if slot_write not in region:
                                region.add(slot_write)
                                queue.append(slot_write)
                if not all(c in region for c, _, _ in self.consumers[producer]):
                    continue
                region.add(producer)
                queue.append(producer)
        entering = {
            (producer, slot)
            for node in region
            for producer, slot in graph.data_inputs[node]
            if producer not in region and self.depends[producer]
        }
        if len(entering) > 1 and self._gathered(variable):
            return None
        if len(entering) != 1:
            names = sorted(f"{graph.names[p]}:{s}" for p, s in entering)
            raise InvalidInput(
                f"cannot identify the gradient of parameter {graph.names[variable]!r}: "
                f"{len(entering)} batch-dependent tensors enter its update ({names[:4]})"
            )
        order = {n: i for i, n in enumerate(graph.topo_order.tolist())}
        return ParameterInfo(
            variable=variable,
            gradient=entering.pop(),
            apply=write,
            slots=slots,
            region=sorted(region, key=order.__getitem__),
        )

    def sparse(self, dense: list[ParameterInfo]) -> list[SparseParameterInfo]:
        """Variables the loss reads and a batch-dependent write or scatter updates, that no
        dense rule claimed, and the slots of each: variables updated from the batch, which
        the loss does not read, whose values reach the updates of that one variable only."""
        claimed = {i.variable for i in dense} | {s for i in dense for s in i.slots}
        dense_updates = {n for i in dense for n in i.region}
        loss_ancestors = _loss_ancestors(self.graph, self.loss) if self.loss is not None else None
        updated = sorted(set(self.writes) | set(self.scatters))
        batch_writes = {
            v: [
                w
                for w in self.writes.get(v, []) + self.scatters.get(v, [])
                if self.updated_by_batch[w]
            ]
            for v in updated
            if v not in claimed
        }
        tables = [
            v
            for v, writes in batch_writes.items()
            if writes and self._reaches_loss(v, loss_ancestors)
        ]
        owner = {w: v for v in tables for w in batch_writes[v]}
        found = {v: SparseParameterInfo(variable=v, updates=list(batch_writes[v])) for v in tables}
        for slot, writes in batch_writes.items():
            if slot in found or not writes:
                continue
            owners = self._updates_reached(slot, owner, dense_updates)
            if len(owners) == 1:
                info = found[owners.pop()]
                info.slots.append(slot)
                info.updates.extend(writes)
        return [found[v] for v in tables]

    def _updates_reached(
        self, variable: int, owner: dict[int, int], dense_updates: set[int]
    ) -> set[int]:
        """Whose updates the values of ``variable`` flow into, over data edges; a value
        that also reaches a dense parameter's update is shared optimizer state (a step
        counter, Adam's powers), nobody's slot."""
        seen = set(self.uses.get(variable, []))
        queue = deque(seen)
        owners: set[int] = set()
        while queue:
            node = queue.popleft()
            if node in owner:
                owners.add(owner[node])
                continue
            if node in dense_updates or _gradient_argument(self.graph.ops[node]) is not None:
                return set()
            for consumer, _, _ in self.consumers[node]:
                if consumer not in seen:
                    seen.add(consumer)
                    queue.append(consumer)
        return owners


def find_parameters(
    graph: ParsedGraph,
    *,
    batch_inputs: list[int],
    touches_batch: np.ndarray,
    loss: int | None,
) -> FoundParameters:
    """Every trainable parameter: dense ones with their gradient, apply op and slots, and
    sparse ones with their updates and slots.

    ``touches_batch[n]`` says whether node ``n`` has an input or output carrying the batch
    dimension; ``loss`` is the loss node when known (needed for TF2-style graphs, and to
    tell sparse parameters from state such as batch-norm running averages).
    """
    finder = _Finder(
        graph,
        batch_dependence(graph, batch_inputs),
        batch_dependence(graph, batch_inputs, through_control=True),
        touches_batch,
        loss,
    )
    # A graph with fused apply ops (TF1 optimizers) updates every parameter with one;
    # its other batch-dependent writes are state such as batch-norm running averages.
    found = finder.fused() or finder.decomposed()
    for info in found:
        info.bytes = variable_bytes(graph, finder.reads, info.variable)
        info.slot_bytes = sum(variable_bytes(graph, finder.reads, slot) for slot in info.slots)
    sparse = finder.sparse(found) if loss is not None else []
    for table in sparse:
        table.bytes = variable_bytes(graph, finder.reads, table.variable, finder.writes)
        slot_sizes = [variable_bytes(graph, finder.reads, s, finder.writes) for s in table.slots]
        table.slot_bytes = sum(slot_sizes)
        if not table.bytes:  # only gathered and scattered: optimizer slots have its shape
            table.bytes = max(slot_sizes, default=0)
    if not found and sparse:
        raise InvalidInput(
            f"graph updates only sparse parameters ({graph.names[sparse[0].variable]!r}, ...): "
            "tagplan plans graphs with at least one densely updated parameter"
        )
    if not found:
        raise InvalidInput(
            "graph has no trainable parameters: no apply op (e.g. ResourceApplyAdam) and no "
            "batch-dependent variable update reaching the loss; is it a training graph?"
        )
    seen: dict[int, int] = {}
    for info in found:
        if info.variable in seen:
            raise InvalidInput(
                f"parameter {graph.names[info.variable]!r} is updated by two apply ops"
            )
        seen[info.variable] = info.apply
    return FoundParameters(found, sparse)
