"""Correctness by execution (docs/design.md §5): run the original training step and the
compiled distributed one in TensorFlow and compare the loss and every updated variable.

:func:`verify` rebuilds or loads the graph at a small batch, compiles the strategy with
:func:`~tagplan.planner.compile.graphdef.compile_graphdef`, runs both steps from the same
initial values and batch on virtual CPU devices (one per GPU; GPU-only collectives lowered by
:func:`lower_for_cpu`), in float64 by default, and compares every replica of every
variable elementwise with ``|actual - expected| <= atol + rtol * |expected|``. Values
wait in a scratch directory (:class:`~.values.ValueStore`) so BERT-Large verifies on one
machine. Batch norms split across replicas are compared with a reference that normalizes
per replica (:mod:`.batchnorm`). The tolerances, the floors for elements whose exact
gradient is zero or that cancel, and the batch-norm rules are explained in
docs/verification.md.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tagplan.planner.compile.graphdef import DistributedGraph, compile_graphdef
from tagplan.planner.errors import InvalidInput
from tagplan.planner.evaluate import resolve_planned
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.strategy import Strategy, load_strategy
from tagplan.planner.topology import Cluster, load_cluster
from tagplan.planner.verify.batchnorm import batch_norm_splits, running_copies
from tagplan.planner.verify.compare import Tolerance, compare, largest_magnitude
from tagplan.planner.verify.lowering import (
    bind_captured,
    lower_for_cpu,
    replica_bindings,
    to_float64,
)
from tagplan.planner.verify.memory import GIB, available_bytes, verification_bytes
from tagplan.planner.verify.reference import (
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
from tagplan.planner.verify.values import ValueStore

__all__ = [
    "VariableCheck",
    "VerifyOptions",
    "VerifyReport",
    "check_variable",
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
    values = [expected] * len(compiled.variable_replicas()[name])
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


def check_variable(
    reference: Reference,
    compiled: DistributedGraph,
    name: str,
    replicas: list[tuple[str, np.ndarray]],
    rtol: float,
    atol: float,
) -> tuple[VariableCheck, list[str]]:
    """The first replicas ``(node, value)`` of variable ``name`` (all of them, or the
    first alone as a checkpoint holds it) against the reference step, by verification's
    criterion (docs/verification.md); the check and its problems."""
    copies, tolerance = _expected(reference, compiled, name, rtol, atol)
    pairs = zip(replicas, copies, strict=False)
    found = [(node, value, expected) for (node, value), expected in pairs]
    return _check(name, found, tolerance)


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
    replicas = compiled.variable_replicas()
    problems = [f"variable {n} has no replica" for n in reference.initial if not replicas.get(n)]
    if device_map.get("loss") is None:
        problems.append("the compiled graph names no loss node")
    if problems:
        return VerifyReport(passed=False, problems=tuple(problems), **base)
    try:
        lowered = bind_captured(
            lower_for_cpu(compiled.graph_def, cluster), replica_bindings(compiled.device_map)
        )
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
                        found = [(n, values[n]) for n in replicas[name]]
                        results.append(check_variable(reference, compiled, name, found, rtol, atol))
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
    the random batch (and of a TF2 function's initial values), a zoo image classifier's
    image size, the memory it may use, and the loss node (default: the graph's; as
    ``--loss`` names it)."""

    batch_size: int = 4
    rtol: float = 1e-4
    atol: float = 1e-12
    seed: int = 0
    precision: str = "float64"
    image_size: int | None = None
    memory_limit_bytes: int | None = None  # at most this, and what the machine has
    loss: str | None = None

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
        graph_spec,
        options.batch_size,
        options.image_size,
        options.seed,
        double,
        initial,
        options.loss,
    )
    planned: list[tuple[DistributedGraph, str, tuple]] = []
    for index, item in enumerate(strategies):
        if isinstance(item, DistributedGraph):
            compiled, label = item, f"compiled graph {index}"
        else:
            strategy = item if isinstance(item, Strategy) else load_strategy(item)
            resolved = resolve_planned(strategy, original.ir, cluster)
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
    a :class:`~tagplan.planner.compile.graphdef.DistributedGraph` compiled earlier (at the
    same batch) to check as it is. ``options`` are the fields of :class:`VerifyOptions`:
    ``seed`` fixes the random batch; ``image_size`` rebuilds a zoo image classifier on
    smaller images (:func:`tagplan.planner.zoo.generate.build`). Bad input raises
    :class:`~tagplan.planner.errors.InvalidInput`, and so does a step estimated not to fit
    the memory (:mod:`.memory`); a compiled graph that TensorFlow refuses or that
    computes something else gives a failing report.
    """
    return verify_many(graph_spec, cluster, [strategy], **options)[0]
