"""A ``GraphDef`` turned into flat, validated node tables: edges, output dtypes and shapes.

This is the first step of the analyzer (TAG §4.1.1): every input reference is resolved,
every node's outputs are counted and typed from TensorFlow's op registry (or from the
``_output_types`` attribute for ops it does not know), and the graph is checked to be
acyclic. Nothing here drops or rewrites nodes; see :mod:`.simplify` for that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.neutral_json import OUTPUT_SHAPES_ATTR, OUTPUT_TYPES_ATTR
from tagplan.planner.graph.protos import op_registry

__all__ = ["ParsedGraph", "Shape", "attr_value", "parse_graph", "shape_from_proto"]

Shape = tuple[int, ...] | None
"""A static shape; ``-1`` marks an unknown size, ``None`` an unknown rank."""

_DT_FLOAT = 1


@dataclass(eq=False)
class ParsedGraph:
    """Nodes of a graph in file order, with resolved edges.

    ``data_inputs[n]`` lists ``(producer, output_slot)`` in input order and
    ``control_inputs[n]`` the control predecessors of node ``n``.
    """

    names: list[str]
    ops: list[str]
    nodes: list[Any]
    index: dict[str, int]
    data_inputs: list[list[tuple[int, int]]]
    control_inputs: list[list[int]]
    output_dtypes: list[list[int]]
    output_shapes: list[list[Shape]]
    known_op: list[bool]
    shapes_given: list[bool]  # the node carries _output_shapes (unknown entries are real)
    topo_order: np.ndarray = field(repr=False)

    @property
    def num_nodes(self) -> int:
        return len(self.names)

    def consumers(self) -> list[list[tuple[int, int, int]]]:
        """Per node, ``(consumer, consumer_input_position, output_slot)`` of its outputs."""
        result: list[list[tuple[int, int, int]]] = [[] for _ in self.names]
        for consumer, inputs in enumerate(self.data_inputs):
            for position, (producer, slot) in enumerate(inputs):
                result[producer].append((consumer, position, slot))
        return result


def shape_from_proto(shape_proto: Any) -> Shape:
    """A ``TensorShapeProto`` as a tuple (``None`` for unknown rank)."""
    if shape_proto.unknown_rank:
        return None
    return tuple(int(d.size) for d in shape_proto.dim)


def attr_value(node: Any, name: str, default: Any = None) -> Any:
    """The Python value of a scalar or list attribute of a ``NodeDef``."""
    if name not in node.attr:
        return default
    value = node.attr[name]
    kind = value.WhichOneof("value")
    if kind == "list":
        for list_kind in ("i", "f", "s", "b", "type"):
            items = getattr(value.list, list_kind)
            if items:
                return [x.decode(errors="replace") if list_kind == "s" else x for x in items]
        return []
    if kind == "s":
        return value.s.decode(errors="replace")
    if kind in ("i", "f", "b", "type"):
        return getattr(value, kind)
    if kind == "shape":
        return shape_from_proto(value.shape)
    return default


def _split_input(text: str) -> tuple[str, int, bool]:
    if text.startswith("^"):
        return text[1:], -1, True
    name, sep, slot = text.rpartition(":")
    if sep and slot.isdigit():
        return name, int(slot), False
    return text, 0, False


def _registry_output_dtypes(node: Any, op_def: Any) -> list[int] | None:
    """Resolve each output arg of ``op_def`` against the node's attrs (and defaults)."""
    defaults = {a.name: a.default_value for a in op_def.attr if a.HasField("default_value")}

    def attr(name: str) -> Any:
        if name in node.attr:
            return node.attr[name]
        return defaults.get(name)

    dtypes: list[int] = []
    for arg in op_def.output_arg:
        if arg.type_list_attr:
            value = attr(arg.type_list_attr)
            if value is None:
                return None
            dtypes.extend(value.list.type)
            continue
        if arg.type:
            dtype = arg.type
        else:
            value = attr(arg.type_attr)
            if value is None:
                return None
            dtype = value.type
        count = 1
        if arg.number_attr:
            value = attr(arg.number_attr)
            if value is None:
                return None
            count = value.i
        dtypes.extend([dtype] * count)
    return dtypes


def _topological_order(
    names: Sequence[str], data_inputs: list[list[tuple[int, int]]], control_inputs: list[list[int]]
) -> np.ndarray:
    num = len(names)
    indegree = np.zeros(num, dtype=np.int64)
    successors: list[list[int]] = [[] for _ in range(num)]
    for node in range(num):
        preds = {p for p, _ in data_inputs[node]} | set(control_inputs[node])
        indegree[node] = len(preds)
        for pred in preds:
            successors[pred].append(node)
    order = [n for n in range(num) if indegree[n] == 0]
    head = 0
    while head < len(order):
        node = order[head]
        head += 1
        for succ in successors[node]:
            indegree[succ] -= 1
            if indegree[succ] == 0:
                order.append(succ)
    if len(order) < num:
        stuck = [names[n] for n in range(num) if indegree[n] > 0]
        shown = ", ".join(repr(s) for s in stuck[:5])
        more = f" and {len(stuck) - 5} more" if len(stuck) > 5 else ""
        raise InvalidInput(
            f"graph has a cycle through {len(stuck)} nodes ({shown}{more}); training graphs "
            "must be acyclic (TF1 while-loops are not supported: use functional control flow)"
        )
    return np.asarray(order, dtype=np.int32)


def parse_graph(graph_def: Any) -> ParsedGraph:
    """Validate a ``GraphDef`` and resolve its edges, output dtypes and static shapes."""
    nodes = list(graph_def.node)
    if not nodes:
        raise InvalidInput("graph has no nodes")
    index: dict[str, int] = {}
    for position, node in enumerate(nodes):
        if not node.name or not node.op:
            raise InvalidInput(f"node #{position} has an empty name or op type")
        if node.name in index:
            raise InvalidInput(f"two nodes are named {node.name!r}")
        index[node.name] = position

    registry = op_registry()
    data_inputs: list[list[tuple[int, int]]] = []
    control_inputs: list[list[int]] = []
    referenced_slots = [0] * len(nodes)
    for node in nodes:
        data: list[tuple[int, int]] = []
        control: list[int] = []
        for text in node.input:
            name, slot, is_control = _split_input(text)
            producer = index.get(name)
            if producer is None:
                raise InvalidInput(f"node {node.name!r} reads {text!r}, which is not in the graph")
            if is_control:
                control.append(producer)
            else:
                data.append((producer, slot))
                referenced_slots[producer] = max(referenced_slots[producer], slot + 1)
        data_inputs.append(data)
        control_inputs.append(control)

    output_dtypes: list[list[int]] = []
    output_shapes: list[list[Shape]] = []
    known_op: list[bool] = []
    shapes_given: list[bool] = []
    for position, node in enumerate(nodes):
        op_def = registry.get(node.op)
        known_op.append(op_def is not None)
        dtypes: list[int] | None = None
        if OUTPUT_TYPES_ATTR in node.attr:
            dtypes = list(node.attr[OUTPUT_TYPES_ATTR].list.type)
        elif op_def is not None:
            dtypes = _registry_output_dtypes(node, op_def)
        shapes: list[Shape] | None = None
        shapes_given.append(OUTPUT_SHAPES_ATTR in node.attr)
        if shapes_given[-1]:
            shapes = [shape_from_proto(s) for s in node.attr[OUTPUT_SHAPES_ATTR].list.shape]
        if dtypes is None:
            # An op TensorFlow does not know: as many outputs as its shapes or its readers
            # say, typed like its "T" attribute or float32.
            count = max(len(shapes or []), referenced_slots[position])
            fallback = node.attr["T"].type if "T" in node.attr else _DT_FLOAT
            dtypes = [fallback] * count
        if referenced_slots[position] > len(dtypes):
            raise InvalidInput(
                f"node {node.name!r} ({node.op}) has {len(dtypes)} outputs but output "
                f"{referenced_slots[position] - 1} is read"
            )
        if shapes is None or len(shapes) != len(dtypes):
            shapes = [None] * len(dtypes) if shapes is None else _pad(shapes, len(dtypes))
        shapes_given[-1] = shapes_given[-1] or not dtypes
        output_dtypes.append(dtypes)
        output_shapes.append(shapes)

    names = [node.name for node in nodes]
    order = _topological_order(names, data_inputs, control_inputs)
    return ParsedGraph(
        names=names,
        ops=[node.op for node in nodes],
        nodes=nodes,
        index=index,
        data_inputs=data_inputs,
        control_inputs=control_inputs,
        output_dtypes=output_dtypes,
        output_shapes=output_shapes,
        known_op=known_op,
        shapes_given=shapes_given,
        topo_order=order,
    )


def _pad(shapes: list[Shape], count: int) -> list[Shape]:
    return (shapes + [None] * count)[:count]
