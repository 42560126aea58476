"""The profiler (TAG §4.1.2, §5.1): run a training graph with TensorFlow tracing.

For each batch size the graph is imported into a fresh ``tf.Graph`` pinned to one device,
its variables are initialized, and the training step runs ``warmup`` times untraced, then
``runs`` times untraced (the median wall time is the step time) interleaved with ``runs``
times with ``FULL_TRACE``. Each traced node is mapped to its op in the analyzer's IR of the
same graph at that batch size; an op's time is the median over runs, and a cost key's time
the median over the ops sharing it. Nodes the analyzer dropped (identities, no-ops, the
initializer) or does not know (the runtime's feed and fetch nodes) are skipped.

The session is configured so that traced times belong to the graph's own ops and add up:

* ``inter_op_parallelism_threads=1`` on a pool of the session's own
  (``use_per_session_threads``; the process-wide pool keeps the size of the first session
  that made it): one op at a time. With the default pool independent ops overlap, so the
  sum of op times exceeds the step's wall time; serialized, the sum of op times is
  comparable to the step time (the simulator adds up op times per device, TAG §4.3).
  Intra-op threads stay at TensorFlow's default: each kernel uses the whole device.
* graph rewriting off (Grappler and the classic optimizer's constant folding and common
  subexpression elimination): otherwise MatMul, BiasAdd and Relu run fused under one node
  and the parts cannot be timed, and folded nodes disappear from the trace. The fusions
  TensorFlow's oneDNN pass still makes on CPUs are attributed by :func:`attribute_to_ops`.

TensorFlow is imported inside the functions, so importing this module is cheap.

Why one module: tracing, attributing the trace to ops and fitting the times are one
measurement with one set of TensorFlow conventions; apart, each would repeat them.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from tagplan.planner.cost.profile import PROFILE_FORMAT, PROFILE_VERSION, Profile
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.analyzer import analyze, graph_fingerprint
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.load import loads_graph_def
from tagplan.planner.graph.protos import DT_RESOURCE, dtype_name
from tagplan.planner.graph.source import ZOO_PREFIX, GraphSource, load_graph_source

__all__ = [
    "DevicePeaks",
    "NodeTime",
    "attribute_to_ops",
    "measure_device_peaks",
    "node_times_from_step_stats",
    "profile_graph",
]

log = logging.getLogger(__name__)

DEFAULT_TRAIN_NODE = "train_op"
DEFAULT_INIT_NODE = "init"
DEFAULT_LOSS_NODE = "loss"
MIB = 1024 * 1024
_KERNEL = re.compile(r"= (\S+?)\(")
# Ops that carry a fused kernel's time (see attribute_to_ops).
_COMPUTE_OPS = frozenset(
    {
        "Conv2D",
        "Conv3D",
        "DepthwiseConv2dNative",
        "Conv2DBackpropInput",
        "Conv2DBackpropFilter",
        "MatMul",
        "BatchMatMul",
        "BatchMatMulV2",
        "BatchMatMulV3",
    }
)


class NodeTime(NamedTuple):
    """One traced node: seconds of its kernel(s) and the kernel that ran (may be fused)."""

    seconds: float
    kernel: str


@dataclass(frozen=True)
class _Feed:
    """One placeholder to fill with random data; integers take values in ``[0, high)``."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    high: int | None = None


@dataclass(frozen=True)
class _Target:
    """A runnable training graph at one batch size."""

    tf_graph_bytes: bytes
    graph_def: Any  # this package's GraphDef, for the analyzer
    feeds: list[_Feed]
    train_node: str
    init_node: str | None
    batch_inputs: list[str] | None
    loss: str | None


@dataclass(frozen=True)
class DevicePeaks:
    """Best achieved throughput of a device: float32 FLOP/s and memory bytes/s.

    ``matmul_size`` is the square MatMul size ``n`` that reached ``fp32_flops``.
    """

    fp32_flops: float
    memory_bandwidth_bytes_per_s: float
    matmul_size: int


def _check_options(gpu_type: str, batch_sizes: Sequence[int], runs: int, warmup: int) -> list[int]:
    if not isinstance(gpu_type, str) or not gpu_type.strip():
        raise InvalidInput("gpu_type must be a non-empty name, e.g. 'V100-32GB' or 'CPU'")
    sizes = list(batch_sizes)
    if not sizes:
        raise InvalidInput("batch_sizes must name at least one batch size")
    bad = [b for b in sizes if isinstance(b, bool) or not isinstance(b, int) or b <= 0]
    if bad:
        raise InvalidInput(f"batch sizes must be positive integers, got {bad}")
    if len(set(sizes)) != len(sizes):
        raise InvalidInput(f"duplicate batch sizes in {sizes}")
    if runs < 1:
        raise InvalidInput(f"runs must be at least 1, got {runs}")
    if warmup < 0:
        raise InvalidInput(f"warmup must not be negative, got {warmup}")
    return sorted(sizes)


def _file_feeds(source: GraphSource, batch: int) -> list[_Feed]:
    """Placeholders of a graph file at ``batch``; refuses a batch its shapes do not allow.

    A batch dimension of -1 accepts any batch size, a fixed one only itself.
    """
    feeds = []
    for node in source.graph_def.node:
        if node.op != "Placeholder":
            continue
        dtype = node.attr["dtype"].type if "dtype" in node.attr else 0
        if dtype == DT_RESOURCE:
            raise InvalidInput(
                f"placeholder {node.name!r} is a captured variable (resource): the graph cannot "
                "run on its own; export a graph that creates its variables"
            )
        if "shape" not in node.attr or node.attr["shape"].shape.unknown_rank:
            raise InvalidInput(
                f"placeholder {node.name!r} has an unknown shape: cannot make a random batch"
            )
        dims = [int(d.size) for d in node.attr["shape"].shape.dim]
        if dims:
            if dims[0] >= 0 and dims[0] != batch:
                raise InvalidInput(
                    f"graph {source.label!r} has a fixed batch size of {dims[0]} (placeholder "
                    f"{node.name!r} has shape {dims}): it cannot be profiled at batch size "
                    f"{batch}; export it with a batch dimension of -1 to profile other sizes"
                )
            dims[0] = batch
        if any(d < 0 for d in dims):
            raise InvalidInput(
                f"placeholder {node.name!r} has an unknown dimension besides the batch "
                f"({dims}): cannot make a random batch"
            )
        name = dtype_name(dtype)
        if name == "string" or name.startswith("complex"):
            raise InvalidInput(f"placeholder {node.name!r} has dtype {name}: cannot feed it")
        feeds.append(_Feed(node.name, name, tuple(dims)))
    return feeds


def _file_target(
    source: GraphSource, batch: int, train_node: str | None, init_node: str | None
) -> _Target:
    names = {node.name for node in source.graph_def.node}
    train = train_node or DEFAULT_TRAIN_NODE
    if train not in names:
        raise InvalidInput(
            f"train node {train!r} is not in graph {source.label!r}; name the training op"
        )
    init = init_node if init_node is not None else DEFAULT_INIT_NODE
    if init not in names:
        if init_node is not None:
            raise InvalidInput(f"init node {init!r} is not in graph {source.label!r}")
        init = None
    return _Target(
        tf_graph_bytes=source.graph_def.SerializeToString(),
        graph_def=source.graph_def,
        feeds=_file_feeds(source, batch),
        train_node=train,
        init_node=init,
        batch_inputs=source.batch_inputs,
        loss=source.loss or (DEFAULT_LOSS_NODE if DEFAULT_LOSS_NODE in names else None),
    )


def _zoo_target(name: str, batch: int, train_node: str | None, init_node: str | None) -> _Target:
    from tagplan.planner.zoo.generate import build

    graph = build(name, batch_size=batch)
    data = graph.graph_def.SerializeToString()
    return _Target(
        tf_graph_bytes=data,
        graph_def=loads_graph_def(data),
        feeds=[
            _Feed(spec["name"], spec["dtype"], tuple(spec["shape"]), spec.get("high"))
            for spec in graph.inputs
        ],
        train_node=train_node or graph.train_node,
        init_node=init_node if init_node is not None else graph.init_node,
        batch_inputs=[spec["name"] for spec in graph.inputs],
        loss=graph.loss_node,
    )


def _random_batch(tf: Any, feeds: list[_Feed], rng: np.random.Generator) -> list[np.ndarray]:
    """Uniform [0, 1) floats; integers uniform in [0, high) when known, else zeros."""
    values = []
    for feed in feeds:
        dtype = tf.as_dtype(feed.dtype)
        if feed.high is not None:
            value = rng.integers(0, feed.high, feed.shape)
        elif dtype.is_floating:
            value = rng.random(feed.shape)
        else:
            value = np.zeros(feed.shape)
        values.append(value.astype(dtype.as_numpy_dtype))
    return values


def _check_device(tf: Any, device: str) -> str:
    """The canonical name of ``device`` if TensorFlow sees it, else ``InvalidInput``."""
    try:
        spec = tf.DeviceSpec.from_string(device)
    except ValueError as exc:
        raise InvalidInput(f"device {device!r} is not a TensorFlow device name: {exc}") from None
    if not spec.device_type:
        raise InvalidInput(f"device {device!r} names no device type, e.g. '/GPU:0'")
    wanted = (spec.device_type.upper(), spec.device_index or 0)
    available = tf.config.list_logical_devices()
    for logical in available:
        found = tf.DeviceSpec.from_string(logical.name)
        if (found.device_type.upper(), found.device_index or 0) == wanted:
            return logical.name
    names = ", ".join(d.name for d in available)
    raise InvalidInput(f"device {device!r} is not available; TensorFlow sees: {names}")


def _describe_device(tf: Any, device: str) -> str:
    spec = tf.DeviceSpec.from_string(device)
    if spec.device_type.upper() == "CPU":
        model = platform.processor() or platform.machine()
        cpuinfo = Path("/proc/cpuinfo")
        if cpuinfo.exists():
            for line in cpuinfo.read_text(errors="replace").splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        return f"{model}, {os.cpu_count()} logical cores"
    physical = tf.config.list_physical_devices(spec.device_type.upper())
    index = spec.device_index or 0
    if index < len(physical):
        details = tf.config.experimental.get_device_details(physical[index])
        return str(details.get("device_name", physical[index].name))
    return device


def _session_config(tf: Any) -> Any:
    """One op at a time, no graph rewriting (see the module docstring)."""
    from tensorflow.core.protobuf import rewriter_config_pb2

    return tf.compat.v1.ConfigProto(
        inter_op_parallelism_threads=1,
        use_per_session_threads=True,  # the process-wide pool keeps its first session's size
        allow_soft_placement=True,
        graph_options=tf.compat.v1.GraphOptions(
            optimizer_options=tf.compat.v1.OptimizerOptions(
                opt_level=tf.compat.v1.OptimizerOptions.L0,
                do_common_subexpression_elimination=False,
                do_constant_folding=False,
            ),
            rewrite_options=rewriter_config_pb2.RewriterConfig(disable_meta_optimizer=True),
        ),
    )


def _node_seconds(stats: Any) -> float:
    """Kernel time of one traced node: op start to op end, else the whole record."""
    if stats.op_end_rel_nanos > 0:
        return max(0, stats.op_end_rel_nanos - stats.op_start_rel_nanos) / 1e9
    if stats.op_end_rel_micros > 0:
        return max(0, stats.op_end_rel_micros - stats.op_start_rel_micros) / 1e6
    if stats.all_end_rel_nanos > 0:
        return stats.all_end_rel_nanos / 1e9
    return stats.all_end_rel_micros / 1e6


def node_times_from_step_stats(step_stats: Any) -> dict[str, NodeTime]:
    """Seconds and executed kernel per node name of one traced step (a ``StepStats``).

    The kernel comes from the executor's timeline label (``name = Kernel(inputs)``). GPU
    traces also list each node's kernels on ``.../stream:all``; there a node's time is the
    sum of its kernels (the executor's record only covers the launch). Nodes without
    kernels, and every node of a CPU, take the executor's op start to op end. A stream name
    such as ``conv/Conv2D:Conv2D`` is reduced to the node name before the colon.
    """
    times: dict[str, float] = defaultdict(float)
    kernels: dict[str, str] = {}
    streamed: dict[str, float] = defaultdict(float)
    for dev in step_stats.dev_stats:
        on_stream = "/stream:" in dev.device or "/memcpy" in dev.device
        if on_stream and not dev.device.endswith("/stream:all"):
            continue  # per-stream copies of the stream:all records
        for stats in dev.node_stats:
            name = stats.node_name.split(":", 1)[0]
            if on_stream:
                streamed[name] += _node_seconds(stats)
                continue
            times[name] += _node_seconds(stats)
            match = _KERNEL.search(stats.timeline_label)
            kernels.setdefault(name, match.group(1) if match else "")
    times.update(streamed)
    return {name: NodeTime(seconds, kernels.get(name, "")) for name, seconds in times.items()}


def attribute_to_ops(ir: GraphIR, nodes: dict[str, NodeTime]) -> dict[int, float]:
    """Seconds per IR op of one traced step, with fused kernels given to their parts.

    Nodes the analyzer dropped or does not know are skipped. A node that ran as a fused
    kernel (the CPU's oneDNN pass turns ``BiasAdd(Conv2D(x))`` into one
    ``_MklNativeConv2DWithBias`` named after the BiasAdd, ``Conv2D(Pad(x))`` into
    ``_MklNativePadWithConv2D``) absorbed its untraced producers whose op type its kernel
    name contains. The group's time goes to its compute op (convolution, MatMul) and the
    absorbed rest get 0: on this device their work costs nothing extra.
    """
    times: dict[int, float] = {}
    kernels: dict[int, str] = {}
    for name, node in nodes.items():
        if name in ir.aliases:
            continue  # a dropped identity: its time is not its producer's
        try:
            op = ir.op_index(name)
        except KeyError:
            continue
        times[op] = times.get(op, 0.0) + node.seconds
        kernels[op] = node.kernel.lower()
    for op, kernel in kernels.items():
        if not kernel or kernel.lstrip("_") == ir.op_types[op].lower():
            continue
        producers = {int(ir.tensor_producer[t]) for t in ir.inputs(op)}
        absorbed = sorted(
            p for p in producers if p not in times and ir.op_types[p].lower() in kernel
        )
        if not absorbed:
            continue
        group = [op, *absorbed]
        primary = next((m for m in group if ir.op_types[m] in _COMPUTE_OPS), op)
        total = times[op]
        for member in group:
            times[member] = 0.0
        times[primary] = total
    return times


def _run(
    tf: Any, target: _Target, device: str, values: list[np.ndarray], runs: int, warmup: int
) -> tuple[list[dict[str, NodeTime]], float]:
    """Traced node times of ``runs`` steps and the median wall time of untraced steps.

    The step fetches the loss with the training op, as training does, so that the loss
    computation runs.
    """
    graph_def = tf.compat.v1.GraphDef.FromString(target.tf_graph_bytes)
    for node in graph_def.node:
        node.device = ""
    graph = tf.Graph()
    with graph.as_default(), tf.device(device):
        tf.compat.v1.import_graph_def(graph_def, name="")
    try:
        fetches: list[Any] = [graph.get_operation_by_name(target.train_node)]
        init = None
        if target.init_node is not None:
            init = graph.get_operation_by_name(target.init_node)
        if target.loss is not None and graph.get_operation_by_name(target.loss).outputs:
            fetches.append(graph.get_tensor_by_name(f"{target.loss}:0"))
        inputs = [graph.get_tensor_by_name(f"{feed.name}:0") for feed in target.feeds]
    except (KeyError, ValueError) as exc:
        raise InvalidInput(f"graph cannot be run: {exc}") from None
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    traced: list[dict[str, NodeTime]] = []
    walls: list[float] = []
    try:
        with tf.compat.v1.Session(graph=graph, config=_session_config(tf)) as session:
            if init is not None:
                session.run(init)
            step = session.make_callable(fetches, feed_list=inputs, accept_options=True)
            for _ in range(warmup):
                step(*values)
            for _ in range(runs):  # interleaved, so both see the same machine conditions
                start = time.perf_counter()
                step(*values)
                walls.append(time.perf_counter() - start)
                metadata = tf.compat.v1.RunMetadata()
                step(*values, options=options, run_metadata=metadata)
                traced.append(node_times_from_step_stats(metadata.step_stats))
    except tf.errors.OpError as exc:
        raise InvalidInput(f"the training step failed: {exc.message}") from None
    return traced, statistics.median(walls)


def _key_times(ir: GraphIR, traced: list[dict[str, NodeTime]]) -> dict[str, float]:
    """Median over runs per IR op, then median over the ops sharing a cost key."""
    per_op: dict[int, list[float]] = defaultdict(list)
    for nodes in traced:
        for op, seconds in attribute_to_ops(ir, nodes).items():
            per_op[op].append(seconds)
    per_key: dict[str, list[float]] = defaultdict(list)
    for op in sorted(per_op):
        per_key[ir.cost_keys[op]].append(statistics.median(per_op[op]))
    return {key: statistics.median(times) for key, times in per_key.items()}


def profile_graph(
    source_spec: str,
    *,
    device: str = "/CPU:0",
    gpu_type: str,
    batch_sizes: Sequence[int],
    runs: int = 5,
    warmup: int = 2,
    train_node: str | None = None,
    init_node: str | None = None,
    seed: int = 0,
) -> Profile:
    """Profile every op of a training graph at each batch size (TAG §4.1.2, §5.1).

    Parameters
    ----------
    source_spec
        ``zoo:NAME`` (the model is rebuilt at each batch size) or a graph file, which is
        run only at batch sizes its placeholders allow (batch dimension -1: any).
    device
        TensorFlow device to run on, e.g. ``/CPU:0`` or ``/GPU:1``.
    gpu_type
        Catalog name the profile is recorded under, e.g. ``V100-32GB``.
    batch_sizes
        Batch sizes to measure; TAG profiles typical sizes below 60.
    runs, warmup
        Traced (and timed untraced) steps per batch size, and untimed steps before them.
    train_node, init_node
        Override the training op and variable initializer (default for graph files:
        ``train_op`` and ``init`` when present).
    seed
        Seed of the random input batches.

    Returns
    -------
    Profile
        Per cost key, seconds of one op execution at each batch size, and the median
        wall time of a step per batch size.
    """
    sizes = _check_options(gpu_type, batch_sizes, runs, warmup)
    source = load_graph_source(source_spec)
    zoo_name: str | None = None
    if source_spec.startswith(ZOO_PREFIX):
        from tagplan.planner.zoo import catalog

        zoo_name = source_spec[len(ZOO_PREFIX) :]
        if not catalog.get_model(zoo_name).runnable:
            raise InvalidInput(
                f"zoo model {zoo_name!r} captures its variables as placeholders and cannot "
                "run on its own; profile a TF1-style model"
            )
        graph_label = source_spec
    else:  # refuse a disallowed batch size or a missing node before running anything
        file_targets = {b: _file_target(source, b, train_node, init_node) for b in sizes}
        graph_label = Path(source_spec).name

    import tensorflow as tf

    device_name = _check_device(tf, device)
    rng = np.random.default_rng(seed)
    times: dict[str, dict[int, float]] = {}
    op_types: dict[str, str] = {}
    counts: Counter[str] = Counter()
    step_times: dict[int, float] = {}
    for batch in sizes:
        started = time.perf_counter()
        if zoo_name is not None:
            target = _zoo_target(zoo_name, batch, train_node, init_node)
        else:
            target = file_targets[batch]
        ir = analyze(
            target.graph_def,
            batch_size=batch,
            batch_inputs=target.batch_inputs,
            loss=target.loss,
        )
        values = _random_batch(tf, target.feeds, rng)
        traced, step_times[batch] = _run(tf, target, device_name, values, runs, warmup)
        key_counts = Counter(ir.cost_keys)
        key_types = dict(zip(reversed(ir.cost_keys), reversed(ir.op_types), strict=True))
        for key, seconds in _key_times(ir, traced).items():
            times.setdefault(key, {})[batch] = seconds
            op_types.setdefault(key, key_types[key])
            counts[key] = max(counts[key], key_counts[key])
        log.info(
            "profiled %s at batch size %d in %.1f s (step %.4f s)",
            graph_label,
            batch,
            time.perf_counter() - started,
            step_times[batch],
        )
    return Profile(
        format=PROFILE_FORMAT,
        version=PROFILE_VERSION,
        device={
            "gpu_type": gpu_type,
            "description": _describe_device(tf, device_name),
            "tensorflow_version": tf.__version__,
        },
        source={"graph": graph_label, "fingerprint": graph_fingerprint(source.graph_def)},
        batch_sizes=sizes,
        step_time_s=step_times,
        ops=[
            {"cost_key": key, "op_type": op_types[key], "times_s": by_batch, "count": counts[key]}
            for key, by_batch in times.items()
        ],
    )


def _median_seconds(fn: Any, runs: int) -> float:
    fn()  # warm up: first call allocates and picks kernels
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure_device_peaks(
    device: str = "/CPU:0",
    *,
    matmul_sizes: Sequence[int] = (1024, 2048, 4096),
    elementwise_bytes: int = 256 * MIB,
    runs: int = 5,
) -> DevicePeaks:
    """Achieved float32 FLOP/s and memory bandwidth of a device, for its catalog entry.

    FLOP/s: the best over ``matmul_sizes`` of :math:`2n^3` / median time of an ``n x n``
    MatMul. Bandwidth: ``x + 1`` over a float32 tensor of ``elementwise_bytes``, counting
    the read and the write: :math:`2 S` / median time.
    """
    if runs < 1:
        raise InvalidInput(f"runs must be at least 1, got {runs}")
    if not matmul_sizes or any(n <= 0 for n in matmul_sizes):
        raise InvalidInput(f"matmul sizes must be positive, got {list(matmul_sizes)}")
    if elementwise_bytes < 4:
        raise InvalidInput(f"elementwise_bytes must be at least 4, got {elementwise_bytes}")
    import tensorflow as tf

    device_name = _check_device(tf, device)
    best_flops, best_size = 0.0, int(matmul_sizes[0])
    with tf.device(device_name):
        for n in matmul_sizes:
            a = tf.random.uniform((n, n), dtype=tf.float32)
            b = tf.random.uniform((n, n), dtype=tf.float32)

            def matmul(a: Any = a, b: Any = b) -> None:
                tf.linalg.matmul(a, b)[0, 0].numpy()  # fetching one value waits for the op

            flops = 2.0 * n**3 / _median_seconds(matmul, runs)
            if flops > best_flops:
                best_flops, best_size = flops, int(n)
            del a, b
        elements = elementwise_bytes // 4
        x = tf.random.uniform((elements,), dtype=tf.float32)

        def add_one() -> None:
            (x + 1.0)[0].numpy()

        bandwidth = 2.0 * elements * 4 / _median_seconds(add_one, runs)
    return DevicePeaks(
        fp32_flops=best_flops, memory_bandwidth_bytes_per_s=bandwidth, matmul_size=best_size
    )
