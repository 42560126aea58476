"""Batch normalization under verification by execution (:mod:`.verify`, docs/design.md §5).

Two graph rewrites, both dtype-agnostic ``GraphDef`` -> ``GraphDef`` copies in this
package's protobuf classes:

**Per-replica statistics in the reference** (:func:`per_replica_statistics`). A split
training-mode batch norm normalizes each replica's rows with that replica's own mean and
variance (local batch norm, what every data-parallel framework does and what the
planner models: the analyzer gives its statistics the aggregation ``MEAN``). One device
computing over the whole batch computes something else, so the single-device reference
is rewritten to compute what the distributed graph is meant to: each forward op ``F``
split into row ranges ``[lo_k, hi_k)`` becomes

* ``F/replica_k``: the same op on ``Slice`` (``F/replica_k/rows``) of its input's rows;
* ``F``: an ``IdentityN`` of the ``ConcatV2`` of the replicas' ``y`` and, for every
  other output (batch mean, batch variance, reserve spaces), the sum of the replicas'
  outputs weighted by their share of the batch, ``(hi_k - lo_k) / batch``: the
  compiled graph's ``Mul`` + ``AddN`` for ``MEAN`` aggregation, with the same
  ``float32`` share constants;

and the gradient op ``G`` reading ``F``'s reserve spaces becomes

* ``G/replica_k``: the same op on the rows ``[lo_k, hi_k)`` of its ``y_backprop`` and
  ``x`` and the reserve spaces of ``F/replica_k``;
* ``G``: an ``IdentityN`` of the ``ConcatV2`` of the replicas' ``x_backprop``, the
  ``AddN`` of their ``scale_backprop`` and of their ``offset_backprop``, and replica
  0's unused reserve outputs.

The slicing follows the forward op, for the gradient too: the gradient of a locally
normalized slice is the gradient op on that slice with that slice's statistics (a
compiled graph that splits the gradient otherwise computes something else, and fails).
Every other node of the reference is untouched; its moving mean and variance are
updated from the replicas' share-weighted statistics, what a copy of them on a GPU
without a replica gets in the compiled graph. A copy on a GPU with a replica is updated
from that replica's statistics (:func:`running_copies`), so the reference also holds,
per replica ``k``, a copy (``<node>/per_replica_k``) of the part of each such update
that reads the statistics (``sub_1`` and ``mul`` of ``AssignMovingAvg``), fed
``F/replica_k``'s; the value it would assign gives that copy's expected value
(:class:`RunningStatistic`). Nothing reads these copies: they change no variable.

**Double precision** (:func:`lower_batch_norms`). TensorFlow's fused batch-norm kernels
exist for ``float32`` (and half types) only. A ``FusedBatchNorm``/``V2``/``V3`` or
``FusedBatchNormGrad``/``V2``/``V3`` node whose statistics type is ``float64`` becomes a
few elementwise ops and reductions computing what the CPU kernels compute, joined by an
``IdentityN`` that keeps the node's name and output slots. With ``n`` values per channel,
``m`` and ``v`` the mean and the biased variance over them, ``r = rsqrt(v + epsilon)``
and ``f`` the ``exponential_avg_factor``:

* training forward: ``y = (x - m) * (r * scale) + offset``; batch mean
  ``(1 - f) * mean + f * m`` and batch variance ``(1 - f) * variance + f * v * n /
  max(n - 1, 1)`` (just ``m`` and the Bessel-corrected ``v`` for ``f = 1``);
  reserve spaces ``m``, ``v`` and an empty tensor;
* training gradient, from the reserve spaces ``m`` and ``v``: ``offset_backprop =
  sum(dy)``, ``scale_backprop = sum(dy * (x - m)) * r`` and ``x_backprop = scale * r *
  (dy - mean(dy) - (x - m) * mean(dy * (x - m)) / (v + epsilon))``;
* inference: the same with the ``mean`` and ``variance`` inputs as ``m`` and ``v``,
  ``x_backprop = dy * scale * r``.

Why one module: the per-replica reference, the running-statistics copies and the float64
lowering rewrite the same fused batch-norm ops and share their input conventions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tagplan.planner.compile.placement import Placement
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.protos import GraphDef, NodeDef
from tagplan.planner.strategy import Mode

__all__ = [
    "BATCH_NORMS",
    "BATCH_NORM_GRADS",
    "RunningStatistic",
    "batch_norm_splits",
    "lower_batch_norms",
    "per_replica_statistics",
    "running_copies",
]

BATCH_NORMS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
BATCH_NORM_GRADS = frozenset({"FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"})
_OUTPUTS = {"FusedBatchNorm": 5, "FusedBatchNormV2": 5, "FusedBatchNormV3": 6}
_GRAD_OUTPUTS = 5
_DT_FLOAT, _DT_DOUBLE, _DT_INT32 = 1, 2, 3
_NUMPY = {_DT_FLOAT: np.float32, _DT_DOUBLE: np.float64, _DT_INT32: np.int32}
# data format -> (rank, channel axis)
_FORMATS = {"NHWC": (4, 3), "NCHW": (4, 1), "NDHWC": (5, 4), "NCDHW": (5, 1)}

# assignments of resource and of reference variables (variable first, value second)
_ASSIGNS = frozenset(
    {
        "AssignSubVariableOp",
        "AssignAddVariableOp",
        "AssignVariableOp",
        "AssignSub",
        "AssignAdd",
        "Assign",
    }
)

Splits = Mapping[str, Sequence[tuple[int, int]]]


@dataclass(frozen=True)
class RunningStatistic:
    """A variable updated from a split batch norm's statistics (a moving mean or variance):
    ``values[k]`` names the tensor its assignment ``update`` would take from replica
    ``k``'s statistics in the per-replica reference."""

    variable: str
    forward: str
    update: str
    values: tuple[str, ...]

    def expected(self, initial: np.ndarray, value: np.ndarray) -> np.ndarray:
        """The variable after the step, from its initial value and an assigned value."""
        if self.update.startswith("AssignSub"):
            return initial - value
        if self.update.startswith("AssignAdd"):
            return initial + value
        return value


def batch_norm_splits(ir: GraphIR, placement: Placement) -> dict[str, tuple[tuple[int, int], ...]]:
    """Training-mode batch norms that ``placement`` splits: op name -> the replicas' row
    ranges in batch order. Empty when nothing normalizes a part of the batch."""
    found = {}
    for op in np.flatnonzero(ir.batch_statistics).tolist():
        instances = placement.instances(op)
        if placement.op_mode[op] != Mode.SPLIT or len(instances) < 2:
            continue
        rows = sorted({(int(placement.inst_lo[i]), int(placement.inst_hi[i])) for i in instances})
        if len(rows) > 1:
            found[ir.op_names[op]] = tuple(rows)
    return found


def _node_name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _output(ref: str) -> tuple[str, int]:
    name, _, slot = ref.partition(":")
    return name, int(slot) if slot else 0


class _Builder:
    """New nodes next to ``base``: same device, its control inputs, names under a prefix."""

    def __init__(self, base: Any, prefix: str, taken: set[str], controls: list[str]) -> None:
        self.base, self.prefix, self.taken, self.controls = base, prefix, taken, controls
        self.nodes: list[Any] = []

    def name(self, suffix: str) -> str:
        wanted = f"{self.prefix}/{suffix}"
        name, k = wanted, 1
        while name in self.taken:
            name, k = f"{wanted}_{k}", k + 1
        self.taken.add(name)
        return name

    def node(self, suffix: str, op: str, inputs: list[str], **attrs: Any) -> str:
        node = NodeDef(name=self.name(suffix), op=op, device=self.base.device)
        node.input.extend([*inputs, *self.controls])
        for key, value in attrs.items():
            if isinstance(value, bool):
                node.attr[key].b = value
            elif isinstance(value, list):
                node.attr[key].list.type.extend(value)
            else:
                node.attr[key].type = value
        self.nodes.append(node)
        return node.name

    def const(self, suffix: str, values: Any, dtype: int) -> str:
        array = np.asarray(values, dtype=_NUMPY[dtype])
        node = NodeDef(name=self.name(suffix), op="Const", device=self.base.device)
        node.input.extend(self.controls)
        node.attr["dtype"].type = dtype
        tensor = node.attr["value"].tensor
        tensor.dtype = dtype
        for size in array.shape:
            tensor.tensor_shape.dim.add().size = size
        tensor.tensor_content = array.tobytes()
        self.nodes.append(node)
        return node.name


def _unique(wanted: str, taken: set[str]) -> str:
    name, k = wanted, 1
    while name in taken:
        name, k = f"{wanted}_{k}", k + 1
    taken.add(name)
    return name


def _copy_without(node: Any, name: str) -> Any:
    copy = NodeDef()
    copy.CopyFrom(node)
    copy.name = name
    for key in ("_output_shapes", "_class"):
        if key in copy.attr:
            del copy.attr[key]
    return copy


def _replace(graph_def: Any, replaced: dict[str, list[Any]]) -> Any:
    """A copy of ``graph_def`` with node ``name`` replaced by ``replaced[name]``."""
    out = GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name in replaced:
            out.node.extend(replaced[node.name])
        else:
            out.node.add().CopyFrom(node)
    return out


# per-replica statistics ------------------------------------------------------------------
def _rows(ir: GraphIR, op: int, position: int) -> tuple[int, int]:
    """Rank of input ``position`` of ``op`` and its leading rows per example."""
    shape = ir.tensor_shapes[int(ir.inputs(op)[position])]
    if shape is None or not shape or shape[0] < 0 or shape[0] % ir.batch_size:
        raise InvalidInput(f"{ir.op_names[op]}: input {position} has no static batch rows to split")
    return len(shape), shape[0] // ir.batch_size


def _slice(
    build: _Builder, ref: str, rank: int, per_example: int, lo: int, hi: int, dtype: int
) -> str:
    begin = [lo * per_example] + [0] * (rank - 1)
    size = [(hi - lo) * per_example] + [-1] * (rank - 1)
    tag = f"rows_{lo}_{hi}"
    begin_ref = build.const(f"{tag}/begin", begin, _DT_INT32)
    size_ref = build.const(f"{tag}/size", size, _DT_INT32)
    return build.node(tag, "Slice", [ref, begin_ref, size_ref], T=dtype, Index=_DT_INT32)


def _concat(build: _Builder, refs: list[str], dtype: int, suffix: str) -> str:
    axis = build.const(f"{suffix}/axis", 0, _DT_INT32)
    name = build.node(suffix, "ConcatV2", [*refs, axis], T=dtype, Tidx=_DT_INT32)
    build.nodes[-1].attr["N"].i = len(refs)
    return name


def _addn(build: _Builder, refs: list[str], dtype: int, suffix: str) -> str:
    name = build.node(suffix, "AddN", refs, T=dtype)
    build.nodes[-1].attr["N"].i = len(refs)
    return name


def _stat_type(node: Any) -> int:
    return int(node.attr["U"].type if "U" in node.attr else node.attr["T"].type)


def _forward_per_replica(
    node: Any, ir: GraphIR, rows: Sequence[tuple[int, int]], taken: set[str]
) -> list[Any]:
    op = ir.op_index(node.name)
    rank, per_example = _rows(ir, op, 0)
    data = [i for i in node.input if not i.startswith("^")]
    controls = [i for i in node.input if i.startswith("^")]
    build = _Builder(node, f"{node.name}/per_replica", taken, [])
    dtype, stat = int(node.attr["T"].type), _stat_type(node)
    replicas = []
    for k, (lo, hi) in enumerate(rows):
        piece = _slice(build, data[0], rank, per_example, lo, hi, dtype)
        replica = _copy_without(node, f"{node.name}/replica_{k}")
        taken.add(replica.name)
        del replica.input[:]
        replica.input.extend([piece, *data[1:], *controls])
        build.nodes.append(replica)
        replicas.append(replica.name)
    outputs = [_concat(build, [f"{r}:0" for r in replicas], dtype, "y")]
    for slot in range(1, _OUTPUTS[node.op]):
        weighted = []
        for k, (lo, hi) in enumerate(rows):
            share = build.const(f"output_{slot}/share_{k}", (hi - lo) / ir.batch_size, stat)
            weighted.append(
                build.node(
                    f"output_{slot}/weighted_{k}", "Mul", [f"{replicas[k]}:{slot}", share], T=stat
                )
            )
        outputs.append(_addn(build, weighted, stat, f"output_{slot}"))
    joined = NodeDef(name=node.name, op="IdentityN", device=node.device)
    joined.input.extend(outputs)
    joined.attr["T"].list.type.extend([dtype] + [stat] * (len(outputs) - 1))
    return [*build.nodes, joined]


def _gradient_per_replica(
    node: Any, ir: GraphIR, forward: str, rows: Sequence[tuple[int, int]], taken: set[str]
) -> list[Any]:
    op = ir.op_index(node.name)
    data = [i for i in node.input if not i.startswith("^")]
    controls = [i for i in node.input if i.startswith("^")]
    build = _Builder(node, f"{node.name}/per_replica", taken, [])
    dtype, stat = int(node.attr["T"].type), _stat_type(node)
    pieces = [_rows(ir, op, p) for p in (0, 1)]
    replicas = []
    for k, (lo, hi) in enumerate(rows):
        sliced = [
            _slice(build, data[p], rank, per_example, lo, hi, dtype)
            for p, (rank, per_example) in enumerate(pieces)
        ]
        reserves = [f"{forward}/replica_{k}:{_output(ref)[1]}" for ref in data[3:]]
        replica = _copy_without(node, f"{node.name}/replica_{k}")
        taken.add(replica.name)
        del replica.input[:]
        replica.input.extend([*sliced, data[2], *reserves, *controls])
        build.nodes.append(replica)
        replicas.append(replica.name)
    outputs = [
        _concat(build, [f"{r}:0" for r in replicas], dtype, "x_backprop"),
        _addn(build, [f"{r}:1" for r in replicas], stat, "scale_backprop"),
        _addn(build, [f"{r}:2" for r in replicas], stat, "offset_backprop"),
        f"{replicas[0]}:3",
        f"{replicas[0]}:4",
    ]
    joined = NodeDef(name=node.name, op="IdentityN", device=node.device)
    joined.input.extend(outputs)
    joined.attr["T"].list.type.extend([dtype] + [stat] * (len(outputs) - 1))
    return [*build.nodes, joined]


def _topological(nodes: list[Any]) -> list[str]:
    """Names of ``nodes`` with every node after the nodes among them it reads."""
    inside = {node.name: node for node in nodes}
    order: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        done.add(name)
        for ref in inside[name].input:
            if _node_name(ref) in inside:
                visit(_node_name(ref))
        order.append(name)

    for node in nodes:
        visit(node.name)
    return order


def _running_statistics(
    graph_def: Any, splits: Splits, taken: set[str]
) -> tuple[list[Any], dict[str, RunningStatistic]]:
    """Per replica, a copy of each update that assigns a variable from a split batch
    norm's batch mean or variance, ending at the value it would assign."""
    by_name = {node.name: node for node in graph_def.node}
    consumers: dict[str, list[str]] = {}
    statistics: dict[str, list[str]] = {}  # batch norm -> readers of its mean or variance
    for node in graph_def.node:
        for ref in node.input:
            if not ref.startswith("^"):
                consumers.setdefault(_node_name(ref), []).append(node.name)
                source, slot = _output(ref)
                if source in splits and slot in (1, 2):
                    statistics.setdefault(source, []).append(node.name)
    nodes: list[Any] = []
    found: dict[str, RunningStatistic] = {}
    for forward, rows in splits.items():
        reached: set[str] = set()
        frontier = [forward]
        while frontier:  # everything downstream of the statistics, up to assignments
            name = frontier.pop()
            for user in statistics.get(name, []) if name == forward else consumers.get(name, []):
                kind = by_name[user].op
                if user in reached or kind in BATCH_NORM_GRADS:
                    continue
                reached.add(user)
                if kind not in _ASSIGNS:
                    frontier.append(user)
        for assign in sorted(n for n in reached if by_name[n].op in _ASSIGNS):
            node = by_name[assign]
            variable = _node_name(node.input[0])
            if variable in found:
                raise InvalidInput(f"{variable} is assigned twice from batch statistics")
            path: set[str] = set()
            stack = [_node_name(node.input[1])]
            while stack:  # the part of the update that reads the statistics
                name = stack.pop()
                if name in reached and name not in path:
                    path.add(name)
                    stack += [_node_name(i) for i in by_name[name].input if not i.startswith("^")]
            order = _topological([by_name[n] for n in sorted(path)])
            values = []
            for k in range(len(rows)):
                copies: dict[str, str] = {}
                for name in order:
                    copy = _copy_without(by_name[name], "")
                    copy.name = _unique(f"{name}/per_replica_{k}", taken)
                    for i, ref in enumerate(copy.input):
                        if ref.startswith("^"):
                            continue
                        source, slot = _output(ref)
                        if source == forward:
                            copy.input[i] = f"{forward}/replica_{k}:{slot}"
                        elif source in copies:
                            copy.input[i] = f"{copies[source]}:{slot}"
                    copies[name] = copy.name
                    nodes.append(copy)
                source, slot = _output(node.input[1])
                values.append(f"{copies[source]}:{slot}" if source in copies else node.input[1])
            found[variable] = RunningStatistic(variable, forward, node.op, tuple(values))
    return nodes, found


def per_replica_statistics(
    graph_def: Any, ir: GraphIR, splits: Splits
) -> tuple[Any, dict[str, RunningStatistic]]:
    """A copy of the reference ``graph_def`` whose batch norms in ``splits`` (forward op
    name -> replica row ranges, from :func:`batch_norm_splits`) and their gradients
    normalize each replica's rows with its own statistics, and the running statistics
    each replica's statistics would give (module docstring)."""
    by_name = {node.name: node for node in graph_def.node}
    taken = set(by_name)
    replaced: dict[str, list[Any]] = {}
    for name, rows in splits.items():
        node = by_name.get(name)
        if node is None or node.op not in BATCH_NORMS:
            raise InvalidInput(f"{name} is not a batch norm of this graph")
        replaced[name] = _forward_per_replica(node, ir, rows, taken)
    for node in graph_def.node:
        if node.op not in BATCH_NORM_GRADS:
            continue
        data = [i for i in node.input if not i.startswith("^")]
        sources = {_output(ref)[0] for ref in data[3:]}
        split = sources & set(splits)
        if not split:
            continue
        forward = split.pop()
        expected = [f"{forward}:{slot}" for slot in range(3, 3 + len(data) - 3)]
        if sources != {forward} or data[3:] != expected:
            raise InvalidInput(f"{node.name} does not read the statistics of {forward} directly")
        replaced[node.name] = _gradient_per_replica(node, ir, forward, splits[forward], taken)
    extra, running = _running_statistics(graph_def, splits, taken)
    out = _replace(graph_def, replaced)
    out.node.extend(extra)
    return out, running


def running_copies(
    ir: GraphIR, placement: Placement, statistic: RunningStatistic, rows: Sequence[tuple[int, int]]
) -> list[int | None]:
    """For each copy of ``statistic``'s variable (in instance order), the replica (index
    into ``rows``) whose statistics update it: the first replica on the copy's GPU; ``None``
    for a copy on a GPU without one, which is updated from the share-weighted statistics."""
    forward = ir.op_index(statistic.forward)
    on_device: dict[int, int] = {}
    for inst in placement.instances(forward):
        lo, hi = int(placement.inst_lo[inst]), int(placement.inst_hi[inst])
        on_device.setdefault(int(placement.inst_device[inst]), rows.index((lo, hi)))
    variable = ir.op_index(statistic.variable)
    return [on_device.get(int(placement.inst_device[i])) for i in placement.instances(variable)]


# double precision ------------------------------------------------------------------------
def _layout(node: Any) -> tuple[list[int], list[int] | None]:
    """Reduction axes and, for channel-first data, the shape statistics broadcast in."""
    data_format = node.attr["data_format"].s.decode() if "data_format" in node.attr else "NHWC"
    if data_format not in _FORMATS:
        raise InvalidInput(f"{node.name}: data format {data_format!r} is not supported")
    rank, channel = _FORMATS[data_format]
    axes = [a for a in range(rank) if a != channel]
    return axes, None if channel == rank - 1 else [1, -1] + [1] * (rank - 2)


class _Math:
    """Elementwise ops and reductions of one dtype for a lowered batch norm."""

    def __init__(self, build: _Builder, dtype: int, axes: list[int], shape: list[int] | None):
        self.build, self.dtype = build, dtype
        self.axes = build.const("axes", axes, _DT_INT32)
        self.shape = None if shape is None else build.const("channel_shape", shape, _DT_INT32)

    def op(self, suffix: str, kind: str, *inputs: str) -> str:
        return self.build.node(suffix, kind, list(inputs), T=self.dtype)

    def scalar(self, suffix: str, value: float) -> str:
        return self.build.const(suffix, value, self.dtype)

    def reduce(self, suffix: str, kind: str, value: str) -> str:
        name = self.build.node(suffix, kind, [value, self.axes], T=self.dtype, Tidx=_DT_INT32)
        self.build.nodes[-1].attr["keep_dims"].b = False
        return name

    def channels(self, suffix: str, value: str) -> str:
        """A per-channel vector shaped to broadcast against the data."""
        if self.shape is None:
            return value
        return self.build.node(
            suffix, "Reshape", [value, self.shape], T=self.dtype, Tshape=_DT_INT32
        )

    def count(self, x: str, vector: str) -> str:
        """Values per channel: size of ``x`` over size of a per-channel ``vector``."""
        sizes = []
        for what, ref in (("data", x), ("channels", vector)):
            size = self.build.node(f"size_{what}", "Size", [ref], T=self.dtype, out_type=_DT_INT32)
            sizes.append(
                self.build.node(
                    f"size_{what}_real", "Cast", [size], SrcT=_DT_INT32, DstT=self.dtype
                )
            )
            self.build.nodes[-1].attr["Truncate"].b = False
        return self.op("count", "RealDiv", *sizes)

    def empty(self, suffix: str) -> str:
        return self.build.const(suffix, np.zeros(0), self.dtype)


def _lower_forward(node: Any, taken: set[str]) -> list[Any]:
    data = [i for i in node.input if not i.startswith("^")]
    controls = [i for i in node.input if i.startswith("^")]
    x, scale, offset, mean, variance = data[:5]
    build = _Builder(node, f"{node.name}/float64", taken, controls)
    dtype = int(node.attr["T"].type)
    math = _Math(build, dtype, *_layout(node))
    epsilon = math.scalar("epsilon", node.attr["epsilon"].f if "epsilon" in node.attr else 1e-4)
    training = node.attr["is_training"].b if "is_training" in node.attr else True
    if training:
        m = math.reduce("mean", "Mean", x)
        centered = math.op("centered", "Sub", x, math.channels("mean_channels", m))
        v = math.reduce("variance", "Mean", math.op("squared", "Square", centered))
    else:
        m, v = mean, variance
        centered = math.op("centered", "Sub", x, math.channels("mean_channels", m))
    r = math.op("rsqrt", "Rsqrt", math.op("variance_epsilon", "AddV2", v, epsilon))
    factor = math.channels("factor_channels", math.op("factor", "Mul", r, scale))
    y = math.op(
        "y",
        "AddV2",
        math.op("scaled", "Mul", centered, factor),
        math.channels("offset_channels", offset),
    )
    if training:
        n = math.count(x, m)
        one = math.scalar("one", 1.0)
        bessel = math.op(
            "bessel",
            "RealDiv",
            n,
            math.op("count_less_one", "Maximum", math.op("n_1", "Sub", n, one), one),
        )
        unbiased = math.op("unbiased", "Mul", v, bessel)
        f = node.attr["exponential_avg_factor"].f if "exponential_avg_factor" in node.attr else 1.0
        if f == 1.0:
            batch_mean, batch_variance = m, unbiased
        else:
            keep, take = math.scalar("keep", 1.0 - f), math.scalar("take", f)
            batch_mean = math.op(
                "batch_mean",
                "AddV2",
                math.op("old_mean", "Mul", keep, mean),
                math.op("new_mean", "Mul", take, m),
            )
            batch_variance = math.op(
                "batch_variance",
                "AddV2",
                math.op("old_variance", "Mul", keep, variance),
                math.op("new_variance", "Mul", take, unbiased),
            )
    else:
        batch_mean, batch_variance = mean, variance
    outputs = [y, batch_mean, batch_variance, m, v]
    if _OUTPUTS[node.op] == 6:
        outputs.append(math.empty("reserve_space_3"))
    joined = NodeDef(name=node.name, op="IdentityN", device=node.device)
    joined.input.extend([*outputs, *controls])
    joined.attr["T"].list.type.extend([dtype] * len(outputs))
    return [*build.nodes, joined]


def _lower_gradient(node: Any, taken: set[str]) -> list[Any]:
    data = [i for i in node.input if not i.startswith("^")]
    controls = [i for i in node.input if i.startswith("^")]
    dy, x, scale, m, v = data[:5]
    build = _Builder(node, f"{node.name}/float64", taken, controls)
    dtype = int(node.attr["T"].type)
    math = _Math(build, dtype, *_layout(node))
    epsilon = math.scalar("epsilon", node.attr["epsilon"].f if "epsilon" in node.attr else 1e-4)
    training = node.attr["is_training"].b if "is_training" in node.attr else True
    variance_epsilon = math.op("variance_epsilon", "AddV2", v, epsilon)
    r = math.op("rsqrt", "Rsqrt", variance_epsilon)
    centered = math.op("centered", "Sub", x, math.channels("mean_channels", m))
    dy_centered = math.op("dy_centered", "Mul", dy, centered)
    offset_backprop = math.reduce("offset_backprop", "Sum", dy)
    scale_backprop = math.op(
        "scale_backprop", "Mul", math.reduce("sum_dy_centered", "Sum", dy_centered), r
    )
    factor = math.channels("factor_channels", math.op("factor", "Mul", scale, r))
    if training:
        mean_dy = math.channels("mean_dy_channels", math.reduce("mean_dy", "Mean", dy))
        ratio = math.op(
            "ratio",
            "RealDiv",
            math.reduce("mean_dy_centered", "Mean", dy_centered),
            variance_epsilon,
        )
        correction = math.op("correction", "Mul", centered, math.channels("ratio_channels", ratio))
        inner = math.op("inner", "Sub", math.op("dy_less_mean", "Sub", dy, mean_dy), correction)
        x_backprop = math.op("x_backprop", "Mul", inner, factor)
    else:
        x_backprop = math.op("x_backprop", "Mul", dy, factor)
    outputs = [x_backprop, scale_backprop, offset_backprop]
    outputs += [math.empty("reserve_space_4"), math.empty("reserve_space_5")]
    joined = NodeDef(name=node.name, op="IdentityN", device=node.device)
    joined.input.extend([*outputs, *controls])
    joined.attr["T"].list.type.extend([dtype] * _GRAD_OUTPUTS)
    return [*build.nodes, joined]


def lower_batch_norms(graph_def: Any) -> Any:
    """A copy of ``graph_def`` whose fused batch norms and their gradients in double
    precision are elementwise ops and reductions (module docstring); ``graph_def`` itself
    when it has none."""
    lowered = [
        n
        for n in graph_def.node
        if n.op in BATCH_NORMS | BATCH_NORM_GRADS
        and int(n.attr["T"].type) == _DT_DOUBLE
        and _stat_type(n) == _DT_DOUBLE
    ]
    if not lowered:
        return graph_def
    taken = {node.name for node in graph_def.node}
    replaced = {
        n.name: (_lower_forward(n, taken) if n.op in BATCH_NORMS else _lower_gradient(n, taken))
        for n in lowered
    }
    return _replace(graph_def, replaced)
