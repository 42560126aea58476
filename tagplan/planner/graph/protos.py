"""TensorFlow's GraphDef and OpDef messages without importing TensorFlow.

The API process parses and validates graphs but must not load TensorFlow (docs/design.md §1:
fast start, small memory, a slim image). The message types come from a snapshot of
TensorFlow's own ``tensorflow/core/framework/*.proto`` descriptors (``tf_framework.binpb``)
loaded into a private descriptor pool, so they never clash with TensorFlow's classes when
both live in one process; the two exchange serialized bytes. ``tf_ops.binpb.gz`` is a
snapshot of TensorFlow's op registry (the ``OpDef`` of every registered op): it tells the
number and dtypes of each node's outputs and the names of its inputs.

Both snapshots are regenerated from the installed TensorFlow with
``python -m tagplan.planner.graph.protos``.
"""

from __future__ import annotations

import gzip
import sys
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = [
    "DTYPE_BYTES",
    "DTYPE_NAMES",
    "DT_RESOURCE",
    "DT_VARIANT",
    "AttrValue",
    "GraphDef",
    "NodeDef",
    "OpList",
    "dtype_name",
    "op_registry",
]

_DESCRIPTORS_FILE = "tf_framework.binpb"
_OPS_FILE = "tf_ops.binpb.gz"


def _load_pool() -> descriptor_pool.DescriptorPool:
    data = resources.files(__package__).joinpath(_DESCRIPTORS_FILE).read_bytes()
    file_set = descriptor_pb2.FileDescriptorSet.FromString(data)
    pool = descriptor_pool.DescriptorPool()
    for file_proto in file_set.file:
        pool.Add(file_proto)
    return pool


_POOL = _load_pool()


def _message(full_name: str) -> type[Any]:
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(full_name))


GraphDef = _message("tensorflow.GraphDef")
NodeDef = _message("tensorflow.NodeDef")
AttrValue = _message("tensorflow.AttrValue")
OpList = _message("tensorflow.OpList")

_DATA_TYPE = _POOL.FindEnumTypeByName("tensorflow.DataType")

# Bytes per element of each TensorFlow DataType. Reference types (DT_FLOAT_REF = 101, ...)
# share the size of their base type. Handles (resource, variant) and strings count as
# zero: they are not tensors the planner moves or stores.
_ELEMENT_BYTES_BY_NAME = {
    "DT_FLOAT": 4,
    "DT_DOUBLE": 8,
    "DT_INT32": 4,
    "DT_UINT8": 1,
    "DT_INT16": 2,
    "DT_INT8": 1,
    "DT_STRING": 0,
    "DT_COMPLEX64": 8,
    "DT_INT64": 8,
    "DT_BOOL": 1,
    "DT_QINT8": 1,
    "DT_QUINT8": 1,
    "DT_QINT32": 4,
    "DT_BFLOAT16": 2,
    "DT_QINT16": 2,
    "DT_QUINT16": 2,
    "DT_UINT16": 2,
    "DT_COMPLEX128": 16,
    "DT_HALF": 2,
    "DT_RESOURCE": 0,
    "DT_VARIANT": 0,
    "DT_UINT32": 4,
    "DT_UINT64": 8,
    "DT_FLOAT8_E5M2": 1,
    "DT_FLOAT8_E4M3FN": 1,
    "DT_INT4": 1,
    "DT_UINT4": 1,
}
_RENAMES = {"DT_FLOAT": "float32", "DT_DOUBLE": "float64", "DT_HALF": "float16"}
DTYPE_BYTES: dict[int, int] = {}
DTYPE_NAMES: dict[int, str] = {}
for _value in _DATA_TYPE.values:
    if _value.name in _ELEMENT_BYTES_BY_NAME:
        DTYPE_BYTES[_value.number] = _ELEMENT_BYTES_BY_NAME[_value.name]
        DTYPE_BYTES[_value.number + 100] = _ELEMENT_BYTES_BY_NAME[_value.name]
    DTYPE_NAMES[_value.number] = _RENAMES.get(_value.name, _value.name[3:].lower())
DT_RESOURCE: int = _DATA_TYPE.values_by_name["DT_RESOURCE"].number
DT_VARIANT: int = _DATA_TYPE.values_by_name["DT_VARIANT"].number


def dtype_name(dtype: int) -> str:
    """``float32``-style name of a DataType enum value (``"unknown"`` when unset)."""
    return DTYPE_NAMES.get(dtype - 100 if dtype > 100 else dtype, "unknown")


@cache
def op_registry() -> dict[str, Any]:
    """TensorFlow's registered ops by type name (``OpDef`` messages), from the snapshot."""
    data = gzip.decompress(resources.files(__package__).joinpath(_OPS_FILE).read_bytes())
    return {op.name: op for op in OpList.FromString(data).op}


def regenerate(out_dir: Path) -> None:
    """Write both snapshots from the installed TensorFlow (development use)."""
    from tensorflow.core.framework import graph_pb2
    from tensorflow.python.client import pywrap_tf_session

    files: dict[str, Any] = {}

    def walk(file_descriptor: Any) -> None:
        if file_descriptor.name in files:
            return
        for dependency in file_descriptor.dependencies:
            walk(dependency)
        files[file_descriptor.name] = file_descriptor

    walk(graph_pb2.DESCRIPTOR)
    file_set = descriptor_pb2.FileDescriptorSet()
    for file_descriptor in files.values():
        file_descriptor.CopyToProto(file_set.file.add())
    (out_dir / _DESCRIPTORS_FILE).write_bytes(file_set.SerializeToString(deterministic=True))
    ops = pywrap_tf_session.TF_GetBuffer(pywrap_tf_session.TF_GetAllOpList())
    (out_dir / _OPS_FILE).write_bytes(gzip.compress(bytes(ops), mtime=0))


if __name__ == "__main__":
    regenerate(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
