"""The reference step of verification by execution (:mod:`.verify`): the original
graph at the verifying batch, run for one step on one device, with per-replica batch
statistics for the batch norms a strategy splits (:mod:`.batchnorm`); and the session
helpers both runs share."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tagplan.planner.compile.graphdef import CapturedVariable, captured_variables
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.params import VARIABLE_OPS
from tagplan.planner.graph.protos import GraphDef, dtype_name
from tagplan.planner.graph.source import ZOO_PREFIX, load_graph_source
from tagplan.planner.tensorflow_import import import_tensorflow
from tagplan.planner.verify.batchnorm import RunningStatistic, per_replica_statistics
from tagplan.planner.verify.lowering import bind_captured, to_float64
from tagplan.planner.verify.values import ValueStore

__all__ = [
    "Original",
    "Reference",
    "assign_values",
    "assigner",
    "batches",
    "load_original",
    "load_tensorflow",
    "open_session",
    "reader",
    "run_reference",
]

_REMAPPING_OFF = 2  # RewriterConfig.OFF
_BATCH_BYTES = 256 << 20  # variable values moved in and out of a session per run
# a gradient element this small relative to the step's largest may be rounding (float64,
# float32): some ten thousand and ten float epsilons
_NOISE_GRADIENT = {True: 1e-12, False: 1e-6}
_NOISE_FACTOR = 10.0  # such an element may move 10x as far as any such element of the reference


def _name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


@dataclass(eq=False)
class Original:
    """The original graph at the verifying batch, its batch and its initial values."""

    label: str
    graph_def: Any  # this package's GraphDef
    ir: GraphIR
    feed: dict[str, np.ndarray]
    init: str | None  # None for a TF2 function: its captured variables get drawn values
    train: str | list[str]  # the train node, or every sink of the step
    initial: ValueStore  # filled by the first reference step, or drawn for a TF2 function
    captured: dict[str, CapturedVariable] = field(default_factory=dict)


@dataclass(eq=False)
class Reference:
    """The original step's inputs and results."""

    label: str
    graph_def: Any  # this package's GraphDef
    ir: GraphIR
    feed: dict[str, np.ndarray]
    initial: ValueStore
    loss: float
    updated: ValueStore
    splits: tuple[tuple[str, tuple[tuple[int, int], ...]], ...] = ()
    # running statistic -> (its update, its value after the step from each replica's)
    running: dict[str, tuple[RunningStatistic, list[np.ndarray]]] = field(default_factory=dict)
    # parameter -> elements whose gradient is zero up to rounding, and the noise floor
    noise: dict[str, np.ndarray] = field(default_factory=dict)
    noise_floor: float = 0.0

    @property
    def per_replica_batch_norms(self) -> int:
        return len(self.splits)


def load_tensorflow() -> Any:
    return import_tensorflow("verification runs TensorFlow; install tagplan[tf]")


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
    graph_spec: str, batch_size: int, image_size: int | None, loss: str | None
) -> tuple[Any, GraphIR, list[dict], str | None, str | None]:
    """The graph at the verifying batch, its IR, input specs, init node (``None`` for a
    TF2 function) and train node; ``loss`` names the loss node, as ``--loss`` does."""
    if graph_spec.startswith(ZOO_PREFIX):
        from tagplan.planner.zoo import generate

        name = graph_spec[len(ZOO_PREFIX) :]
        built = generate.build(name, batch_size=batch_size, image_size=image_size)
        graph_def = GraphDef.FromString(built.graph_def.SerializeToString())
        inputs = [dict(spec) for spec in built.inputs]
        ir = analyze(
            graph_def,
            batch_size=batch_size,
            batch_inputs=[spec["name"] for spec in inputs],
            loss=loss or built.loss_node,
        )
        return graph_def, ir, inputs, built.init_node, built.train_node
    if image_size is not None:
        raise InvalidInput("only a zoo model is rebuilt at another image size")
    graph_def = load_graph_source(graph_spec).graph_def
    ir = analyze(graph_def, loss=loss)
    names = {node.name: node for node in graph_def.node}
    init = "init" if "init" in names else None
    inputs = []
    for op in ir.batch_input_ops.tolist():
        node, shape = names[ir.op_names[op]], ir.tensor_shapes[int(ir.outputs(op)[0])]
        if node.op != "Placeholder" or shape is None or min(shape) < 0:
            raise InvalidInput(f"batch input {node.name} is not a placeholder of known shape")
        dtype = dtype_name(int(ir.tensor_dtype[int(ir.outputs(op)[0])]))
        inputs.append({"name": node.name, "dtype": dtype, "shape": list(shape)})
    return graph_def, ir, inputs, init, None


def open_session(tf: Any, graph: Any, devices: int) -> Any:
    config = tf.compat.v1.ConfigProto(device_count={"CPU": devices}, allow_soft_placement=False)
    # op fusion has no float64 kernels to fuse into; both graphs run unfused
    config.graph_options.rewrite_options.remapping = _REMAPPING_OFF
    # both graphs run as written: grappler's rewrites are not what is checked, and on
    # graphs of tens of thousands of nodes they take longer than the step
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return tf.compat.v1.Session(graph=graph, config=config)


def reader(tf: Any, graph: Any, name: str) -> Any:
    """A tensor holding the value of variable node ``name``, read on its device."""
    op = graph.get_operation_by_name(name)
    with graph.as_default(), tf.device(op.device):
        if op.type == "VarHandleOp":
            return tf.raw_ops.ReadVariableOp(resource=op.outputs[0], dtype=op.get_attr("dtype"))
        return tf.identity(op.outputs[0])


def assigner(tf: Any, graph: Any, name: str) -> tuple[Any, Any]:
    """A placeholder and the op that assigns its value to variable node ``name``."""
    op = graph.get_operation_by_name(name)
    dtype = op.get_attr("dtype")
    with graph.as_default(), tf.device(op.device):
        value = tf.compat.v1.placeholder(dtype.base_dtype, name=f"{name}/verify_value")
        if op.type == "VarHandleOp":
            return value, tf.raw_ops.AssignVariableOp(resource=op.outputs[0], value=value)
        return value, tf.raw_ops.Assign(ref=op.outputs[0], value=value).op


def assign_values(
    session: Any, assigns: Mapping[str, tuple[Any, Any, str]], store: ValueStore
) -> None:
    """Run every ``(placeholder, assign op, value name)`` of ``assigns`` with that value
    from ``store``, in batches of bounded size: the replicas of a big model fill the
    memory."""
    for batch in batches(list(assigns.values()), lambda a: store.nbytes(a[2])):
        values = {name: store.get(name) for name in {a[2] for a in batch}}
        session.run([a[1] for a in batch], {a[0]: values[a[2]] for a in batch})


def _variables(original: Original, double: bool) -> dict[str, int]:
    """Every variable node, captured ones included, and the bytes its value takes in the
    session."""
    ir, scale = original.ir, 2 if double else 1
    return {
        ir.op_names[op]: scale * int(ir.variable_bytes[op])
        for op in range(ir.num_ops)
        if ir.op_types[op] in VARIABLE_OPS or ir.op_names[op] in original.captured
    }


def captured_value(
    name: str, spec: CapturedVariable, trainable: bool, seed: int, double: bool
) -> np.ndarray:
    """The initial value verification gives captured variable ``name``: a TF2 function
    carries no initializer (docs/verification.md, "TF2 functions"). Drawn from ``seed``
    and the name alone, so the reference and every replica get the same value: a
    trainable parameter from a normal distribution scaled by its fan-in, other state
    (optimizer slots, a step counter, a learning rate) non-negative, as a velocity must
    be: uniform in [0, 1) or an integer below 4."""
    if spec.dtype is None or spec.shape is None:
        raise InvalidInput(
            f"captured variable {name}: the graph gives no dtype and shape for its value "
            "(no read or whole write of it), so verification cannot create it"
        )
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    dtype = np.dtype(spec.dtype)
    if dtype.kind in "biu":
        return rng.integers(0, 2 if dtype == np.bool_ else 4, spec.shape).astype(dtype)
    if trainable:
        fan_in = int(np.prod(spec.shape[:-1])) if len(spec.shape) > 1 else 1
        value = rng.standard_normal(spec.shape) / np.sqrt(fan_in)
    else:
        value = rng.uniform(0.0, 1.0, spec.shape)
    return value.astype(np.float64 if double and dtype == np.float32 else dtype)


def load_original(
    graph_spec: str,
    batch_size: int,
    image_size: int | None,
    seed: int,
    double: bool,
    initial: ValueStore,
    loss: str | None = None,
) -> Original:
    """The graph to verify at the verifying batch, its loss named ``loss`` (default: the
    graph's); ``initial`` (empty) will hold the values its initializer gives the
    variables, or holds at once those drawn for a TF2 function's captured variables."""
    graph_def, ir, inputs, init, train = _load(graph_spec, batch_size, image_size, loss)
    if ir.loss_op < 0:
        raise InvalidInput(f"{graph_spec} has no loss to compare: name its loss node with --loss")
    if init is None and any(kind in VARIABLE_OPS for kind in ir.op_types):
        raise InvalidInput(f"{graph_spec} has no 'init' node to initialize its variables")
    captured = captured_variables(ir)
    for name, spec in captured.items():
        initial.put(name, captured_value(name, spec, name in ir.trainable_names, seed, double))
    feed = _random_batch(inputs, ir.batch_size, np.random.default_rng(seed))
    if double:
        feed = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in feed.items()}
    if train is None:  # every sink of the step (the train op NoOp, updates), as compiled
        used = {_name(i) for node in graph_def.node for i in node.input}
        step = set(ir.op_names) | set(ir.dropped["noop"])
        train = [
            node.name for node in graph_def.node if node.name not in used and node.name in step
        ]
    return Original(graph_spec, graph_def, ir, feed, init, train, initial, captured)


def run_reference(
    tf: Any,
    original: Original,
    splits: tuple[tuple[str, tuple[tuple[int, int], ...]], ...],
    double: bool,
    updated: ValueStore,
) -> Reference:
    """One step of the original graph, with per-replica batch statistics for ``splits``.

    The first run initializes the graph's own (TF1) variables with its initializer and
    keeps their values in ``original.initial``; every run assigns the values held there:
    those of later runs, and those drawn for a TF2 function's captured variables (bound
    as variables, :func:`.bind_captured`). The updated values go
    to ``updated``. Both move a batch at a time: neither is held in memory whole.
    """
    graph_def, running = original.graph_def, {}
    if splits:
        graph_def, running = per_replica_statistics(graph_def, original.ir, dict(splits))
    sizes = _variables(original, double)
    names = list(sizes)
    with tf.Graph().as_default() as graph:
        runnable = bind_captured(graph_def, original.captured)
        runnable = to_float64(runnable) if double else runnable
        tf.compat.v1.import_graph_def(
            tf.compat.v1.GraphDef.FromString(runnable.SerializeToString()), name=""
        )
        reads = {name: reader(tf, graph, name) for name in names}
        if isinstance(original.train, str):
            train = original.train
        else:
            train = tf.group(*[graph.get_operation_by_name(n) for n in original.train])
        initial = original.initial
        fresh = {n: size for n, size in sizes.items() if n not in initial}
        assigns = {n: (*assigner(tf, graph, n), n) for n in names if n not in fresh}
        with open_session(tf, graph, 1) as session:
            if fresh:
                session.run(original.init)
                _read_into(session, reads, initial, fresh)
            assign_values(session, assigns, initial)
            fed = {f"{name}:0": value for name, value in original.feed.items()}
            loss_node = f"{original.ir.op_names[original.ir.loss_op]}:0"
            values = {name: list(s.values) for name, s in running.items()}
            gradients = _gradients(original.ir)
            loss, _, assigned, gradient = session.run([loss_node, train, values, gradients], fed)
            noise = _noise(gradient, _NOISE_GRADIENT[double])
            del gradient
            _read_into(session, reads, updated, sizes)
    moved = (np.abs(updated.get(n) - initial.get(n))[mask] for n, mask in noise.items())
    floor = _NOISE_FACTOR * max((float(m.max()) for m in moved if m.size), default=0.0)
    return Reference(
        original.label,
        original.graph_def,
        original.ir,
        original.feed,
        initial,
        float(loss),
        updated,
        splits,
        {
            name: (s, [s.expected(initial.get(name), v) for v in assigned[name]])
            for name, s in running.items()
        },
        noise,
        floor,
    )


def _read_into(
    session: Any, reads: Mapping[str, Any], store: ValueStore, sizes: Mapping[str, int]
) -> None:
    """The values of the variables of ``sizes`` into ``store``, a batch of them per run."""
    for batch in batches(list(sizes), sizes.__getitem__):
        for name, value in session.run({n: reads[n] for n in batch}).items():
            store.put(name, value)


def _gradients(ir: GraphIR) -> dict[str, str]:
    """Parameter variable -> its gradient tensor."""
    params = ir.parameters
    found = {}
    for row in range(len(params)):
        tensor = int(params.gradient_tensor[row])
        producer = ir.op_names[int(ir.tensor_producer[tensor])]
        found[ir.op_names[int(params.variable_op[row])]] = f"{producer}:{ir.tensor_slot[tensor]}"
    return found


def _noise(gradients: Mapping[str, np.ndarray], threshold: float) -> dict[str, np.ndarray]:
    """Parameter -> mask of the elements whose gradient is zero up to rounding: at most
    ``threshold`` times the largest gradient element of the step."""
    scale = max((float(np.abs(g).max()) for g in gradients.values() if g.size), default=0.0)
    masks = {name: np.abs(g) <= threshold * scale for name, g in gradients.items()}
    return {name: mask for name, mask in masks.items() if mask.any()}


def batches(items: list[Any], nbytes: Any, limit: int = _BATCH_BYTES) -> list[list[Any]]:
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
