"""Correctness by execution (DESIGN.md §5): run the original training step and the compiled
distributed one in TensorFlow and compare what they compute.

:func:`verify` builds the graph at a small batch (``zoo:NAME`` is rebuilt at
``batch_size``; a graph file runs at the batch it was built for), analyzes it, resolves
the strategy and compiles it with :func:`~.graphdef.compile_graphdef`. Then:

1. **original**: run the graph's initializer, read every variable, feed a fixed random
   batch (seeded; integer inputs within their valid range), run one training step,
   fetch the loss, every parameter's gradient and every variable (parameters, optimizer
   slots, Adam's powers, running statistics); with batch norms that the strategy splits,
   the step normalizes per replica (below), once per way of splitting them;
2. **compiled**: assign those initial values to every replica of every variable, feed
   each replica placeholder its rows of the same batch, run ``train_op`` and the loss
   node together, read every replica of every variable;
3. compare the loss and each variable, every replica of it, with
   ``|actual - expected| <= atol + rtol * |expected|`` elementwise (the criterion of
   ``numpy.testing.assert_allclose``), reporting the largest relative error of each.

Both graphs compute in double precision by default (:func:`to_float64` widens every
``float32`` type and constant of both alike). In ``float32`` a split batch adds the
same terms in another order, and Adam's first step divides each gradient element by its
own magnitude: an element that cancels to almost zero comes out with a different
rounding, and a purely relative elementwise tolerance fails on rounding alone. In
``float64`` that rounding sits far below ``rtol``, so what is compared is the rewrite.
``precision="float32"`` runs the graphs as they are (pass a larger ``atol`` then). The
default ``atol`` of ``1e-12`` is a floor for elements whose exact value is zero and that
both runs compute as rounding noise (an attention key bias gets an exactly zero gradient
in exact arithmetic: Adam then moves it by noise of order ``1e-16``). Adam's first step
moves an element by ``lr * g / (|g| + epsilon)``: where the exact gradient ``g`` is
zero, the move is rounding noise amplified ``lr / epsilon`` times, up to ``1e-7`` in a
deep network (a bias added right before a batch norm, which subtracts it again, has an
exactly zero gradient). So a parameter element whose gradient in the original step is
at most ``1e-12`` of the step's largest gradient element is compared with an absolute
floor of 10 times the largest move any such element makes in the original step. Its
optimizer slots keep the plain criterion (Adam's first moment is ``0.1 g``, compared to
``1e-12``), so a gradient the compiled graph gets wrong there still fails, and a real
mistake moves the element by Adam's full step, orders of magnitude above the floor.

The compiled graph runs on virtual CPU devices, one per GPU of the cluster: device
``/job:worker/replica:0/task:T/device:GPU:i`` becomes
``/job:localhost/replica:0/task:0/device:CPU:<d>`` where ``d`` is the cluster's index of
GPU ``i`` of machine ``T``. The devices are made by the verifying session itself
(``ConfigProto.device_count``), so verification runs in the calling process whatever
state TensorFlow's eager runtime is in. GPU-only collectives are lowered for CPU
(:func:`lower_for_cpu`); besides device names and precision, that is the only change
made to the compiled graph:

* the ``NcclAllReduce`` nodes of one ``shared_name`` become an ``AddN`` of all their
  inputs, placed on the first member's device and named like the first member, and an
  ``Identity`` of that sum on every other member's device, named like that member;
* the ``CollectiveReduceV2`` nodes of one (group key, instance key) likewise (their key
  constants are then unread).

Every member keeps its control inputs, so gradient-sync barriers stay in force. What a
collective sums is what the ``AddN`` sums; only the order of the floating-point additions
may differ, which the tolerance absorbs.

Both graphs run as written: grappler's rewrites are off (they are not what is checked,
and on graphs of tens of thousands of nodes they take longer than the step).

**Batch normalization.** Under data parallelism each replica of a training-mode batch
norm normalizes its own rows with its own mean and variance (local batch norm, what
every data-parallel framework does and what the planner's cost model assumes: the
analyzer aggregates batch statistics by their mean), which is not what one device
computes over the whole batch. The compiled graph ships unchanged; the reference is
made to compute what it is meant to compute
(:func:`~.batchnorm.per_replica_statistics`). For every batch norm that the compiled
placement splits into row ranges (:func:`~.batchnorm.batch_norm_splits`), and only for
those, the reference runs the same op on each replica's rows, concatenates the
normalized outputs, and gives its batch mean, batch variance and reserve outputs as the
replicas' share-weighted sum (what the compiled graph sums for a reader of the whole
tensor); its gradient op runs per replica on the same rows with that replica's
statistics, concatenates ``x_backprop`` and sums the scale and offset gradients. Every
other node of the reference is the plain single-device step. Model-parallel and
duplicate groups do not split the batch: their batch norms are not rewritten, and a
strategy splitting none runs the plain reference.

Running statistics are updated per copy in the compiled graph: each copy of a moving
mean or variance (one per GPU of a mirrored group, one on a parameter server) is
updated from the statistics of the replica on its GPU (the first, should the GPU run
several), without communication; a copy on a GPU without a replica gets the
share-weighted statistics. The reference copies each such update once per replica, fed
that replica's statistics, and fetches the value it would assign; each copy is compared
to the value of the replica on its GPU (:func:`~.batchnorm.running_copies`), a copy
without one to the reference's own update, with the plain criterion. Training-mode
batch norm does not read its running statistics, so nothing else depends on them.

TensorFlow's fused batch-norm kernels have no ``float64`` version: :func:`to_float64`
replaces them, in both graphs alike, by the elementwise ops and reductions they compute
(:func:`~.batchnorm.lower_batch_norms`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tagplan.planner.compile.batchnorm import (
    RunningStatistic,
    batch_norm_splits,
    lower_batch_norms,
    per_replica_statistics,
    running_copies,
)
from tagplan.planner.compile.graphdef import DistributedGraph, compile_graphdef
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.constants import tensor_ints
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.params import VARIABLE_OPS
from tagplan.planner.graph.protos import GraphDef, NodeDef, dtype_name
from tagplan.planner.graph.source import ZOO_PREFIX, load_graph_source
from tagplan.planner.strategy import Strategy, load_strategy, resolve
from tagplan.planner.topology import Cluster, load_cluster

__all__ = ["VariableCheck", "VerifyReport", "lower_for_cpu", "to_float64", "verify", "verify_many"]

_DT_FLOAT, _DT_DOUBLE, _REF = 1, 2, 100
_WORKER_DEVICE = re.compile(r"^/job:worker/replica:0/task:(\d+)/device:GPU:(\d+)$")
_UNSET = float("nan")
_REMAPPING_OFF = 2  # RewriterConfig.OFF
_BATCH_BYTES = 256 << 20  # variable values moved in and out of a session per run
_NOISE_GRADIENT = 1e-12  # a gradient element this small relative to the largest is rounding
_NOISE_FACTOR = 10.0  # such an element may move 10x as far as any such element of the reference


@dataclass(frozen=True)
class VariableCheck:
    """One variable: how many replicas were compared and the worst errors among them."""

    name: str
    replicas: int
    max_abs_error: float
    max_rel_error: float
    passed: bool


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of one verification; ``problems`` says what failed, in words."""

    graph: str
    strategy: str
    batch_size: int
    rtol: float
    atol: float
    passed: bool
    loss_expected: float = _UNSET
    loss_actual: float = _UNSET
    loss_rel_error: float = _UNSET
    variables: tuple[VariableCheck, ...] = ()
    problems: tuple[str, ...] = ()
    auxiliary: dict[str, int] = field(default_factory=dict)
    per_replica_batch_norms: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        worst = max((v.max_rel_error for v in self.variables), default=0.0)
        worst_abs = max((v.max_abs_error for v in self.variables), default=0.0)
        lines = [
            f"{verdict} {self.graph} [{self.strategy}] batch {self.batch_size}: loss "
            f"{self.loss_expected:.6g} vs {self.loss_actual:.6g} (rel {self.loss_rel_error:.2e}), "
            f"{len(self.variables)} variables, worst rel error {worst:.2e} "
            f"(abs {worst_abs:.2e})"
        ]
        if self.per_replica_batch_norms:
            lines[0] += f"; {self.per_replica_batch_norms} batch norms with per-replica statistics"
        lines += [f"  {p}" for p in self.problems]
        return "\n".join(lines)


@dataclass(eq=False)
class _Original:
    """The original graph at the verifying batch, its batch and its initial values."""

    label: str
    graph_def: Any  # this package's GraphDef
    ir: GraphIR
    feed: dict[str, np.ndarray]
    init: str
    train: str | list[str]  # the train node, or every sink of the step
    initial: dict[str, np.ndarray] | None = None


@dataclass(eq=False)
class _Reference:
    """The original step's inputs and results."""

    label: str
    graph_def: Any  # this package's GraphDef
    ir: GraphIR
    feed: dict[str, np.ndarray]
    initial: dict[str, np.ndarray]
    loss: float
    updated: dict[str, np.ndarray]
    splits: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    # running statistic -> (its update, its value after the step from each replica's)
    running: dict[str, tuple[RunningStatistic, list[np.ndarray]]] = field(default_factory=dict)
    # parameter -> elements whose gradient is zero up to rounding, and the noise floor
    noise: dict[str, np.ndarray] = field(default_factory=dict)
    noise_floor: float = 0.0

    @property
    def per_replica_batch_norms(self) -> int:
        return len(self.splits)


def _tensorflow() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise InvalidInput("verification runs TensorFlow; install tagplan[tf]") from exc
    return tf


def _random_batch(
    inputs: Sequence[Mapping[str, Any]], batch: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    feed = {}
    for spec in inputs:
        shape = [batch, *spec["shape"][1:]]
        dtype = np.dtype(spec["dtype"])
        if np.issubdtype(dtype, np.integer) or dtype == np.bool_:
            feed[spec["name"]] = rng.integers(0, spec.get("high", 2), shape).astype(dtype)
        else:
            feed[spec["name"]] = rng.standard_normal(shape).astype(dtype)
    return feed


def _load(
    graph_spec: str, batch_size: int, image_size: int | None
) -> tuple[Any, GraphIR, list[dict], str, str | None]:
    """The graph at the verifying batch, its IR, input specs, init node and train node."""
    if graph_spec.startswith(ZOO_PREFIX):
        from tagplan.planner.zoo import generate

        name = graph_spec[len(ZOO_PREFIX) :]
        built = generate.build(name, batch_size=batch_size, image_size=image_size)
        if not built.runnable or built.init_node is None:
            raise InvalidInput(f"{graph_spec} cannot run on its own (its variables live outside)")
        graph_def = GraphDef.FromString(built.graph_def.SerializeToString())
        inputs = [dict(spec) for spec in built.inputs]
        ir = analyze(
            graph_def,
            batch_size=batch_size,
            batch_inputs=[spec["name"] for spec in inputs],
            loss=built.loss_node,
        )
        return graph_def, ir, inputs, built.init_node, built.train_node
    if image_size is not None:
        raise InvalidInput("only a zoo model is rebuilt at another image size")
    graph_def = load_graph_source(graph_spec).graph_def
    ir = analyze(graph_def)
    names = {node.name: node for node in graph_def.node}
    if "init" not in names:
        raise InvalidInput(f"{graph_spec} has no 'init' node to initialize its variables")
    inputs = []
    for op in ir.batch_input_ops.tolist():
        node, shape = names[ir.op_names[op]], ir.tensor_shapes[int(ir.outputs(op)[0])]
        if node.op != "Placeholder" or shape is None or min(shape) < 0:
            raise InvalidInput(f"batch input {node.name} is not a placeholder of known shape")
        dtype = dtype_name(int(ir.tensor_dtype[int(ir.outputs(op)[0])]))
        inputs.append({"name": node.name, "dtype": dtype, "shape": list(shape)})
    return graph_def, ir, inputs, "init", None


def _session(tf: Any, graph: Any, devices: int) -> Any:
    config = tf.compat.v1.ConfigProto(device_count={"CPU": devices}, allow_soft_placement=False)
    # op fusion has no float64 kernels to fuse into; both graphs run unfused
    config.graph_options.rewrite_options.remapping = _REMAPPING_OFF
    # both graphs run as written: grappler's rewrites are not what is checked, and on
    # graphs of tens of thousands of nodes they take longer than the step
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return tf.compat.v1.Session(graph=graph, config=config)


def _reader(tf: Any, graph: Any, name: str) -> Any:
    """A tensor holding the value of variable node ``name``, read on its device."""
    op = graph.get_operation_by_name(name)
    with graph.as_default(), tf.device(op.device):
        if op.type == "VarHandleOp":
            return tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=op.get_attr("dtype"))
        return tf.identity(op.outputs[0])


def _assigner(tf: Any, graph: Any, name: str) -> tuple[Any, Any]:
    """A placeholder and the op that assigns its value to variable node ``name``."""
    op = graph.get_operation_by_name(name)
    dtype = op.get_attr("dtype")
    with graph.as_default(), tf.device(op.device):
        value = tf.compat.v1.placeholder(dtype.base_dtype, name=f"{name}/verify_value")
        if op.type == "VarHandleOp":
            return value, tf.raw_ops.AssignVariableOp(resource=op.outputs[0], value=value)
        return value, tf.raw_ops.Assign(ref=op.outputs[0], value=value).op


def _variables(ir: GraphIR) -> list[str]:
    return [ir.op_names[op] for op in range(ir.num_ops) if ir.op_types[op] in VARIABLE_OPS]


def _load_original(
    graph_spec: str, batch_size: int, image_size: int | None, seed: int, double: bool
) -> _Original:
    graph_def, ir, inputs, init, train = _load(graph_spec, batch_size, image_size)
    if ir.loss_op < 0:
        raise InvalidInput(f"{graph_spec} has no loss to compare")
    feed = _random_batch(inputs, ir.batch_size, np.random.default_rng(seed))
    if double:
        feed = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feed.items()}
    if train is None:  # every sink of the step, as the compiled train_op
        used = {_name(i) for node in graph_def.node for i in node.input}
        train = [n for n in ir.op_names if n not in used]
    return _Original(graph_spec, graph_def, ir, feed, init, train)


def _run_original(
    tf: Any,
    original: _Original,
    splits: tuple[tuple[str, tuple[tuple[int, int], ...]], ...],
    double: bool,
) -> _Reference:
    """One step of the original graph, with per-replica batch statistics for ``splits``.

    The first run initializes the variables with the graph's initializer and keeps their
    values; later runs assign those values.
    """
    graph_def, running = original.graph_def, {}
    if splits:
        graph_def, running = per_replica_statistics(graph_def, original.ir, dict(splits))
    names = _variables(original.ir)
    with tf.Graph().as_default() as graph:
        runnable = to_float64(graph_def) if double else graph_def
        tf.compat.v1.import_graph_def(
            tf.compat.v1.GraphDef.FromString(runnable.SerializeToString()), name=""
        )
        reads = {name: _reader(tf, graph, name) for name in names}
        if isinstance(original.train, str):
            train = original.train
        else:
            train = tf.group(*[graph.get_operation_by_name(n) for n in original.train])
        assigns = {} if original.initial is None else {n: _assigner(tf, graph, n) for n in names}
        with _session(tf, graph, 1) as session:
            if original.initial is None:
                session.run(original.init)
                original.initial = session.run(reads)
            initial = original.initial
            for batch in _batches(list(assigns), lambda n: initial[n].nbytes):
                run = [assigns[n][1] for n in batch]
                session.run(run, {assigns[n][0]: initial[n] for n in batch})
            fed = {f"{name}:0": value for name, value in original.feed.items()}
            loss_node = f"{original.ir.op_names[original.ir.loss_op]}:0"
            values = {name: list(s.values) for name, s in running.items()}
            gradients = _gradients(original.ir)
            loss, _, assigned, gradient = session.run([loss_node, train, values, gradients], fed)
            updated = session.run(reads)
    noise = _noise(gradient)
    moved = [np.abs(updated[n] - initial[n])[mask] for n, mask in noise.items()]
    floor = _NOISE_FACTOR * max((float(m.max()) for m in moved if m.size), default=0.0)
    return _Reference(
        original.label,
        original.graph_def,
        original.ir,
        original.feed,
        initial,
        float(loss),
        updated,
        splits,
        {
            name: (s, [s.expected(initial[name], v) for v in assigned[name]])
            for name, s in running.items()
        },
        noise,
        floor,
    )


def _gradients(ir: GraphIR) -> dict[str, str]:
    """Parameter variable -> its gradient tensor."""
    params = ir.parameters
    found = {}
    for row in range(len(params)):
        tensor = int(params.gradient_tensor[row])
        producer = ir.op_names[int(ir.tensor_producer[tensor])]
        found[ir.op_names[int(params.variable_op[row])]] = f"{producer}:{ir.tensor_slot[tensor]}"
    return found


def _noise(gradients: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Parameter -> mask of the elements whose gradient is zero up to rounding: at most
    :data:`_NOISE_GRADIENT` times the largest gradient element of the step."""
    scale = max((float(np.abs(g).max()) for g in gradients.values() if g.size), default=0.0)
    masks = {name: np.abs(g) <= _NOISE_GRADIENT * scale for name, g in gradients.items()}
    return {name: mask for name, mask in masks.items() if mask.any()}


def _name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _cpu_devices(cluster: Cluster) -> dict[tuple[int, int], str]:
    return {
        (int(cluster.device_machine[d]), int(cluster.device_local_index[d])): (
            f"/job:localhost/replica:0/task:0/device:CPU:{d}"
        )
        for d in range(cluster.num_devices)
    }


def lower_for_cpu(graph_def: Any, cluster: Cluster) -> Any:
    """A copy of a compiled graph that runs on one CPU device per GPU (module docstring)."""
    cpus = _cpu_devices(cluster)
    by_name = {node.name: node for node in graph_def.node}
    groups: dict[tuple[str, ...], list[Any]] = {}
    for node in graph_def.node:
        if node.op == "NcclAllReduce":
            groups.setdefault(("nccl", node.attr["shared_name"].s.decode()), []).append(node)
        elif node.op == "CollectiveReduceV2":
            keys = []
            for ref in node.input[2:4]:
                key = by_name.get(_name(ref))
                if key is None or key.op != "Const":
                    raise InvalidInput(f"{node.name}: collective keys must be constants")
                keys.append(str(tensor_ints(key.attr["value"].tensor)))
            groups.setdefault(("collective", *keys), []).append(node)
    lowered: dict[str, Any] = {}
    for members in groups.values():
        first = members[0]
        controls = [i for i in first.input if i.startswith("^")]
        data = [next(i for i in m.input if not i.startswith("^")) for m in members]
        total = NodeDef(name=first.name, op="AddN", device=first.device)
        total.input.extend(data + controls)
        total.attr["N"].i = len(members)
        total.attr["T"].type = first.attr["T"].type
        lowered[first.name] = total
        for member in members[1:]:
            copy = NodeDef(name=member.name, op="Identity", device=member.device)
            copy.input.extend([first.name] + [i for i in member.input if i.startswith("^")])
            copy.attr["T"].type = member.attr["T"].type
            lowered[member.name] = copy
    out = GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    for node in graph_def.node:
        new = out.node.add()
        new.CopyFrom(lowered.get(node.name, node))
        if new.device:
            match = _WORKER_DEVICE.match(new.device)
            key = (int(match.group(1)), int(match.group(2))) if match else None
            if key not in cpus:
                raise InvalidInput(f"{node.name}: device {new.device!r} is not in the cluster")
            new.device = cpus[key]
    return out


def to_float64(graph_def: Any) -> Any:
    """A copy of ``graph_def`` computing in double precision: every ``float32`` type
    attribute (``T``, ``dtype``, ``DstT``, ...) becomes ``float64``, every ``float32``
    constant is widened and fused batch norms, which have no ``float64`` kernels, become
    the ops they compute (:func:`~.batchnorm.lower_batch_norms`)."""
    out = GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        for attr in node.attr.values():
            if attr.type in (_DT_FLOAT, _DT_FLOAT + _REF):
                attr.type += _DT_DOUBLE - _DT_FLOAT
            kinds = attr.list.type
            for i, kind in enumerate(kinds):
                if kind in (_DT_FLOAT, _DT_FLOAT + _REF):
                    kinds[i] = kind + _DT_DOUBLE - _DT_FLOAT
            if attr.HasField("tensor") and attr.tensor.dtype == _DT_FLOAT:
                _widen(attr.tensor)
    return lower_batch_norms(out)


def _widen(tensor: Any) -> None:
    shape = [d.size for d in tensor.tensor_shape.dim]
    count = int(np.prod(shape)) if shape else 1
    if tensor.tensor_content:
        values = np.frombuffer(tensor.tensor_content, dtype=np.float32)
    else:  # repeated values fill the shape with the last one, none means zeros
        given = list(tensor.float_val) or [0.0]
        values = np.array(given + given[-1:] * (count - len(given)))
    tensor.ClearField("float_val")
    tensor.dtype = _DT_DOUBLE
    tensor.tensor_content = values.astype(np.float64).tobytes()


def _rel_error(actual: np.ndarray, expected: np.ndarray) -> float:
    diff = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    scale = np.abs(expected.astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(diff == 0, 0.0, diff / scale)
    return float(rel.max()) if rel.size else 0.0


def _close(actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float | np.ndarray) -> bool:
    if actual.shape != expected.shape:
        return False
    return bool(np.all(np.abs(actual - expected) <= atol + rtol * np.abs(expected)))


def _batches(items: list[Any], nbytes: Any, limit: int = _BATCH_BYTES) -> list[list[Any]]:
    """``items`` in consecutive runs of at most ``limit`` bytes (at least one item each)."""
    runs: list[list[Any]] = [[]]
    total = 0
    for item in items:
        size = int(nbytes(item))
        if runs[-1] and total + size > limit:
            runs.append([])
            total = 0
        runs[-1].append(item)
        total += size
    return [run for run in runs if run]


def _check(
    name: str,
    replicas: list[tuple[str, np.ndarray, np.ndarray]],
    tolerance: tuple[float, float | np.ndarray],
) -> tuple[VariableCheck, list[str]]:
    """Every replica ``(node, actual, expected)`` of variable ``name``."""
    rtol, atol = tolerance
    errors, absolute, problems = [], [], []
    for node, actual, expected in replicas:
        if actual.shape != expected.shape:
            problems.append(f"{node}: shape {actual.shape} != {expected.shape}")
            continue
        errors.append(_rel_error(actual, expected))
        absolute.append(float(np.abs(actual - expected).max()) if actual.size else 0.0)
        if not _close(actual, expected, rtol, atol):
            problems.append(
                f"{node}: max relative error {errors[-1]:.3g} > {rtol:g} "
                f"(max absolute error {absolute[-1]:.3g})"
            )
    worst_abs, worst_rel = max(absolute, default=math.inf), max(errors, default=math.inf)
    return VariableCheck(name, len(replicas), worst_abs, worst_rel, not problems), problems


def _expectations(
    reference: _Reference, compiled: DistributedGraph, tolerance: tuple[float, float]
) -> dict[str, tuple[list[np.ndarray], tuple[float, float | np.ndarray]]]:
    """Per variable, the expected value of each of its copies and the tolerance."""
    rtol, atol = tolerance
    found = {}
    for name in compiled.device_map["variables"]:
        expected = reference.updated.get(name)
        copies = len(compiled.device_map["variables"][name])
        values = [expected] * copies
        running = reference.running.get(name)
        if running is not None:
            statistic, per_replica = running
            rows = dict(reference.splits)[statistic.forward]
            which = running_copies(reference.ir, compiled.placement, statistic, rows)
            values = [expected if k is None else per_replica[k] for k in which]
        floor: float | np.ndarray = atol
        mask = reference.noise.get(name)
        if mask is not None and mask.shape == values[0].shape:
            floor = np.where(mask, max(atol, reference.noise_floor), atol)
        found[name] = (values, (rtol, floor))
    return found


def _run_compiled(
    tf: Any,
    reference: _Reference,
    cluster: Cluster,
    compiled: DistributedGraph,
    label: str,
    rtol: float,
    atol: float,
    double: bool,
) -> VerifyReport:
    tol = (rtol, atol)
    base = {
        "graph": reference.label,
        "strategy": label,
        "batch_size": reference.ir.batch_size,
        "rtol": rtol,
        "atol": atol,
        "loss_expected": reference.loss,
        "per_replica_batch_norms": reference.per_replica_batch_norms,
        "auxiliary": compiled.auxiliary_counts(),
    }
    device_map = compiled.device_map
    replicas: dict[str, list[str]] = device_map["variables"]
    problems = [f"variable {n} has no replica" for n in reference.initial if not replicas.get(n)]
    if device_map.get("loss") is None:
        problems.append("the compiled graph names no loss node")
    if problems:
        return VerifyReport(passed=False, problems=tuple(problems), **base)
    try:
        lowered = lower_for_cpu(compiled.graph_def, cluster)
        if double:
            lowered = to_float64(lowered)
        with tf.Graph().as_default() as graph:
            tf.compat.v1.import_graph_def(
                tf.compat.v1.GraphDef.FromString(lowered.SerializeToString()), name=""
            )
            assigns, reads = {}, {}
            for name, nodes in replicas.items():
                for node in nodes:
                    assigns[node] = (*_assigner(tf, graph, node), reference.initial[name])
                    reads[node] = _reader(tf, graph, node)
            feed = {}
            for name, pieces in device_map["inputs"].items():
                for node, lo, hi in pieces:
                    feed[f"{node}:0"] = reference.feed[name][lo:hi]
            with _session(tf, graph, cluster.num_devices) as session:
                # in batches of bounded size: the replicas of a big model fill the memory
                for batch in _batches(list(assigns.values()), lambda a: a[2].nbytes):
                    session.run([a[1] for a in batch], {a[0]: a[2] for a in batch})
                loss, _ = session.run([f"{device_map['loss']}:0", device_map["train_op"]], feed)
                results = []
                size = {
                    name: reference.updated[name].nbytes * len(replicas[name]) for name in replicas
                }
                expect = _expectations(reference, compiled, tol)
                for batch in _batches(list(replicas), size.__getitem__):
                    values = session.run({n: reads[n] for name in batch for n in replicas[name]})
                    for name in batch:
                        copies, tolerance = expect[name]
                        found = list(
                            zip(
                                replicas[name],
                                [values[n] for n in replicas[name]],
                                copies,
                                strict=True,
                            )
                        )
                        results.append(_check(name, found, tolerance))
    except (ValueError, tf.errors.OpError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return VerifyReport(passed=False, problems=(f"TensorFlow: {message}",), **base)
    loss = float(loss)
    loss_ok = _close(np.array(loss), np.array(reference.loss), rtol, atol)
    if not loss_ok:
        problems.append(f"loss {loss:.8g} != {reference.loss:.8g}")
    problems += [p for _, found in results for p in found]
    checks = [check for check, _ in results]
    passed = loss_ok and all(c.passed for c in checks)
    return VerifyReport(
        passed=passed,
        loss_actual=loss,
        loss_rel_error=_rel_error(np.array(loss), np.array(reference.loss)),
        variables=tuple(checks),
        problems=tuple(problems),
        **base,
    )


def verify_many(
    graph_spec: str,
    cluster: Cluster | Any,
    strategies: Sequence[Strategy | DistributedGraph | str | dict],
    *,
    batch_size: int = 4,
    rtol: float = 1e-4,
    atol: float = 1e-12,
    seed: int = 0,
    precision: str = "float64",
    image_size: int | None = None,
) -> list[VerifyReport]:
    """:func:`verify` for several strategies, running the original step once."""
    if not isinstance(cluster, Cluster):
        cluster = load_cluster(cluster)
    if batch_size < 1:
        raise InvalidInput(f"batch size must be >= 1, got {batch_size}")
    if precision not in ("float64", "float32"):
        raise InvalidInput(f"precision must be float64 or float32, got {precision!r}")
    double = precision == "float64"
    tf = _tensorflow()
    original = _load_original(graph_spec, batch_size, image_size, seed, double)
    planned: list[tuple[DistributedGraph, str, tuple]] = []
    for index, item in enumerate(strategies):
        if isinstance(item, DistributedGraph):
            compiled, label = item, f"compiled graph {index}"
        else:
            strategy = item if isinstance(item, Strategy) else load_strategy(item)
            resolved = resolve(strategy, original.ir, cluster)
            compiled = compile_graphdef(original.graph_def, original.ir, cluster, resolved)
            label = strategy.name or f"strategy {index}"
        splits = batch_norm_splits(original.ir, compiled.placement)
        planned.append((compiled, label, tuple(sorted(splits.items()))))
    # one reference step per way of splitting the batch norms, dropped after its last use
    reports: dict[int, VerifyReport] = {}
    for key in dict.fromkeys(key for _, _, key in planned):
        reference = _run_original(tf, original, key, double)
        for index, (compiled, label, used) in enumerate(planned):
            if used == key:
                reports[index] = _run_compiled(
                    tf, reference, cluster, compiled, label, rtol, atol, double
                )
        del reference
    return [reports[index] for index in range(len(planned))]


def verify(
    graph_spec: str,
    cluster: Cluster | Any,
    strategy: Strategy | DistributedGraph | str | dict,
    *,
    batch_size: int = 4,
    rtol: float = 1e-4,
    atol: float = 1e-12,
    seed: int = 0,
    precision: str = "float64",
    image_size: int | None = None,
) -> VerifyReport:
    """Check that ``strategy`` compiled for ``cluster`` computes what ``graph_spec`` does.

    ``strategy`` is a strategy (an object, JSON text or a decoded document) to compile, or
    a :class:`~.graphdef.DistributedGraph` compiled earlier (at the same batch) to check
    as it is. ``seed`` fixes the random batch; ``image_size`` rebuilds a zoo image
    classifier on smaller images (:func:`tagplan.planner.zoo.generate.build`). Bad input raises
    :class:`~tagplan.planner.errors.InvalidInput`; a compiled graph that TensorFlow
    refuses or that computes something else gives a failing report.
    """
    return verify_many(
        graph_spec,
        cluster,
        [strategy],
        batch_size=batch_size,
        rtol=rtol,
        atol=atol,
        seed=seed,
        precision=precision,
        image_size=image_size,
    )[0]
