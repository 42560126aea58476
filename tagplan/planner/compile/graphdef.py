"""Strategy -> distributed TensorFlow ``GraphDef``: the second half of the rewrite rules
(TAG §4.3.1) for the execution engine (docs/design.md §5).

The rules are the transport planner's (:mod:`.transport`), shared with the task graph
(:mod:`.task_compiler`) over the same :class:`~.placement.Placement`, so the simulated and
the executed graph agree instance for instance and auxiliary op for auxiliary op; here
its decisions become nodes:

* every op instance is a copy of the original ``NodeDef`` named ``<name>/replica_<k>``
  (the original name when the op has one instance), on
  ``/job:worker/replica:0/task:<machine index>/device:GPU:<local index>``, with
  ``_output_shapes`` at its local batch and ``_class`` colocation hints removed (devices
  are explicit);
* a split instance reading a whole tensor reads a ``Slice`` of a copy of it; a whole
  reader of split outputs reads their ``ConcatV2`` on the batch axis; partial sums are
  added by ``AddN`` (per-replica batch statistics by a weighted sum: ``Mul`` by the
  replica's share of the batch, then ``AddN``); different replica layouts get a
  ``ConcatV2`` then ``Slice``; per-replica shape tensors are read by the same replica;
* partial sums read by mirrored ops on the partials' GPUs (gradients of mirrored
  parameters) are summed by one AllReduce: ``NcclAllReduce`` (one node per GPU, shared
  ``shared_name``) when every member is on one machine, ``CollectiveReduceV2``
  (``merge_op=Add``, ``final_op=Id``; one group key per member set, one instance key per
  reduction) across machines; several replicas on one GPU are added locally first, and
  a mirror on a GPU without batch rows reads a member's sum;
* a tensor crosses to another GPU by plain edges: TensorFlow's partitioner sends it once
  per destination device, as the task graph's transfers;
* a group's ``after-backward`` gradient sync is a ``NoOp`` barrier that its AllReduces
  wait on, behind every gradient; ``bucketed`` AllReduces are fused into buckets across
  op groups (:mod:`.buckets`, the task graph's rule) and each bucket gets such a barrier
  behind the bucket's gradients (fusing a bucket into one buffer is left to the runtime).

Variables mirrored on several GPUs are one ``VarHandleOp`` per GPU with distinct
``shared_name`` s; whoever deploys the graph gives them identical initial values. Under
a parameter server they exist once, on the PS GPU. A split instance whose shape argument
(``Reshape``'s shape, ``Conv2DBackpropInput``'s input sizes, ``Fill``, ``BroadcastTo``,
``AvgPoolGrad``, ``StridedSliceGrad``, ``ScatterNd``, ``Slice``'s size: a ``Pad``
gradient) is the op's full output shape
reads its local shape instead: a new ``Const`` when the argument is built from
constants, a ``SelectV2`` swapping the full entries for the local ones when it is
computed.

**Batch inputs.** A data placeholder has one instance per GPU of its group, as the
placement says. When everything on that GPU reads a single slice of it (data
parallelism), the ``Slice`` is folded into the feed: the placeholder
``<input>/replica_<k>`` takes only the rows ``[lo, hi)`` of the batch, and the device
map lists them, so a caller feeds each replica its own rows. Otherwise the placeholder
takes the whole batch and ``Slice`` s cut it on the GPU.

The result carries a device map (JSON-able): worker task -> machine name and GPU ids,
original variable -> its replica variable nodes, batch input -> ``(node, lo, hi)`` per
replica placeholder, the node giving the full-batch ``loss`` (gathered on its first GPU
should the loss op itself be split) and ``train_op``, a ``NoOp`` behind every update;
the ``init`` op, the Saver-compatible checkpoint ops (:mod:`.state`) and the SHA-256 of
the graph (``graph_sha256``), which a runner checks ``distributed.pb`` against.
The IR must be at the batch size the graph was built for: constants that depend on the
batch (the divisor of a mean loss) are not rewritten. Nodes are emitted as their
deterministic serialization from templates serialized once per op (:mod:`.node_bytes`);
the graph comes back as those bytes, ``graph_def`` parsing them when read.

Why one module: the GraphDef back end emits the transport planner's decisions over one
emitter's state (node names, copies, collective keys); split, the state would travel
through every call.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from tagplan.planner.compile.buckets import Bucket
from tagplan.planner.compile.node_bytes import (
    NodeStore,
    NodeTemplate,
    serialize_graph,
    shapes_attr,
    shapes_entry,
)
from tagplan.planner.compile.pipeline import (
    control_pairs,
    first_micro_batch_rows,
    micro_batched_ops,
    phase_barriers,
)
from tagplan.planner.compile.placement import Placement, place, sums_partials
from tagplan.planner.compile.state import state_ops
from tagplan.planner.compile.transport import (
    FULL,
    MEAN,
    SLICE,
    TransportRules,
    published_rows,
    split_kinds,
)
from tagplan.planner.compile.walk import Walk, default_walk
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.batch import Aggregation
from tagplan.planner.graph.constants import tensor_ints
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.params import SCATTER_OPS, VARIABLE_OPS, WRITE_OPS
from tagplan.planner.graph.protos import DT_RESOURCE, GraphDef, NodeDef, dtype_name
from tagplan.planner.strategy import Mode, ResolvedStrategy
from tagplan.planner.topology import Cluster

__all__ = [
    "AUXILIARY_KINDS",
    "CapturedVariable",
    "DistributedGraph",
    "captured_variables",
    "compile_graphdef",
    "task_map",
    "worker_device",
]

_SPLIT = int(Mode.SPLIT)
_AGGREGATE_SUM = int(Aggregation.SUM)
_DT_INT32, _DT_INT64 = 3, 9
_NUMPY = {1: np.float32, 2: np.float64, 3: np.int32, 9: np.int64, 19: np.float16}
AUXILIARY_KINDS = ("split", "concat", "addn", "allreduce")
"""Kinds of auxiliary ops, as the task graph names its tasks."""

# op type -> input position of a shape argument that names the op's full output shape
_SHAPE_ARGUMENTS = {
    "Reshape": 1,
    "Conv2DBackpropInput": 0,
    "Conv3DBackpropInputV2": 0,
    "DepthwiseConv2dNativeBackpropInput": 0,
    "BroadcastTo": 1,
    "Fill": 0,
    "AvgPoolGrad": 0,
    "AvgPool3DGrad": 0,
    "StridedSliceGrad": 0,
    "ScatterNd": 2,
    "Slice": 2,
}
# op type -> input position of a scalar that counts the rows of the op's output (its length
# along the batch axis 0): a segment count, a range's limit
_ROW_ARGUMENTS = {
    "Range": 1,
    "UnsortedSegmentSum": 2,
    "UnsortedSegmentMax": 2,
    "UnsortedSegmentMin": 2,
    "UnsortedSegmentProd": 2,
}


# ops that take a resource as a variable handle: a resource placeholder they read is one
_HANDLE_USERS = (
    frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd"}) | WRITE_OPS | SCATTER_OPS
)


class CapturedVariable(NamedTuple):
    """A variable a TF2 concrete function captures: the value behind a resource
    placeholder. ``dtype`` and ``shape`` are ``None`` where the graph does not say."""

    dtype: str | None
    shape: list[int] | None


def captured_variables(ir: GraphIR) -> dict[str, CapturedVariable]:
    """Every captured variable of the step: a resource ``Placeholder`` that an op reads,
    writes or gathers as a variable handle (docs/run-a-plan.md, "Captured variables").
    Its dtype and shape are those of the value a read produces or a whole write assigns:
    a function's GraphDef keeps no handle data on the placeholder itself."""
    found = {}
    for op in range(ir.num_ops):
        handle = ir.outputs(op).start
        if ir.op_types[op] != "Placeholder" or ir.tensor_dtype[handle] != DT_RESOURCE:
            continue
        users = ir.consumers(handle).tolist()
        if not any(ir.op_types[u] in _HANDLE_USERS for u in users):
            continue
        values = [ir.outputs(u).start for u in users if ir.op_types[u] == "ReadVariableOp"]
        values += [
            int(ir.inputs(u)[1])
            for u in users
            if ir.op_types[u] in WRITE_OPS and int(ir.inputs(u)[0]) == handle
        ]
        shapes = (ir.tensor_shapes[v] for v in values)
        known = [list(s) for s in shapes if s is not None and min(s, default=0) >= 0]
        dtype = dtype_name(int(ir.tensor_dtype[values[0]])) if values else None
        found[ir.op_names[op]] = CapturedVariable(dtype, known[0] if known else None)
    return found


def worker_device(cluster: Cluster, device: int) -> str:
    """TensorFlow device string of cluster device ``device``."""
    machine, local = int(cluster.device_machine[device]), int(cluster.device_local_index[device])
    return f"/job:worker/replica:0/task:{machine}/device:GPU:{local}"


def task_map(cluster: Cluster) -> dict[str, Any]:
    """The device map's ``tasks``: TensorFlow task index -> machine name and GPU slots."""
    return {
        str(m): {
            "machine": cluster.machine_names[m],
            "gpus": [
                int(cluster.device_local_index[d])
                for d in np.flatnonzero(cluster.device_machine == m)
            ],
        }
        for m in range(cluster.num_machines)
    }


@dataclass(frozen=True, eq=False)
class DistributedGraph:
    """A compiled graph and what a deployment needs to run it.

    ``instance_node[i]`` is the node of op instance ``i`` of ``placement``.
    ``auxiliary`` lists the auxiliary ops as ``(kind, nodes)`` with ``kind`` one of
    :data:`AUXILIARY_KINDS`: the ``Slice`` of a split (or the placeholder a split was
    folded into), the ``ConcatV2``, the ``AddN``, or the per-GPU nodes of one AllReduce.
    ``graph_def_bytes`` is the graph's deterministic serialization (what ``distributed.pb``
    holds and ``graph_sha256`` hashes); ``graph_def`` parses it when first read.
    """

    graph_def_bytes: bytes
    device_map: dict[str, Any]
    placement: Placement
    instance_node: tuple[str, ...]
    auxiliary: tuple[tuple[str, tuple[str, ...]], ...]

    @cached_property
    def graph_def(self) -> Any:
        return GraphDef.FromString(self.graph_def_bytes)

    def variable_replicas(self) -> dict[str, list[str]]:
        """Every variable of the step -> its replica nodes: the ``variables`` of a TF1
        graph and the placeholders of the ``captured_variables`` of a TF2 function."""
        captured = self.device_map.get("captured_variables", {})
        return {
            **self.device_map["variables"],
            **{n: [r["placeholder"] for r in c["replicas"]] for n, c in captured.items()},
        }

    def auxiliary_counts(self) -> dict[str, int]:
        return {k: sum(1 for kind, _ in self.auxiliary if kind == k) for k in AUXILIARY_KINDS}


class _Copy(NamedTuple):
    """One available piece of a tensor: where, which rows, what kind, which output."""

    device: int
    lo: int
    hi: int
    kind: int
    ref: str  # "node" or "node:slot"


class _GradientReduction(NamedTuple):
    """A gradient's AllReduce, kept until the gradient-sync modes are applied."""

    nodes: list[str]  # one per member GPU
    group: int  # the op group whose decision syncs it
    nbytes: int
    members: tuple[int, ...]
    inputs: list[str]  # the nodes of the summed partial gradients


def _node_of(ref: str) -> str:
    return ref.rsplit(":", 1)[0] if ":" in ref else ref


@dataclass(eq=False)
class _Emitter:
    """The output graph under construction, with unique names; the readers of the
    watched nodes (control inputs included) as nodes are added."""

    taken: set[str]
    nodes: NodeStore = field(default_factory=NodeStore)
    # references to watched nodes ("name", "^name": each has one output) -> their name
    watched: dict[str, str] = field(default_factory=dict)
    readers: dict[str, list[str]] = field(default_factory=dict)
    # the next suffix to try for a wanted name: many nodes want the same one (a restore
    # per replica), and counting from 1 each time would make naming quadratic
    _next_suffix: dict[str, int] = field(default_factory=dict)
    # the fields the nodes of one op and attrs (one constant, one original op) share
    _templates: dict[Any, NodeTemplate] = field(default_factory=dict)

    def name(self, wanted: str) -> str:
        name, k = wanted, self._next_suffix.get(wanted, 1)
        if name in self.taken:
            name = f"{wanted}_{k}"
            while name in self.taken:
                k += 1
                name = f"{wanted}_{k}"
            self._next_suffix[wanted] = k + 1
        self.taken.add(name)
        return name

    def watch(self, name: str) -> None:
        """Record the readers of node ``name`` (a node with one output) from now on."""
        self.watched[name] = self.watched[f"^{name}"] = name

    def add(self, name: str, node: Any, inputs: list[str]) -> None:
        """Add ``node`` (a ``NodeDef`` or its serialization) reading ``inputs``."""
        self.nodes[name] = node
        watched = self.watched
        for ref in inputs:
            source = watched.get(ref)
            if source is not None:
                self.readers.setdefault(source, []).append(name)

    def node(
        self,
        name: str,
        op: str,
        device: str,
        inputs: list[str],
        shapes: list[tuple[int, ...] | None] | None = None,
        **attrs: Any,
    ) -> None:
        """Add node ``name`` running ``op`` with ``attrs`` and the ``_output_shapes`` of
        ``shapes`` (left out where one is unknown), from a template per op and attrs."""
        key = (op, *((attr, type(value), value) for attr, value in sorted(attrs.items())))
        template = self.template(key, lambda: _prototype(op, attrs))
        self.emit(name, template, inputs, device, shapes)

    def const(self, wanted: str, device: str, values: np.ndarray, dtype: int) -> str:
        name = self.name(wanted)
        content = np.ascontiguousarray(values, dtype=_NUMPY[dtype]).tobytes()
        key = ("Const", dtype, values.shape, content)
        template = self.template(key, lambda: _const(values.shape, content, dtype))
        self.emit(name, template, [], device, [values.shape])
        return name

    def template(self, key: Any, prototype: Callable[[], Any]) -> NodeTemplate:
        """The template of the nodes ``key`` names, built from ``prototype()`` once."""
        found = self._templates.get(key)
        if found is None:
            found = self._templates[key] = NodeTemplate(prototype())
        return found

    def emit(
        self,
        name: str,
        template: NodeTemplate,
        inputs: list[str],
        device: str,
        shapes: list[tuple[int, ...] | None] | None,
    ) -> None:
        """Add ``template``'s node as ``name`` with its own inputs, device and shapes."""
        known = _known_shapes(shapes or [])
        entry = b"" if known is None else shapes_entry(known)
        self.add(name, template.instance(name, inputs, device, entry), inputs)


def _prototype(op: str, attrs: Mapping[str, Any]) -> Any:
    """A node of ``op`` with ``attrs`` (types by name; bools, ints, floats, strings)."""
    node = NodeDef(op=op)
    for attr, value in attrs.items():
        if isinstance(value, bool):
            node.attr[attr].b = value
        elif attr in ("T", "dtype", "Index", "Tidx", "Tlen"):
            node.attr[attr].type = value
        elif isinstance(value, int):
            node.attr[attr].i = value
        elif isinstance(value, float):
            node.attr[attr].f = value
        else:
            node.attr[attr].s = value.encode()
    return node


def _const(shape: tuple[int, ...], content: bytes, dtype: int) -> Any:
    """A ``Const`` of ``dtype`` holding ``content`` (its values' bytes) in ``shape``."""
    node = NodeDef(op="Const")
    node.attr["dtype"].type = dtype
    tensor = node.attr["value"].tensor
    tensor.dtype = dtype
    for size in shape:
        tensor.tensor_shape.dim.add().size = size
    tensor.tensor_content = content
    return node


def _known_shapes(shapes: list[tuple[int, ...] | None]) -> tuple[tuple[int, ...], ...] | None:
    """``shapes`` as the ``_output_shapes`` attribute takes them; ``None`` when one is
    unknown (or there are none): the attribute is left out."""
    if not shapes or None in shapes:
        return None
    return tuple(shapes)


def _set_shapes(node: Any, shapes: list[tuple[int, ...] | None]) -> None:
    if "_output_shapes" in node.attr:
        del node.attr["_output_shapes"]
    known = _known_shapes(shapes)
    if known is not None:
        node.attr["_output_shapes"].CopyFrom(shapes_attr(known))


class _GraphDefCompilation(TransportRules[_Copy]):
    """The rewrite rules applied to one strategy (the transport planner's,
    :mod:`.transport`, emitted as nodes)."""

    def __init__(
        self,
        graph_def: Any,
        ir: GraphIR,
        cluster: Cluster,
        resolved: ResolvedStrategy,
        variable_names: Mapping[str, str],
    ) -> None:
        if ir.batch_size != ir.graph_batch_size:
            raise InvalidInput(
                f"the graph was built for batch {ir.graph_batch_size}; compile it with the IR "
                f"at that batch, not {ir.batch_size} (batch-dependent constants are kept)"
            )
        super().__init__(resolved, ir.batch_size, cluster.device_machine.tolist())
        self.ir, self.cluster = ir, cluster
        self.variable_names = variable_names
        self.source = graph_def
        self.originals = {n.name: n for n in graph_def.node}
        missing = [n for n in ir.op_names if n not in self.originals]
        if missing:
            raise InvalidInput(f"the IR names ops {missing[:3]} that the GraphDef does not hold")
        self.placement = place(ir, resolved)
        self.adds_partials = sums_partials(ir) & (self.placement.op_mode == Mode.SPLIT)
        self.micro_batched = micro_batched_ops(resolved, self.placement).tolist()
        self.tensor_producer = ir.tensor_producer.tolist()
        self.first_micro_batch_rows = first_micro_batch_rows(resolved, ir.batch_size)
        self.devices = [worker_device(cluster, d) for d in range(cluster.num_devices)]
        self.instance_node = [
            name if len(self.placement.instances(op)) == 1 else f"{name}/replica_{k}"
            for op, name in enumerate(ir.op_names)
            for k in range(len(self.placement.instances(op)))
        ]
        self.out = _Emitter(taken=set(ir.op_names) | set(self.instance_node))
        # readers of the batch inputs' instances, for folding a lone Slice into the feed
        for op in ir.batch_input_ops.tolist():
            if len(ir.outputs(op)) == 1:  # only a placeholder of one output is folded
                for i in self.placement.instances(op):
                    self.out.watch(self.instance_node[i])
        # per instance and per tensor, what every instance reads (lists: a hot loop)
        placement = self.placement
        self.inst_device = placement.inst_device.tolist()
        self.inst_lo, self.inst_hi = placement.inst_lo.tolist(), placement.inst_hi.tolist()
        self.op_split = (placement.op_mode == _SPLIT).tolist()
        self.batch_axis = ir.tensor_batch_axis.tolist()
        self.aggregation = ir.tensor_aggregation.tolist()
        self.split_kind = split_kinds(ir)
        self.has_control = (np.diff(ir.control_ptr) > 0).tolist()
        self.shape_argument = [
            _SHAPE_ARGUMENTS.get(kind, _ROW_ARGUMENTS.get(kind, -1)) for kind in ir.op_types
        ]
        self.control_inputs: dict[int, list[str]] = {}  # op -> the ^inputs its instances get
        # per op, what every instance needs: input and output tensors, instance count
        self.op_inputs = ir.input_lists
        self.op_outputs = [list(ir.outputs(op)) for op in range(ir.num_ops)]
        self.op_count = np.diff(self.placement.inst_ptr).tolist()
        self.adds_partials_list = self.adds_partials.tolist()
        self.auxiliary: list[tuple[str, tuple[str, ...]]] = []
        self.slices: dict[str, tuple[int, int, tuple[str, str]]] = {}  # Slice -> rows, consts
        self.local_consts: dict[tuple[int, int, int, int, bool], str] = {}
        self.gradients = set(ir.parameters.gradient_tensor.tolist())
        self.group_keys: dict[tuple[int, ...], int] = {}
        self.instance_keys = 0

    # tensors -----------------------------------------------------------------------------
    def _label(self, tensor: int) -> str:
        name = self.ir.op_names[int(self.ir.tensor_producer[tensor])]
        slot = int(self.ir.tensor_slot[tensor])
        return name if slot == 0 else f"{name}/output_{slot}"

    def _shape(self, tensor: int, lo: int, hi: int) -> tuple[int, ...] | None:
        shape = self.ir.tensor_shapes[tensor]
        axis = self.batch_axis[tensor]
        if shape is None or axis < 0 or axis >= len(shape) or shape[axis] < 0:
            return shape
        local = list(shape)
        local[axis] = shape[axis] * (hi - lo) // self.ir.batch_size
        return tuple(local)

    def _dtype(self, tensor: int) -> int:
        return int(self.ir.tensor_dtype[tensor])

    # the transport planner's hooks ---------------------------------------------------------
    def _move(self, tensor: int, copy: _Copy, device: int, reader: int) -> _Copy:
        """``copy`` on ``device``: an edge into the device (TensorFlow sends it once)."""
        moved = copy._replace(device=device)
        if copy.kind in (FULL, SLICE):
            self.cache[(tensor, device, copy.lo, copy.hi)] = moved
        return moved

    def _concat(
        self, tensor: int, pieces: list[_Copy], device: int, lo: int, hi: int, reader: int
    ) -> _Copy:
        """A ``ConcatV2`` on ``device`` of adjacent ``pieces``: rows ``[lo, hi)``."""
        local = [self._local(tensor, piece, device, reader) for piece in pieces]
        where = self.devices[device]
        axis_value = np.array(int(self.ir.tensor_batch_axis[tensor]), dtype=np.int32)
        whole = hi - lo == self.ir.batch_size
        label = self._label(tensor) + ("" if whole else f"/rows_{lo}_{hi}")
        axis = self.out.const(f"{label}/concat/axis_d{device}", where, axis_value, _DT_INT32)
        name = self.out.name(f"{label}/concat_d{device}")
        self.out.node(
            name,
            "ConcatV2",
            where,
            [p.ref for p in local] + [axis],
            [self._shape(tensor, lo, hi)],
            N=len(local),
            T=self._dtype(tensor),
            Tidx=_DT_INT32,
        )
        self.auxiliary.append(("concat", (name,)))
        return self._keep(tensor, _Copy(device, lo, hi, FULL if whole else SLICE, name))

    def _weighted(self, tensor: int, copy: _Copy, device: int) -> str:
        """A partial result ready to add: batch statistics scaled by the replica's share."""
        if copy.kind != MEAN:
            return copy.ref
        where = self.devices[device]
        share = np.array((copy.hi - copy.lo) / self.ir.batch_size)
        dtype = self._dtype(tensor)
        label = f"{self._label(tensor)}/mean_{copy.lo}_{copy.hi}"
        weight = self.out.const(f"{label}/share_d{device}", where, share, dtype)
        name = self.out.name(f"{label}/weighted_d{device}")
        self.out.node(
            name, "Mul", where, [copy.ref, weight], [self.ir.tensor_shapes[tensor]], T=dtype
        )
        return name

    def _addn(self, tensor: int, refs: list[str], device: int) -> str:
        """An ``AddN`` of ``refs``; micro-batches' partials as a running sum, as the task
        graph adds them."""
        if len(refs) > 2 and self._micro_batched(tensor):
            running = self._addn(tensor, refs[:2], device)
            for ref in refs[2:]:
                running = self._addn(tensor, [running, ref], device)
            return running
        name = self.out.name(f"{self._label(tensor)}/addn_d{device}")
        self.out.node(
            name,
            "AddN",
            self.devices[device],
            refs,
            [self.ir.tensor_shapes[tensor]],
            N=len(refs),
            T=self._dtype(tensor),
        )
        self.auxiliary.append(("addn", (name,)))
        return name

    def _sum(self, tensor: int, partial: list[_Copy], device: int, reader: int) -> _Copy:
        """An ``AddN`` on ``device`` of the partial results (batch statistics weighted)."""
        refs = [self._weighted(tensor, piece, device) for piece in partial]
        return _Copy(device, 0, self.batch, FULL, self._addn(tensor, refs, device))

    def _add(self, tensor: int, pieces: list[_Copy], device: int, reader: int, kind: int) -> _Copy:
        return _Copy(
            device, 0, self.batch, kind, self._addn(tensor, [p.ref for p in pieces], device)
        )

    def _allreduce(
        self, tensor: int, partial: list[_Copy], members: tuple[int, ...], reader: int
    ) -> None:
        batch, dtype = self.ir.batch_size, self._dtype(tensor)
        inputs: list[str] = []
        for member in members:
            local = [self._weighted(tensor, c, member) for c in partial if c.device == member]
            inputs.append(local[0] if len(local) == 1 else self._addn(tensor, local, member))
        machines = np.unique(self.cluster.device_machine[list(members)])
        label = f"{self._label(tensor)}/allreduce"
        shape = self.ir.tensor_shapes[tensor]
        names: list[str] = []
        if len(machines) == 1:
            shared = self.out.name(label)
            for member, ref in zip(members, inputs, strict=True):
                name = self.out.name(f"{label}_d{member}")
                self.out.node(
                    name,
                    "NcclAllReduce",
                    self.devices[member],
                    [ref],
                    [shape],
                    T=dtype,
                    reduction="sum",
                    num_devices=len(members),
                    shared_name=shared,
                )
                names.append(name)
        else:
            key = members
            group_key = self.group_keys.setdefault(key, len(self.group_keys) + 1)
            self.instance_keys += 1
            for member, ref in zip(members, inputs, strict=True):
                where = self.devices[member]
                keys = [
                    self.out.const(f"{label}/{what}_d{member}", where, np.array(v), _DT_INT32)
                    for what, v in (
                        ("group_size", len(members)),
                        ("group_key", group_key),
                        ("instance_key", self.instance_keys),
                    )
                ]
                name = self.out.name(f"{label}_d{member}")
                self.out.node(
                    name,
                    "CollectiveReduceV2",
                    where,
                    [ref, *keys],
                    [shape],
                    T=dtype,
                    merge_op="Add",
                    final_op="Id",
                    communication_hint="auto",
                    timeout_seconds=0.0,
                    is_stateless=False,
                    Nordering_token=0,
                    max_subdivs_per_device=-1,
                )
                names.append(name)
        self.auxiliary.append(("allreduce", tuple(names)))
        if tensor in self.gradients:
            nbytes = int(self.ir.tensor_bytes[tensor])
            group = int(self.resolved.op_group[reader])
            partials = [_node_of(r) for r in inputs]
            self.collectives.append(_GradientReduction(names, group, nbytes, members, partials))
        for member, name in zip(members, names, strict=True):
            self._keep(tensor, _Copy(member, 0, batch, FULL, name))

    def _cut(
        self, tensor: int, source: _Copy, lo: int, hi: int, reader: int, members: int
    ) -> _Copy:
        """A ``Slice`` of rows ``[lo, hi)`` out of ``source`` (a whole copy or a piece
        holding them), where ``source`` is."""
        shape = self.ir.tensor_shapes[tensor]
        axis = int(self.ir.tensor_batch_axis[tensor])
        if shape is None:
            raise InvalidInput(f"cannot split {self._label(tensor)}: its rank is unknown")
        begin, size = np.zeros(len(shape), np.int32), np.full(len(shape), -1, np.int32)
        local = self._shape(tensor, lo, hi)
        offset = lo - source.lo
        begin[axis] = shape[axis] * offset // self.ir.batch_size if shape[axis] >= 0 else offset
        size[axis] = local[axis] if local is not None and local[axis] >= 0 else hi - lo
        label = f"{self._label(tensor)}/split_{lo}_{hi}"
        arguments = {"begin": begin, "size": size}
        name, consts = self._cut_node(
            tensor, source, label, "Slice", arguments, [local], Index=_DT_INT32
        )
        self.slices[name] = (lo, hi, consts)
        self.out.watch(name)
        piece = _Copy(source.device, lo, hi, SLICE, name)
        self.cache[(tensor, source.device, lo, hi)] = piece
        return piece

    def _cut_node(
        self,
        tensor: int,
        source: _Copy,
        label: str,
        op: str,
        arguments: dict[str, np.ndarray],
        shapes: list[tuple[int, ...] | None],
        **attrs: Any,
    ) -> tuple[str, tuple[str, ...]]:
        """An auxiliary split: a node ``op`` (with ``attrs``) on ``source``'s GPU cutting
        ``source`` by the int32 ``arguments`` (a ``Const`` each, named after it); its name
        and the consts'."""
        device = source.device
        where = self.devices[device]
        consts = tuple(
            self.out.const(f"{label}/{argument}_d{device}", where, values, _DT_INT32)
            for argument, values in arguments.items()
        )
        name = self.out.name(f"{label}_d{device}")
        self.out.node(
            name, op, where, [source.ref, *consts], shapes, T=self._dtype(tensor), **attrs
        )
        self.auxiliary.append(("split", (name,)))
        return name, consts

    def _split(
        self, tensor: int, source: _Copy, rows: list[tuple[int, int, int]], reader: int
    ) -> list[_Copy]:
        """A ``SplitV`` of ``source`` (a whole copy) along the batch axis into the pieces
        ``rows`` (the rows between them, unread, as outputs of their own)."""
        shape = self.ir.tensor_shapes[tensor]
        if shape is None:
            raise InvalidInput(f"cannot split {self._label(tensor)}: its rank is unknown")
        axis, batch = int(self.ir.tensor_batch_axis[tensor]), self.ir.batch_size
        wanted = [(lo, hi) for lo, hi, _ in rows]
        bounds = sorted({0, batch, *(b for piece in wanted for b in piece)})
        pieces = list(itertools.pairwise(bounds))
        scale = shape[axis] if shape[axis] >= 0 else batch  # the batch axis's length
        sizes = np.diff([scale * b // batch for b in bounds]).astype(np.int32)
        sizes[-1] = -1  # the rest, whatever the runtime length
        label = f"{self._label(tensor)}/split_{len(pieces)}"
        arguments = {"sizes": sizes, "axis": np.array(axis)}
        shapes = [self._shape(tensor, lo, hi) for lo, hi in pieces]
        attrs = {"Tlen": _DT_INT32, "num_split": len(shapes)}
        name, _ = self._cut_node(tensor, source, label, "SplitV", arguments, shapes, **attrs)
        output = {piece: name if k == 0 else f"{name}:{k}" for k, piece in enumerate(pieces)}
        return [_Copy(source.device, lo, hi, SLICE, output[(lo, hi)]) for lo, hi in wanted]

    def _partial(self, tensor: int, device: int, lo: int, hi: int) -> _Copy:
        """The partial sum of the replica over rows ``[lo, hi)`` on ``device`` (a split op
        that adds up partials is placed only where they are)."""
        return self.partials[(tensor, device, lo, hi)]

    def _control_inputs(self, op: int, inst: int) -> list[str]:
        """``^`` inputs making an instance of ``op`` wait for every instance of its
        control predecessors: directly when that is few edges, else through one ``NoOp``
        that waits for them all (the same ordering, ``p + s`` edges instead of ``p * s``);
        of a micro-batched predecessor, for the instances of its rows
        (:func:`~.pipeline.control_pairs`)."""
        preds = self.ir.control_preds(op).tolist()
        by_rows = [p for p in preds if self.micro_batched[p]]
        whole = None if self.micro_batched[op] else self.first_micro_batch_rows
        own = [
            f"^{self.instance_node[i]}"
            for p in by_rows
            for i, j in zip(*control_pairs(self.placement, p, op, whole), strict=True)
            if j == inst
        ]
        return self._shared_control_inputs(op, [p for p in preds if p not in by_rows]) + own

    def _shared_control_inputs(self, op: int, preds: list[int]) -> list[str]:
        found = self.control_inputs.get(op)
        if found is not None:
            return found
        placement = self.placement
        waits = [f"^{self.instance_node[i]}" for pred in preds for i in placement.instances(pred)]
        count = len(placement.instances(op))
        if len(waits) * count > len(waits) + count:
            first = int(placement.inst_device[placement.inst_ptr[op]])
            barrier = self.out.name(f"{self.ir.op_names[op]}/control_barrier")
            self.out.node(barrier, "NoOp", self.devices[first], waits)
            waits = [f"^{barrier}"]
        self.control_inputs[op] = waits
        return waits

    def _static_ints(self, tensor: int, depth: int = 0) -> list[int] | None:
        """The value of a small integer tensor built from constants (a ``Const``, or the
        ``ExpandDims`` / ``Pack`` / ``ConcatV2`` of constants), else ``None``."""
        ir = self.ir
        producer = int(ir.tensor_producer[tensor])
        kind, inputs = ir.op_types[producer], ir.inputs(producer).tolist()
        if kind == "Const":
            return tensor_ints(self.originals[ir.op_names[producer]].attr["value"].tensor)
        if depth > 4 or not inputs:
            return None
        parts = [self._static_ints(t, depth + 1) for t in inputs]
        if kind == "ExpandDims" and parts[0] is not None and ir.tensor_shapes[inputs[0]] == ():
            return parts[0]
        if kind == "Pack" and all(p is not None and len(p) == 1 for p in parts):
            return [p[0] for p in parts]
        if kind == "ConcatV2" and all(p is not None for p in parts[:-1]):
            return [v for p in parts[:-1] for v in p]
        return None

    def _local_shape(self, op: int, position: int, ref: str, inst: int) -> str:
        """The shape argument of a split instance (input ``position``, as
        :data:`_SHAPE_ARGUMENTS` names it for the op's type), at the instance's rows: a
        new ``Const`` when it is built from constants and equals the op's full output
        shape; when it is computed, ``SelectV2(Equal(shape, full), local, shape)``
        (entries such as ``-1`` that are not the full shape's pass unchanged). A
        per-replica shape (``Shape`` of the replica's own input) is local already. A row
        count (:data:`_ROW_ARGUMENTS`) is the same for the output's length along the batch
        axis 0: a replica's segment sum or range covers its own rows."""
        ir, placement = self.ir, self.placement
        output = ir.outputs(op)
        if not len(output):
            return ref
        tensor = int(ir.inputs(op)[position])
        full = ir.tensor_shapes[output[0]]
        dtype = self._dtype(tensor)
        if full is None or dtype not in (_DT_INT32, _DT_INT64) or min(full, default=0) < 0:
            return ref
        if ir.tensor_aggregation[tensor] == Aggregation.LOCAL:
            return ref
        rows = ir.op_types[op] in _ROW_ARGUMENTS
        if rows and (self.batch_axis[output[0]] != 0 or not full):
            return ref
        lo, hi = int(placement.inst_lo[inst]), int(placement.inst_hi[inst])
        local = self._shape(int(output[0]), lo, hi)
        whole = np.array(full[0] if rows else full, dtype=_NUMPY[dtype])
        local = np.array(local[0] if rows else local, dtype=_NUMPY[dtype])
        static = self._static_ints(tensor)
        if static is not None and static != whole.reshape(-1).tolist():
            return ref
        device = int(placement.inst_device[inst])
        key = (tensor, device, lo, hi, rows)
        if key in self.local_consts:
            return self.local_consts[key]
        where, label = self.devices[device], f"{self._label(tensor)}/rows_{lo}_{hi}"
        if static is not None:
            name = self.out.const(f"{label}_d{device}", where, local, dtype)
        else:
            full_ref = self.out.const(f"{label}/full_d{device}", where, whole, dtype)
            local_ref = self.out.const(f"{label}/local_d{device}", where, local, dtype)
            equal = self.out.name(f"{label}/is_full_d{device}")
            self.out.node(
                equal,
                "Equal",
                where,
                [ref, full_ref],
                [local.shape],
                T=dtype,
                incompatible_shape_error=True,
            )
            name = self.out.name(f"{label}_d{device}")
            self.out.node(name, "SelectV2", where, [equal, local_ref, ref], [local.shape], T=dtype)
        self.local_consts[key] = name
        return name

    # ops ---------------------------------------------------------------------------------
    def _publish(self, op: int, inst: int, node: str) -> None:
        device, lo, hi = self.inst_device[inst], self.inst_lo[inst], self.inst_hi[inst]
        split, kinds = self.op_split[op], self.split_kind
        for slot, tensor in enumerate(self.op_outputs[op]):
            kind, lo_t, hi_t = published_rows(kinds[tensor] if split else FULL, lo, hi, self.batch)
            ref = node if slot == 0 else f"{node}:{slot}"
            self._record_copies(tensor, (_Copy(device, lo_t, hi_t, kind, ref),))

    def _read(self, op: int, inst: int, positions: list[int], refs: list[str]) -> None:
        """What instance ``inst`` of ``op`` reads at input ``positions``, into ``refs``
        (TAG §4.3.1)."""
        device, lo, hi = self.inst_device[inst], self.inst_lo[inst], self.inst_hi[inst]
        split = self.op_split[op]
        adds_partials = self.adds_partials_list[op]
        batch_axis, aggregation, tensors = self.batch_axis, self.aggregation, self.op_inputs[op]
        for position in positions:
            tensor = tensors[position]
            if split and batch_axis[tensor] >= 0:
                copy = self._slice(tensor, device, lo, hi, op)
            elif adds_partials and aggregation[tensor] == _AGGREGATE_SUM:
                copy = self._partial(tensor, device, lo, hi)
            else:
                copy = self._same_replica(tensor, device, lo, hi) or self._full(tensor, device, op)
            refs[position] = copy.ref

    def _walk(self, walk: Walk) -> list[list[str]]:
        """What every instance reads, in the task graph's order (:mod:`.walk`): chunk by
        chunk each op's inputs made in its chunk, its outputs published as it goes, then
        the crossings."""
        ir, placement = self.ir, self.placement
        producer, inputs, chunk_of = (
            ir.tensor_producer.tolist(),
            self.op_inputs,
            walk.position.tolist(),
        )
        refs = [[""] * len(inputs[op]) for op in range(ir.num_ops) for _ in placement.instances(op)]
        for ops in walk.ops:
            for op in ops:
                inside = [
                    p for p, t in enumerate(inputs[op]) if chunk_of[producer[t]] == chunk_of[op]
                ]
                for inst in placement.instances(op):
                    self._read(op, inst, inside, refs[inst])
                    self._publish(op, inst, self.instance_node[inst])
        for crossing in walk.crossings:
            for tensor, reads in crossing.reads:
                for op, _ in reads:
                    at = [p for p, t in enumerate(inputs[op]) if t == tensor]
                    for inst in placement.instances(op):
                        self._read(op, inst, at, refs[inst])
        return refs

    def _instance(self, op: int, inst: int, refs: list[str]) -> None:
        """The node of instance ``inst`` of ``op``, reading ``refs``."""
        ir = self.ir
        name = self.instance_node[inst]
        device, lo, hi = self.inst_device[inst], self.inst_lo[inst], self.inst_hi[inst]
        split = self.op_split[op]
        # the input a split instance reads at its own rows: its shape argument
        local_shape = self.shape_argument[op] if split and not self.adds_partials_list[op] else -1
        inputs = list(refs)
        if 0 <= local_shape < len(inputs):
            inputs[local_shape] = self._local_shape(op, local_shape, refs[local_shape], inst)
        if self.has_control[op]:
            inputs.extend(self._control_inputs(op, inst))
        outputs = self.op_outputs[op]
        shapes = [self._shape(t, lo, hi) if split else ir.tensor_shapes[t] for t in outputs]
        original = self.originals[ir.op_names[op]]
        if self.op_count[op] > 1 and ir.op_types[op] in VARIABLE_OPS:  # its own shared_name
            node = NodeDef()
            node.CopyFrom(original)
            node.name, node.device = name, self.devices[device]
            del node.input[:]
            node.input.extend(inputs)
            if "_class" in node.attr:
                del node.attr["_class"]
            shared = node.attr["shared_name"].s.decode() or ir.op_names[op]
            replica = inst - int(self.placement.inst_ptr[op])
            node.attr["shared_name"].s = f"{shared}/replica_{replica}".encode()
            _set_shapes(node, shapes)
            self.out.add(name, node, inputs)
        else:  # the original's other fields, serialized once per op
            template = self.out.template(op, lambda: original)
            self.out.emit(name, template, inputs, self.devices[device], shapes)

    def _barrier(self, name: str, waits_for: set[str], releases: list[str]) -> None:
        first = self.out.nodes[releases[0]].device
        barrier = self.out.name(name)
        self.out.node(barrier, "NoOp", first, [f"^{n}" for n in sorted(waits_for)])
        for node in releases:
            self.out.nodes[node].input.append(f"^{barrier}")

    def _after_backward(self, group: int, collectives: list[_GradientReduction]) -> None:
        """A ``NoOp`` barrier behind every gradient in front of the group's AllReduces."""
        every_gradient = {n for c in self.collectives for n in c.inputs}
        releases = [n for c in collectives for n in c.nodes]
        self._barrier(f"gradient_sync/group_{group}", every_gradient, releases)

    def _fuse(self, bucket: Bucket, collectives: list[_GradientReduction]) -> None:
        """A ``NoOp`` barrier behind the bucket's gradients in front of its AllReduces
        (fusing them into one buffer is left to the runtime)."""
        waits = {n for c in collectives for n in c.inputs}
        releases = [n for c in collectives for n in c.nodes]
        groups = bucket.groups
        name = f"group_{groups[0]}" if len(groups) == 1 else f"groups_{len(groups)}"
        self._barrier(f"gradient_sync/{name}_bucket", waits, releases)

    def _fold_inputs(self) -> dict[str, list[list[Any]]]:
        """Fold the lone ``Slice`` of a replica's placeholder into the feed."""
        ir, placement, nodes = self.ir, self.placement, self.out.nodes
        readers = self.out.readers  # of the placeholders' instances and of the slices
        inputs: dict[str, list[list[Any]]] = {}
        for op in ir.batch_input_ops.tolist():
            entries = inputs.setdefault(ir.op_names[op], [])
            for inst in placement.instances(op):
                name = self.instance_node[inst]
                lo, hi = int(placement.inst_lo[inst]), int(placement.inst_hi[inst])
                users = readers.get(name, [])
                cuts = {self.slices[u][:2] for u in users if u in self.slices}
                node = nodes[name]
                foldable = node.op == "Placeholder" and len(ir.outputs(op)) == 1
                if foldable and users and len(cuts) == 1 and all(u in self.slices for u in users):
                    lo, hi = cuts.pop()
                    self._fold(name, users, int(ir.outputs(op)[0]), lo, hi, readers)
                entries.append([name, lo, hi])
        return inputs

    def _fold(
        self,
        name: str,
        slices: list[str],
        tensor: int,
        lo: int,
        hi: int,
        readers: dict[str, list[str]],
    ) -> None:
        """Give placeholder ``name`` the rows ``[lo, hi)`` and drop its ``slices``; their
        ``readers`` (by node name) read the placeholder instead."""
        nodes = self.out.nodes
        local = self._shape(tensor, lo, hi)
        placeholder = nodes[name]
        if local is not None:
            shape = placeholder.attr["shape"].shape
            shape.ClearField("dim")
            shape.unknown_rank = False
            for size in local:
                shape.dim.add().size = size
        _set_shapes(placeholder, [local])
        for reader in {r for piece in slices for r in readers.get(piece, ())}:
            node = nodes.get(reader)
            for i, ref in enumerate(node.input if node is not None else ()):
                if ref in slices:
                    node.input[i] = name
        for piece in slices:
            del nodes[piece]
            for const in self.slices[piece][2]:
                del nodes[const]
        self.auxiliary = [
            ("split", (name,)) if kind == "split" and names[0] in slices else (kind, names)
            for kind, names in self.auxiliary
        ]

    def _updates(self) -> list[int]:
        """Ops without outputs (parameter updates, assignments) and ops nothing reads."""
        ir = self.ir
        read = set(ir.control_pred.tolist())
        read.update(int(ir.tensor_producer[t]) for t in ir.op_input_tensor.tolist())
        return [op for op in range(ir.num_ops) if op not in read or not len(ir.outputs(op))]

    def _captured(self) -> dict[str, dict[str, Any]]:
        """The device map's ``captured_variables``: per captured variable of a TF2
        function (:func:`captured_variables`), its value's dtype and shape, whether it is a
        trainable parameter, and per replica the placeholder a runtime binds a variable of
        its own to and that placeholder's device (docs/run-a-plan.md)."""
        ir, placement = self.ir, self.placement
        return {
            name: {
                "variable": self.variable_names.get(name),
                "dtype": spec.dtype,
                "shape": spec.shape,
                "trainable": name in ir.trainable_names,
                "replicas": [
                    {
                        "placeholder": self.instance_node[inst],
                        "device": self.devices[int(placement.inst_device[inst])],
                    }
                    for inst in placement.instances(ir.op_index(name))
                ],
            }
            for name, spec in captured_variables(ir).items()
        }

    def compile(self, walk: Walk) -> DistributedGraph:
        ir, placement = self.ir, self.placement
        barriers = phase_barriers(ir, self.resolved, placement)  # refused before compiling
        refs = self._walk(walk)
        for op in range(ir.num_ops):
            for inst in placement.instances(op):
                self._instance(op, inst, refs[inst])
        loss = None
        if ir.loss_op >= 0:
            first = int(placement.inst_ptr[ir.loss_op])
            loss = self.instance_node[first]
            if placement.op_mode[ir.loss_op] == Mode.SPLIT:
                tensor = int(ir.outputs(ir.loss_op)[0])
                loss = _node_of(self._full(tensor, int(placement.inst_device[first]), -1).ref)
        self._schedule_collectives()
        for name, waits, releases in barriers:
            self._barrier(
                name,
                {self.instance_node[i] for i in waits.tolist()},
                [self.instance_node[i] for i in releases.tolist()],
            )
        inputs = self._fold_inputs()
        updates = [self.instance_node[i] for op in self._updates() for i in placement.instances(op)]
        train_op = self.out.name("train_op")
        where = self.out.nodes[updates[0]].device if updates else self.devices[0]
        self.out.node(train_op, "NoOp", where, [f"^{n}" for n in updates])
        variables = {
            ir.op_names[op]: [self.instance_node[i] for i in placement.instances(op)]
            for op in range(ir.num_ops)
            if ir.op_types[op] in VARIABLE_OPS
        }
        captured = self._captured()
        added, state = state_ops(
            self.source, self.out.nodes, variables, set(ir.op_names), self.out.name
        )
        self.out.nodes.update(added)
        rest = GraphDef()
        rest.versions.CopyFrom(self.source.versions)
        rest.library.CopyFrom(self.source.library)
        serialized = serialize_graph(self.out.nodes, rest)
        device_map = {
            "tasks": task_map(self.cluster),
            "variables": variables,
            "captured_variables": captured,
            "inputs": inputs,
            "loss": loss,
            "train_op": train_op,
            **state,
            "graph_sha256": hashlib.sha256(serialized).hexdigest(),  # as graph_digest gives
        }
        return DistributedGraph(
            graph_def_bytes=serialized,
            device_map=device_map,
            placement=placement,
            instance_node=tuple(self.instance_node),
            auxiliary=tuple(self.auxiliary),
        )


def compile_graphdef(
    graph_def: Any,
    ir: GraphIR,
    cluster: Cluster,
    resolved: ResolvedStrategy,
    variable_names: Mapping[str, str] | None = None,
    *,
    walk: Walk | None = None,
) -> DistributedGraph:
    """Compile ``resolved`` over ``graph_def`` (the graph ``ir`` was analyzed from, in this
    package's protobuf classes) into a distributed ``GraphDef`` and its device map.
    ``variable_names`` names the variable behind each captured placeholder of a TF2
    function, where the graph's origin knows it (a zoo manifest's ``captured_variables``).
    ``walk``: :func:`~.walk.default_walk` of ``ir`` and ``cluster`` where the caller has
    it (an evaluator's compiler), else worked out here."""
    compilation = _GraphDefCompilation(graph_def, ir, cluster, resolved, variable_names or {})
    return compilation.compile(walk or default_walk(ir, cluster))
