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

The initial and updated values wait in a scratch directory (:class:`~.values.ValueStore`)
and move in and out of the sessions a batch at a time, so a verification holds little
more than what its session holds: every variable once per mirror and the step's
gradients. That is what lets BERT-Large's 335M parameters verify on one machine.

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
In float32 the same rule holds with ``1e-6`` for ``1e-12`` (float32 rounds at ``6e-8``):
BERT-Large under unequal batch shares has kernel elements whose gradient is ``2e-8``,
rounding of sums of much larger terms, and Adam moves them ``1.5e-5`` apart, 1.5% of its
step; the floor of such elements then reaches the step itself, so in float32 their
slots carry the check.

An element far smaller than its variable's largest is what is left of a sum that nearly
cancelled: its rounding is that of the terms, not its own, and a different order of the
same additions moves it by a large fraction of itself (in ResNet-101 under unequal batch
shares, Adam's first moment of a few kernels has elements ``6e-8`` of the kernel's
largest, and they differ by ``2e-4`` relatively, ``1.5e-11`` of the largest, in
float64). So no element is asked to be closer than ``rtol * 1e-5`` of its variable's
largest magnitude (``1e-9`` at the default ``rtol``): more than 50 times that rounding,
and a wrong rewrite, which moves elements by a fraction of the largest, is still
millions of times over it.

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
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tagplan.planner.compile.batchnorm import batch_norm_splits, running_copies
from tagplan.planner.compile.compare import Tolerance, compare, largest_magnitude
from tagplan.planner.compile.graphdef import DistributedGraph, compile_graphdef
from tagplan.planner.compile.lowering import lower_for_cpu, to_float64
from tagplan.planner.compile.reference import (
    Reference,
    assign_values,
    assigner,
    batches,
    load_original,
    load_tensorflow,
    open_session,
    reader,
    run_reference,
)
from tagplan.planner.compile.values import ValueStore
from tagplan.planner.compile.verify_memory import GIB, available_bytes, verification_bytes
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.strategy import Strategy, load_strategy, resolve
from tagplan.planner.topology import Cluster, load_cluster

__all__ = [
    "VariableCheck",
    "VerifyOptions",
    "VerifyReport",
    "lower_for_cpu",
    "to_float64",
    "verify",
    "verify_many",
]

_UNSET = float("nan")
# no element is compared closer than rtol times this much of its variable's largest magnitude
_CANCELLATION = 1e-5


@dataclass(frozen=True)
class VariableCheck:
    """One variable: how many replicas were compared and the worst errors among them."""

    name: str
    replicas: int
    max_abs_error: float
    max_rel_error: float
    max_scaled_error: float  # the largest absolute error over the largest expected magnitude
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


def _check(
    name: str, replicas: list[tuple[str, np.ndarray, np.ndarray]], tolerance: Tolerance
) -> tuple[VariableCheck, list[str]]:
    """Every replica ``(node, actual, expected)`` of variable ``name``."""
    found, problems = [], []
    for node, actual, expected in replicas:
        if actual.shape != expected.shape:
            problems.append(f"{node}: shape {actual.shape} != {expected.shape}")
            continue
        errors = compare(actual, expected, tolerance)
        found.append(errors)
        if not errors.close:
            problems.append(
                f"{node}: max relative error {errors.max_rel:.3g} > {tolerance.rtol:g} "
                f"(max absolute error {errors.max_abs:.3g})"
            )
    worst = [
        max((getattr(e, field) for e in found), default=math.inf)
        for field in ("max_abs", "max_rel", "scaled")
    ]
    return VariableCheck(name, len(replicas), *worst, not problems), problems


def _expected(
    reference: Reference, compiled: DistributedGraph, name: str, rtol: float, atol: float
) -> tuple[list[np.ndarray], Tolerance]:
    """The expected value of each copy of variable ``name``, and the tolerance."""
    expected = reference.updated.get(name)
    values = [expected] * len(compiled.device_map["variables"][name])
    running = reference.running.get(name)
    if running is not None:
        statistic, per_replica = running
        rows = dict(reference.splits)[statistic.forward]
        which = running_copies(reference.ir, compiled.placement, statistic, rows)
        values = [expected if k is None else per_replica[k] for k in which]
    floor = max(atol, rtol * _CANCELLATION * largest_magnitude(expected))
    mask = reference.noise.get(name)
    if mask is None or mask.shape != expected.shape:
        return values, Tolerance(rtol, floor)
    return values, Tolerance(rtol, floor, mask, reference.noise_floor)


def _run_compiled(
    tf: Any,
    reference: Reference,
    cluster: Cluster,
    compiled: DistributedGraph,
    label: str,
    rtol: float,
    atol: float,
    double: bool,
) -> VerifyReport:
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
                    assigns[node] = (*assigner(tf, graph, node), name)
                    reads[node] = reader(tf, graph, node)
            feed = {}
            for name, pieces in device_map["inputs"].items():
                for node, lo, hi in pieces:
                    feed[f"{node}:0"] = reference.feed[name][lo:hi]
            with open_session(tf, graph, cluster.num_devices) as session:
                assign_values(session, assigns, reference.initial)
                loss, _ = session.run([f"{device_map['loss']}:0", device_map["train_op"]], feed)
                results = []
                size = {n: reference.initial.nbytes(n) * len(replicas[n]) for n in replicas}
                for batch in batches(list(replicas), size.__getitem__):
                    values = session.run({n: reads[n] for name in batch for n in replicas[name]})
                    for name in batch:
                        copies, tolerance = _expected(reference, compiled, name, rtol, atol)
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
    loss_errors = compare(np.array(loss), np.array(reference.loss), Tolerance(rtol, atol))
    loss_ok = loss_errors.close
    if not loss_ok:
        problems.append(f"loss {loss:.8g} != {reference.loss:.8g}")
    problems += [p for _, found in results for p in found]
    checks = [check for check, _ in results]
    passed = loss_ok and all(c.passed for c in checks)
    return VerifyReport(
        passed=passed,
        loss_actual=loss,
        loss_rel_error=loss_errors.max_rel,
        variables=tuple(checks),
        problems=tuple(problems),
        **base,
    )


@dataclass(frozen=True)
class VerifyOptions:
    """How :func:`verify_many` runs: the batch, the criterion, the precision, the seed of
    the random batch, a zoo image classifier's image size, and the memory it may use."""

    batch_size: int = 4
    rtol: float = 1e-4
    atol: float = 1e-12
    seed: int = 0
    precision: str = "float64"
    image_size: int | None = None
    memory_limit_bytes: int | None = None  # at most this, and what the machine has

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise InvalidInput(f"batch size must be >= 1, got {self.batch_size}")
        if self.precision not in ("float64", "float32"):
            raise InvalidInput(f"precision must be float64 or float32, got {self.precision!r}")

    @property
    def double(self) -> bool:
        return self.precision == "float64"


def _check_memory(
    ir: GraphIR, planned: list[tuple[DistributedGraph, str]], options: VerifyOptions
) -> None:
    """Refuse, with the figures, a verification that cannot fit the memory it may use."""
    limits = [b for b in (available_bytes(), options.memory_limit_bytes) if b is not None]
    if not limits or not planned:
        return
    need, label = max((verification_bytes(ir, c, options.double), lb) for c, lb in planned)
    if need > min(limits):
        where = (
            f"the limit is {options.memory_limit_bytes / GIB:.1f} GiB"
            if min(limits) == options.memory_limit_bytes
            else f"this machine has {min(limits) / GIB:.1f} GiB available"
        )
        advice = "float32 (--precision float32 --rtol 1e-3 --atol 1e-5), " if options.double else ""
        raise InvalidInput(
            f"verifying {label} needs about {need / GIB:.1f} GiB of memory and {where}: "
            f"verify in {advice}on a cluster with fewer GPUs, or with more memory"
        )


def verify_many(
    graph_spec: str,
    cluster: Cluster | Any,
    strategies: Sequence[Strategy | DistributedGraph | str | dict],
    **options: Any,
) -> list[VerifyReport]:
    """:func:`verify` for several strategies, running the original step once; ``options``
    are the fields of :class:`VerifyOptions`."""
    if not isinstance(cluster, Cluster):
        cluster = load_cluster(cluster)
    settings = VerifyOptions(**options)
    tf = load_tensorflow()
    with tempfile.TemporaryDirectory(prefix="tagplan-verify-") as scratch:
        return _verify_all(tf, graph_spec, cluster, strategies, Path(scratch), settings)


def _verify_all(
    tf: Any,
    graph_spec: str,
    cluster: Cluster,
    strategies: Sequence[Strategy | DistributedGraph | str | dict],
    scratch: Path,
    options: VerifyOptions,
) -> list[VerifyReport]:
    double = options.double
    initial = ValueStore(scratch / "initial")
    original = load_original(
        graph_spec, options.batch_size, options.image_size, options.seed, double, initial
    )
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
    _check_memory(original.ir, [(c, label) for c, label, _ in planned], options)
    # one reference step per way of splitting the batch norms, dropped after its last use
    reports: dict[int, VerifyReport] = {}
    for number, key in enumerate(dict.fromkeys(key for _, _, key in planned)):
        updated = ValueStore(scratch / f"updated-{number}")
        reference = run_reference(tf, original, key, double, updated)
        for index, (compiled, label, used) in enumerate(planned):
            if used == key:
                reports[index] = _run_compiled(
                    tf, reference, cluster, compiled, label, options.rtol, options.atol, double
                )
        updated.remove()
    return [reports[index] for index in range(len(planned))]


def verify(
    graph_spec: str,
    cluster: Cluster | Any,
    strategy: Strategy | DistributedGraph | str | dict,
    **options: Any,
) -> VerifyReport:
    """Check that ``strategy`` compiled for ``cluster`` computes what ``graph_spec`` does.

    ``strategy`` is a strategy (an object, JSON text or a decoded document) to compile, or
    a :class:`~.graphdef.DistributedGraph` compiled earlier (at the same batch) to check
    as it is. ``options`` are the fields of :class:`VerifyOptions`: ``seed`` fixes the
    random batch; ``image_size`` rebuilds a zoo image classifier on smaller images
    (:func:`tagplan.planner.zoo.generate.build`). Bad input raises
    :class:`~tagplan.planner.errors.InvalidInput`, and so does a step estimated not to fit
    the memory (:mod:`.verify_memory`); a compiled graph that TensorFlow refuses or that
    computes something else gives a failing report.
    """
    return verify_many(graph_spec, cluster, [strategy], **options)[0]
