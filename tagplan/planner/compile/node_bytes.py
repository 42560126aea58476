"""``NodeDef`` s as serialized bytes: how the GraphDef back end emits hundreds of thousands
of op instances without building a protobuf message for each.

An op instance differs from its original node only in its name, inputs, device and
``_output_shapes``; every other field is the original's. :class:`NodeTemplate` keeps those
other fields serialized once, in the order protobuf's deterministic serialization writes
them (fields by number, map entries by key), and :meth:`NodeTemplate.instance` joins them
with an instance's own fields: the result is exactly what
``NodeDef.SerializeToString(deterministic=True)`` gives for the instance.
:class:`NodeStore` holds a graph's nodes as messages or such bytes and parses bytes into a
message only when something reads or changes that node; :func:`serialize_graph` frames them
into the deterministic serialization of the whole ``GraphDef``, whose hash is the graph's
digest, so nothing is serialized twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from tagplan.planner.graph.protos import AttrValue, NodeDef

__all__ = ["NodeStore", "NodeTemplate", "serialize_graph", "shapes_attr", "shapes_entry"]

# keys of the length-delimited fields of NodeDef (and of GraphDef.node)
_NAME, _OP, _INPUT, _DEVICE = (bytes((number << 3 | 2,)) for number in (1, 2, 3, 4))
_ATTR_KEY = 5 << 3 | 2
_GRAPH_NODE = _NAME
_SHAPES_KEY = "_output_shapes"


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    """The varint at ``position`` and the position after it."""
    value, shift = 0, 0
    while True:
        byte = data[position]
        value |= (byte & 0x7F) << shift
        position += 1
        if byte < 0x80:
            return value, position
        shift += 7


def _entry_key(entry: bytes) -> str:
    """The key of a serialized map entry (its field 1 comes first)."""
    length, start = _read_varint(entry, 1)
    return entry[start : start + length].decode()


_ONE_BYTE = [bytes((n,)) for n in range(0x80)]  # the varints of short lengths


def _field(key: bytes, data: bytes) -> bytes:
    """One length-delimited field with its ``key`` (a field number below 16: one byte)."""
    size = len(data)
    return key + (_ONE_BYTE[size] if size < 0x80 else _varint(size)) + data


@lru_cache(maxsize=1 << 14)
def shapes_attr(shapes: tuple[tuple[int, ...], ...]) -> Any:
    """The ``_output_shapes`` attribute of ``shapes``, built once per distinct list (a
    replicated op's instances mostly share one)."""
    attr = AttrValue()
    for shape in shapes:
        proto = attr.list.shape.add()
        for size in shape:
            proto.dim.add().size = int(size)
    return attr


@lru_cache(maxsize=1 << 14)
def shapes_entry(shapes: tuple[tuple[int, ...], ...]) -> bytes:
    """The serialized ``attr`` map entry ``_output_shapes`` of ``shapes``."""
    node = NodeDef()
    node.attr[_SHAPES_KEY].CopyFrom(shapes_attr(shapes))
    return node.SerializeToString(deterministic=True)


class NodeTemplate:
    """An original node's fields that its instances keep (all but name, inputs, device,
    ``_class`` and ``_output_shapes``), serialized once; ``shapes`` is the original's own
    ``_output_shapes`` entry (``b""`` without one), for copies that keep it.

    Where the ``_output_shapes`` entry goes among the ``attr`` entries is protobuf's own
    choice (its key order is not plain string order: ``Tlabels`` precedes ``T``), so the
    template serializes the kept fields with that entry (an empty one where the original
    has none) and cuts the bytes around it."""

    def __init__(self, original: Any) -> None:
        self.op = _field(_OP, original.op.encode())
        probe = NodeDef()
        probe.CopyFrom(original)
        for name in ("name", "op", "input", "device"):
            probe.ClearField(name)
        if "_class" in probe.attr:
            del probe.attr["_class"]
        own_shapes = _SHAPES_KEY in probe.attr
        if not own_shapes:
            probe.attr[_SHAPES_KEY].CopyFrom(AttrValue())
        data = probe.SerializeToString(deterministic=True)
        position, shapes_at = 0, None
        while position < len(data) and data[position] == _ATTR_KEY:
            length, start = _read_varint(data, position + 1)
            if _entry_key(data[start : start + length]) == _SHAPES_KEY:
                shapes_at = (position, start + length)
            position = start + length
        if shapes_at is None:
            raise AssertionError("protobuf dropped the _output_shapes entry")
        self.attrs_before = data[: shapes_at[0]]
        self.shapes = data[shapes_at[0] : shapes_at[1]] if own_shapes else b""
        self.attrs_after = data[shapes_at[1] : position]
        self.tail = data[position:]  # fields numbered after attr

    def instance(self, name: str, inputs: Iterable[str], device: str, shapes: bytes) -> bytes:
        """The deterministic serialization of the instance ``name`` with ``inputs`` on
        ``device`` and the ``_output_shapes`` entry ``shapes`` (``b""`` for none)."""
        parts = [_field(_NAME, name.encode()), self.op]
        parts += [_field(_INPUT, ref.encode()) for ref in inputs]
        if device:
            parts.append(_device_field(device))
        parts += (self.attrs_before, shapes, self.attrs_after, self.tail)
        return b"".join(parts)


@lru_cache(maxsize=1 << 12)
def _device_field(device: str) -> bytes:
    return _field(_DEVICE, device.encode())


class NodeStore(dict):
    """Node name -> ``NodeDef``, or its deterministic serialization until something reads
    it: reading a node (``store[name]``, ``store.get(name)``) parses it once."""

    def __getitem__(self, name: str) -> Any:
        node = dict.__getitem__(self, name)
        if isinstance(node, bytes):
            node = NodeDef.FromString(node)
            dict.__setitem__(self, name, node)
        return node

    def get(self, name: str, default: Any = None) -> Any:
        if name not in self:
            return default
        return self[name]


def serialize_graph(nodes: NodeStore, rest: Any) -> bytes:
    """The deterministic serialization of a ``GraphDef`` holding ``nodes`` (in order) and
    the fields of the ``GraphDef`` ``rest`` (which holds no nodes): the node field is
    numbered first, so its entries come first."""
    parts = [
        _field(
            _GRAPH_NODE,
            node if isinstance(node, bytes) else node.SerializeToString(deterministic=True),
        )
        for node in dict.values(nodes)
    ]
    parts.append(rest.SerializeToString(deterministic=True))
    return b"".join(parts)
