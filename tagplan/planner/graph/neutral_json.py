"""The framework-neutral JSON form of a training graph, converted to a ``GraphDef``.

For users who do not export from TensorFlow. The document (``docs/graph-json.md``)::

    {
      "format": "tagplan.graph", "version": 1,
      "nodes": [
        {"name": "x", "op": "Placeholder",
         "outputs": [{"dtype": "float32", "shape": [32, 784]}]},
        {"name": "w", "op": "VarHandleOp",
         "attrs": {"dtype": {"type": "float32"}, "shape": {"shape": [784, 10]}}},
        {"name": "mm", "op": "MatMul", "inputs": ["x", "w_read:0"], "device": ""}
      ]
    }

``inputs`` use TensorFlow's spelling: ``"node"`` or ``"node:k"`` for the k-th output,
``"^node"`` for a control dependency. ``outputs`` (dtype and shape of every output) is
optional for ops TensorFlow knows, required for any other op. Attribute values are
typed by their JSON form: bool, int, float, string, a list of one of those, or an object
``{"type": "float32"}``, ``{"shape": [..]}``, ``{"list_type": [..]}``,
``{"list_shape": [[..], ..]}`` or ``{"tensor": {"dtype": .., "shape": [..], "values": [..]}}``.
"""

from __future__ import annotations

from typing import Any

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.protos import DTYPE_NAMES, AttrValue, GraphDef

__all__ = ["FORMAT", "VERSION", "graph_def_from_json"]

FORMAT = "tagplan.graph"
VERSION = 1

OUTPUT_TYPES_ATTR = "_output_types"
OUTPUT_SHAPES_ATTR = "_output_shapes"

_DTYPE_BY_NAME = {name: number for number, name in DTYPE_NAMES.items()}


def _dtype(name: Any, where: str) -> int:
    if not isinstance(name, str) or name not in _DTYPE_BY_NAME:
        raise InvalidInput(f"{where}: unknown dtype {name!r}")
    return _DTYPE_BY_NAME[name]


def _fill_shape(shape_proto: Any, dims: Any, where: str) -> None:
    if dims is None:
        shape_proto.unknown_rank = True
        return
    if not isinstance(dims, list) or not all(isinstance(d, int) and d >= -1 for d in dims):
        raise InvalidInput(f"{where}: a shape is a list of sizes >= -1, got {dims!r}")
    for size in dims:
        shape_proto.dim.add().size = size


def _scalar_field(value: Any) -> str | None:
    if isinstance(value, bool):
        return "b"
    if isinstance(value, int):
        return "i"
    if isinstance(value, float):
        return "f"
    if isinstance(value, str):
        return "s"
    return None


def _set_attr(attr: Any, value: Any, where: str) -> None:
    field = _scalar_field(value)
    if field is not None:
        setattr(attr, field, value.encode() if field == "s" else value)
        return
    if isinstance(value, list):
        fields = {_scalar_field(item) for item in value}
        if len(fields) > 1 or None in fields:
            raise InvalidInput(f"{where}: a list attribute holds values of one scalar kind")
        items = [item.encode() if fields == {"s"} else item for item in value]
        attr.list.SetInParent()
        if items:
            getattr(attr.list, fields.pop()).extend(items)
        return
    if isinstance(value, dict) and len(value) == 1:
        ((kind, payload),) = value.items()
        if kind == "type":
            attr.type = _dtype(payload, where)
            return
        if kind == "shape":
            _fill_shape(attr.shape, payload, where)
            return
        if kind == "list_type":
            attr.list.type.extend(_dtype(item, where) for item in payload)
            return
        if kind == "list_shape":
            for dims in payload:
                _fill_shape(attr.list.shape.add(), dims, where)
            return
        if kind == "tensor":
            _set_tensor(attr.tensor, payload, where)
            return
    raise InvalidInput(f"{where}: unsupported attribute value {value!r}")


def _set_tensor(tensor: Any, payload: Any, where: str) -> None:
    if not isinstance(payload, dict) or "dtype" not in payload:
        raise InvalidInput(f"{where}: a tensor attribute needs dtype, shape and values")
    tensor.dtype = _dtype(payload["dtype"], where)
    _fill_shape(tensor.tensor_shape, payload.get("shape", []), where)
    values = payload.get("values", [])
    name = DTYPE_NAMES[tensor.dtype]
    if name.startswith("float") or name == "bfloat16":
        tensor.float_val.extend(float(v) for v in values)
    elif name == "int64":
        tensor.int64_val.extend(int(v) for v in values)
    elif name == "bool":
        tensor.bool_val.extend(bool(v) for v in values)
    elif name.startswith(("int", "uint")):
        tensor.int_val.extend(int(v) for v in values)
    else:
        raise InvalidInput(f"{where}: tensor values of dtype {name} are not supported in JSON")


def graph_def_from_json(document: Any) -> Any:
    """Convert the JSON form (already decoded) into a ``GraphDef``."""
    if not isinstance(document, dict) or not isinstance(document.get("nodes"), list):
        raise InvalidInput("JSON graph: expected an object with a 'nodes' list")
    if document.get("format", FORMAT) != FORMAT:
        raise InvalidInput(f"JSON graph: format must be {FORMAT!r}")
    if document.get("version", VERSION) != VERSION:
        raise InvalidInput(f"JSON graph: unsupported version {document.get('version')!r}")
    graph = GraphDef()
    for position, entry in enumerate(document["nodes"]):
        if not isinstance(entry, dict):
            raise InvalidInput(f"JSON graph: nodes[{position}] is not an object")
        name, op = entry.get("name"), entry.get("op")
        if not isinstance(name, str) or not name or not isinstance(op, str) or not op:
            raise InvalidInput(f"JSON graph: nodes[{position}] needs a non-empty name and op")
        where = f"JSON graph node {name!r}"
        unknown_keys = set(entry) - {"name", "op", "inputs", "attrs", "outputs", "device"}
        if unknown_keys:
            raise InvalidInput(f"{where}: unknown keys {sorted(unknown_keys)}")
        node = graph.node.add()
        node.name, node.op = name, op
        node.device = entry.get("device", "")
        inputs = entry.get("inputs", [])
        if not isinstance(inputs, list) or not all(isinstance(i, str) and i for i in inputs):
            raise InvalidInput(f"{where}: inputs must be a list of tensor names")
        node.input.extend(inputs)
        attrs = entry.get("attrs", {})
        if not isinstance(attrs, dict):
            raise InvalidInput(f"{where}: attrs must be an object")
        for key, value in attrs.items():
            attr = AttrValue()
            _set_attr(attr, value, f"{where} attr {key!r}")
            node.attr[key].CopyFrom(attr)
        outputs = entry.get("outputs")
        if outputs is not None:
            if not isinstance(outputs, list) or not all(isinstance(o, dict) for o in outputs):
                raise InvalidInput(f"{where}: outputs must be a list of {{dtype, shape}}")
            types = node.attr[OUTPUT_TYPES_ATTR].list
            shapes = node.attr[OUTPUT_SHAPES_ATTR].list
            for output in outputs:
                types.type.append(_dtype(output.get("dtype"), where))
                _fill_shape(shapes.shape.add(), output.get("shape"), where)
    return graph
