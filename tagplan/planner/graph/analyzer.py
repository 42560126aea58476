"""The graph analyzer (TAG §4.1.1): a ``GraphDef`` in, the :class:`GraphIR` out.

Steps: resolve edges and types (:mod:`.parsed`); find the batch inputs and the batch size
the graph was built with; fill missing shapes with TensorFlow's inference; propagate the
batch dimension and split categories (:mod:`.batch`); find parameters, gradients and
apply ops (:mod:`.params`); simplify (:mod:`.simplify`); and lay the result out as
arrays with byte counts at the job's batch size.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.batch import NO_AXIS, BatchAnalysis, propagate_batch
from tagplan.planner.graph.ir import GraphIR, Parameters, SparseParameters
from tagplan.planner.graph.params import (
    VARIABLE_OPS,
    ParameterInfo,
    SparseParameterInfo,
    find_parameters,
    is_variable,
    variable_bytes,
    variable_reads,
)
from tagplan.planner.graph.parsed import ParsedGraph, Shape, attr_value, parse_graph
from tagplan.planner.graph.protos import DT_RESOURCE, DTYPE_BYTES, dtype_name, op_registry
from tagplan.planner.graph.shape_inference import infer_shapes
from tagplan.planner.graph.simplify import Simplified, simplify
from tagplan.planner.unionfind import UnionFind

__all__ = ["analyze", "graph_fingerprint"]

_INPUT_OPS = frozenset({"Placeholder", "PlaceholderWithDefault"})
_DEFAULT_LOSS_NAME = "loss"
MAX_TENSOR_BYTES = 1 << 50
"""A pebibyte, more than any allocation holds: a value or variable over it has a wrong shape
(or the batch size is one nothing trains at), and byte counts stay far inside int64."""


def graph_fingerprint(graph_def: Any) -> str:
    """Content hash of a graph: independent of node order and device annotations."""
    digest = hashlib.sha256()
    for node in sorted(graph_def.node, key=lambda n: n.name):
        stripped = type(node)()
        stripped.CopyFrom(node)
        stripped.ClearField("device")
        stripped.ClearField("experimental_debug_info")
        encoded = stripped.SerializeToString(deterministic=True)
        digest.update(len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
    return digest.hexdigest()


def _find_batch_inputs(graph: ParsedGraph, names: Sequence[str] | None) -> list[int]:
    if names:
        missing = [n for n in names if n not in graph.index]
        if missing:
            raise InvalidInput(f"batch inputs {missing} are not nodes of the graph")
        found = [graph.index[n] for n in names]
    else:
        found = [
            node
            for node, op in enumerate(graph.ops)
            if op == "IteratorGetNext"
            or (op in _INPUT_OPS and attr_value(graph.nodes[node], "dtype") != DT_RESOURCE)
        ]
    for node in found:
        # A placeholder's declared shape stands in when the graph carries no output shapes.
        if graph.ops[node] in _INPUT_OPS and graph.output_shapes[node][0] is None:
            graph.output_shapes[node][0] = attr_value(graph.nodes[node], "shape")
    if not names:
        found = [
            node
            for node in found
            if any(shape is None or len(shape) >= 1 for shape in graph.output_shapes[node])
        ]
    if not found:
        raise InvalidInput(
            "graph has no batch input: expected Placeholder (or IteratorGetNext) nodes that "
            "feed the training data; name them explicitly if they are of another op type"
        )
    return found


def _graph_batch_size(graph: ParsedGraph, inputs: list[int], requested: int | None) -> int:
    sizes = {
        shape[0]
        for node in inputs
        for shape in graph.output_shapes[node]
        if shape is not None and len(shape) >= 1 and shape[0] >= 0
    }
    if len(sizes) > 1:
        described = ", ".join(
            f"{graph.names[n]}{list(graph.output_shapes[n][0] or [])}" for n in inputs
        )
        raise InvalidInput(
            f"inconsistent batch size: the batch inputs disagree on dimension 0 ({described})"
        )
    if sizes:
        return sizes.pop()
    if requested is None:
        raise InvalidInput(
            "missing batch size: the graph's batch dimension is unknown; pass a batch size"
        )
    return requested


def _complete_shapes(graph: ParsedGraph, graph_def: Any, inputs: list[int], batch: int) -> None:
    """Run TensorFlow's shape inference when shapes are missing or the batch is unknown."""
    unknown_batch = any(
        shape is None or (len(shape) >= 1 and shape[0] < 0)
        for node in inputs
        for shape in graph.output_shapes[node]
    )
    missing = not all(graph.shapes_given)
    if not unknown_batch and not missing:
        return
    inferred = infer_shapes(graph_def, {graph.names[node]: batch for node in inputs})
    for node, name in enumerate(graph.names):
        shapes = inferred.get(name)
        if shapes is not None and len(shapes) == len(graph.output_shapes[node]):
            graph.output_shapes[node] = shapes


# Stateful in TensorFlow's registry only because they read a resource: splitting them
# over the batch is safe wherever the variable is.
_RESOURCE_READS = frozenset({"ReadVariableOp", "ResourceGather", "ResourceGatherNd"})


def _stateful(graph: ParsedGraph) -> list[bool]:
    """Ops that must never be split: variables, writes, random ops, unknown side effects."""
    registry = op_registry()
    result = []
    for node, op in enumerate(graph.ops):
        op_def = registry.get(op)
        is_resource = attr_value(graph.nodes[node], "dtype") == DT_RESOURCE
        stateful = bool(op_def and op_def.is_stateful) and op not in _RESOURCE_READS
        result.append(stateful or op in VARIABLE_OPS or is_resource)
    return result


_FLOAT_DTYPES = frozenset({1, 2, 14, 19})  # float32, float64, bfloat16, float16


def _scalar_sinks_of_the_batch(graph: ParsedGraph, batch_inputs: list[int]) -> list[int]:
    """Nodes nothing reads whose one output is a floating-point scalar computed from the
    batch: the loss a TF2 training function returns (its ``Identity`` outputs)."""
    depends = np.zeros(graph.num_nodes, dtype=bool)
    depends[batch_inputs] = True
    read = np.zeros(graph.num_nodes, dtype=bool)
    for node in graph.topo_order.tolist():
        preds = [p for p, _ in graph.data_inputs[node]] + graph.control_inputs[node]
        read[preds] = True
        depends[node] |= bool(depends[preds].any()) if preds else False
    found = []
    for node in np.flatnonzero(depends & ~read).tolist():
        dtypes, shapes = graph.output_dtypes[node], graph.output_shapes[node]
        if len(dtypes) == 1 and dtypes[0] in _FLOAT_DTYPES and shapes and shapes[0] == ():
            found.append(node)
    return found


def _find_loss(graph: ParsedGraph, name: str | None, batch_inputs: list[int]) -> int | None:
    """The loss node: ``name`` when given, else one called ``loss``, else the one
    floating-point scalar computed from the batch that nothing reads (None when there is
    no such node or several: ``--loss`` names it)."""
    if name is not None and name not in graph.index:
        raise InvalidInput(f"loss node {name!r} is not in the graph")
    found = graph.index.get(name or _DEFAULT_LOSS_NAME)
    if found is not None:
        return found
    candidates = _scalar_sinks_of_the_batch(graph, batch_inputs)
    return candidates[0] if len(candidates) == 1 else None


def _numel(shape: Shape) -> int:
    """Elements of a static shape; an unknown size (-1) counts as 1, an unknown rank as 0."""
    if shape is None:
        return 0
    return math.prod(1 if d < 0 else d for d in shape)


def _refuse_huge(what: str, sizes: list[int], name_of: Callable[[int], str]) -> None:
    """InvalidInput naming the first of ``sizes`` over :data:`MAX_TENSOR_BYTES`."""
    if max(sizes, default=0) <= MAX_TENSOR_BYTES:
        return
    index = next(i for i, size in enumerate(sizes) if size > MAX_TENSOR_BYTES)
    raise InvalidInput(
        f"{what} of node {name_of(index)!r} takes {sizes[index]} bytes, over the "
        f"{MAX_TENSOR_BYTES} any allocation holds: its shape (or the batch size) is wrong"
    )


def _scaled_shape(shape: Shape, axis: int, batch: int, graph_batch: int) -> Shape:
    if shape is None or axis == NO_AXIS or batch == graph_batch:
        return shape
    dims = list(shape)
    dims[axis] = max(1, round(dims[axis] * batch / graph_batch))
    return tuple(dims)


def _shape_token(shape: Shape, axis: int, graph_batch: int) -> str:
    if shape is None:
        return "?"
    dims = []
    for position, size in enumerate(shape):
        if position == axis and size % graph_batch == 0:
            multiple = size // graph_batch
            dims.append("B" if multiple == 1 else f"{multiple}B")
        else:
            dims.append(str(size))
    return "[" + ",".join(dims) + "]"


def _attr_token(value: Any) -> str | None:
    kind = value.WhichOneof("value")
    if kind in ("tensor", "func", "placeholder", "shape") or kind is None:
        return None  # values, functions and shapes: the input shapes already say them
    if kind == "list":
        items = (
            [str(v) for v in value.list.i]
            or [f"{v:g}" for v in value.list.f]
            or [v.decode(errors="replace") for v in value.list.s]
            or [dtype_name(v) for v in value.list.type]
            or [str(v) for v in value.list.b]
        )
        return "(" + ",".join(items) + ")"
    if kind == "type":
        return dtype_name(value.type)
    if kind == "s":
        return value.s.decode(errors="replace")
    if kind == "f":
        return f"{value.f:g}"
    return str(getattr(value, kind))


def _cost_key(graph: ParsedGraph, node: int, batch: BatchAnalysis, inputs: Sequence[Any]) -> str:
    """Op type, input dtypes and shapes (batch dimension as ``B``), and attributes.

    The key does not depend on the batch size: profiles store one time per batch size.
    """
    parts = []
    for producer, slot in inputs:
        shape = graph.output_shapes[producer][slot]
        dtype = dtype_name(graph.output_dtypes[producer][slot])
        parts.append(
            dtype + _shape_token(shape, batch.axis(producer, slot), batch.graph_batch_size)
        )
    attrs = []
    for key in sorted(graph.nodes[node].attr):
        if key.startswith("_"):
            continue
        token = _attr_token(graph.nodes[node].attr[key])
        if token is not None:
            attrs.append(f"{key}={token}")
    return f"{graph.ops[node]}|{';'.join(parts)}|{';'.join(attrs)}"


def _colocation(graph: ParsedGraph, simplified: Simplified, position: dict[int, int]) -> np.ndarray:
    sets = UnionFind(len(position))

    for node in simplified.kept.tolist():
        for producer, slot in simplified.data_inputs[node]:
            dtype = graph.output_dtypes[producer][slot]
            if dtype == DT_RESOURCE or dtype > 100:
                sets.union(position[node], position[producer])
        for location in attr_value(graph.nodes[node], "_class", []) or []:
            if location.startswith("loc:@"):
                target = simplified.resolve(graph, location[5:])
                if target is not None and target in position:
                    sets.union(position[node], position[target])
    return sets.labels()


def _csr(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(rows) + 1, dtype=np.int32)
    ptr[1:] = np.cumsum([len(r) for r in rows])
    flat = np.fromiter((x for r in rows for x in r), dtype=np.int32, count=int(ptr[-1]))
    return ptr, flat


def _parameters(
    graph: ParsedGraph,
    simplified: Simplified,
    infos: list[ParameterInfo],
    position: dict[int, int],
    tensor_of: dict[tuple[int, int], int],
    tensor_bytes: np.ndarray,
) -> Parameters:
    missing = [graph.names[i.variable] for i in infos if i.variable not in position]
    if missing:
        raise InvalidInput(f"parameters {missing[:3]} are not part of the training step")
    gradient_tensors = np.array(
        [tensor_of[simplified.resolve_tensor(*i.gradient)] for i in infos], dtype=np.int32
    )
    slot_ptr, slot_op = _csr([[position[s] for s in i.slots if s in position] for i in infos])
    region_ptr, region_op = _csr([[position[r] for r in i.region if r in position] for i in infos])
    return Parameters(
        names=tuple(graph.names[i.variable] for i in infos),
        variable_op=np.array([position[i.variable] for i in infos], dtype=np.int32),
        bytes=np.array([i.bytes for i in infos], dtype=np.int64),
        gradient_tensor=gradient_tensors,
        gradient_bytes=tensor_bytes[gradient_tensors].astype(np.int64),
        apply_op=np.array([position[i.apply] for i in infos], dtype=np.int32),
        slot_bytes=np.array([i.slot_bytes for i in infos], dtype=np.int64),
        slot_ptr=slot_ptr,
        slot_op=slot_op,
        region_ptr=region_ptr,
        region_op=region_op,
    )


def _sparse_parameters(
    graph: ParsedGraph, infos: list[SparseParameterInfo], position: dict[int, int]
) -> SparseParameters:
    kept = [i for i in infos if i.variable in position]
    slot_ptr, slot_op = _csr([[position[s] for s in i.slots if s in position] for i in kept])
    update_ptr, update_op = _csr([[position[u] for u in i.updates if u in position] for i in kept])
    return SparseParameters(
        names=tuple(graph.names[i.variable] for i in kept),
        variable_op=np.array([position[i.variable] for i in kept], dtype=np.int32),
        bytes=np.array([i.bytes for i in kept], dtype=np.int64),
        slot_bytes=np.array([i.slot_bytes for i in kept], dtype=np.int64),
        slot_ptr=slot_ptr,
        slot_op=slot_op,
        update_ptr=update_ptr,
        update_op=update_op,
    )


def analyze(
    graph_def: Any,
    *,
    batch_size: int | None = None,
    batch_inputs: Sequence[str] | None = None,
    loss: str | None = None,
) -> GraphIR:
    """Analyze a training graph at the job's ``batch_size`` (default: the graph's own).

    ``batch_inputs`` names the nodes feeding training data (default: every non-resource
    ``Placeholder`` of rank >= 1); ``loss`` names the loss node (default: a node called
    ``"loss"``, else the one floating-point scalar computed from the batch that nothing
    reads, as a TF2 training function returns it), which TF2-style graphs need to tell
    parameters from optimizer state.
    """
    if batch_size is not None and batch_size <= 0:
        raise InvalidInput(f"batch size must be positive, got {batch_size}")
    graph = parse_graph(graph_def)
    inputs = _find_batch_inputs(graph, batch_inputs)
    graph_batch = _graph_batch_size(graph, inputs, batch_size)
    _complete_shapes(graph, graph_def, inputs, graph_batch)
    job_batch = batch_size if batch_size is not None else graph_batch

    stateful = _stateful(graph)
    batch = propagate_batch(
        graph, batch_inputs=inputs, graph_batch_size=graph_batch, stateful=stateful
    )
    carries = batch.batch_axis != NO_AXIS
    touches = np.array(
        [
            carries[batch.output_offset[n] : batch.output_offset[n + 1]].any()
            or any(carries[batch.output_offset[p] + s] for p, s in graph.data_inputs[n])
            for n in range(graph.num_nodes)
        ],
        dtype=bool,
    )
    loss_node = _find_loss(graph, loss, inputs)
    found = find_parameters(graph, batch_inputs=inputs, touches_batch=touches, loss=loss_node)
    infos = found.dense

    protected = {i.apply for i in infos} | {i.variable for i in infos}
    protected |= {n for t in found.sparse for n in (t.variable, *t.updates)}
    simplified = simplify(
        graph, batch_inputs=inputs, protected=protected, loss=loss_node, stateful=stateful
    )
    kept = simplified.kept.tolist()
    position = {node: i for i, node in enumerate(kept)}

    tensor_of: dict[tuple[int, int], int] = {}
    producers, slots, dtypes, byte_counts, axes, aggregations, shapes = [], [], [], [], [], [], []
    output_rows: list[int] = []
    for node in kept:
        output_rows.append(len(producers))
        for slot, dtype in enumerate(graph.output_dtypes[node]):
            flat = batch.output_offset[node] + slot
            axis = int(batch.batch_axis[flat])
            shape = _scaled_shape(graph.output_shapes[node][slot], axis, job_batch, graph_batch)
            tensor_of[(node, slot)] = len(producers)
            producers.append(position[node])
            slots.append(slot)
            dtypes.append(dtype)
            shapes.append(shape)
            axes.append(axis)
            aggregations.append(int(batch.aggregation[flat]))
            byte_counts.append(_numel(shape) * DTYPE_BYTES.get(dtype, 4))
    _refuse_huge("an output", byte_counts, lambda t: graph.names[kept[producers[t]]])
    output_ptr = np.array([*output_rows, len(producers)], dtype=np.int32)

    input_rows = [[tensor_of[e] for e in simplified.data_inputs[n]] for n in kept]
    consumer_rows: list[list[int]] = [[] for _ in producers]
    for op, row in enumerate(input_rows):
        for tensor in row:
            consumer_rows[tensor].append(op)
    input_ptr, input_flat = _csr(input_rows)
    consumer_ptr, consumer_flat = _csr(consumer_rows)
    control_ptr, control_flat = _csr(
        [[position[p] for p in simplified.control_inputs[n]] for n in kept]
    )
    tensor_bytes = np.array(byte_counts, dtype=np.int64)

    loss_op = -1
    if loss_node is not None:
        resolved = simplified.resolve(graph, graph.names[loss_node])
        loss_op = position.get(resolved, -1) if resolved is not None else -1
    unknown = sorted({graph.ops[n] for n in kept if not graph.known_op[n]})
    reads = variable_reads(graph)
    held = [variable_bytes(graph, reads, n) if is_variable(graph, n) else 0 for n in kept]
    _refuse_huge("the variable", held, lambda op: graph.names[kept[op]])
    return GraphIR(
        batch_size=job_batch,
        graph_batch_size=graph_batch,
        fingerprint=graph_fingerprint(graph_def),
        op_names=tuple(graph.names[n] for n in kept),
        op_types=tuple(graph.ops[n] for n in kept),
        cost_keys=tuple(_cost_key(graph, n, batch, simplified.data_inputs[n]) for n in kept),
        split_category=batch.category[kept].astype(np.int8),
        colocation=_colocation(graph, simplified, position),
        known_op=np.array([graph.known_op[n] for n in kept], dtype=bool),
        batch_statistics=batch.batch_statistics[kept],
        stateful=np.array([stateful[n] for n in kept], dtype=bool),
        variable_bytes=np.array(held, dtype=np.int64),
        op_input_ptr=input_ptr,
        op_input_tensor=input_flat,
        op_output_ptr=output_ptr,
        control_ptr=control_ptr,
        control_pred=control_flat,
        tensor_producer=np.array(producers, dtype=np.int32),
        tensor_slot=np.array(slots, dtype=np.int32),
        tensor_dtype=np.array(dtypes, dtype=np.int32),
        tensor_bytes=tensor_bytes,
        tensor_batch_axis=np.array(axes, dtype=np.int8),
        tensor_aggregation=np.array(aggregations, dtype=np.int8),
        tensor_shapes=tuple(shapes),
        tensor_consumer_ptr=consumer_ptr,
        tensor_consumer_op=consumer_flat,
        parameters=_parameters(graph, simplified, infos, position, tensor_of, tensor_bytes),
        batch_input_ops=np.array([position[n] for n in inputs if n in position], dtype=np.int32),
        loss_op=loss_op,
        aliases={
            name: position[target]
            for name, target in simplified.aliases.items()
            if target in position
        },
        dropped={reason: tuple(names) for reason, names in simplified.dropped.items()},
        unknown_op_types=tuple(unknown),
        sparse_parameters=_sparse_parameters(graph, found.sparse, position),
    )
