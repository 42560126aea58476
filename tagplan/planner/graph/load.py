"""Read a training graph from bytes or a file: GraphDef (binary or text), gzip, or JSON.

The format is sniffed from the content, not the file name, so an upload with a wrong
extension still loads. Everything that is not a well-formed graph raises
:class:`~tagplan.planner.errors.InvalidInput` saying which format was tried and why it failed.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Any

from google.protobuf import message as protobuf_message
from google.protobuf import text_format

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.neutral_json import graph_def_from_json
from tagplan.planner.graph.protos import GraphDef

__all__ = ["MAX_GRAPH_BYTES", "load_graph_def", "loads_graph_def"]

# Upper bound for a decompressed graph: the largest zoo graph is a few MB; 1 GiB leaves
# room for graphs with embedded constants while keeping a gzip bomb from exhausting memory.
MAX_GRAPH_BYTES = 1 << 30

_GZIP_MAGIC = b"\x1f\x8b"


def _gunzip(data: bytes, *, max_bytes: int) -> bytes:
    decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = decompressor.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise InvalidInput(f"graph is not valid gzip: {exc}") from exc
    if len(out) > max_bytes:
        raise InvalidInput(f"decompressed graph exceeds {max_bytes} bytes")
    if not decompressor.eof:
        raise InvalidInput("graph is truncated gzip")
    return out


def _looks_like_text(data: bytes) -> bool:
    head = data[:4096]
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(b >= 0x20 or b in b"\t\n\r" for b in head)


def loads_graph_def(data: bytes, *, max_bytes: int = MAX_GRAPH_BYTES) -> Any:
    """Parse a graph in any supported format into a ``GraphDef`` message.

    >>> g = loads_graph_def(b'node { name: "x" op: "Placeholder" }')
    >>> g.node[0].op
    'Placeholder'
    """
    if data[:2] == _GZIP_MAGIC:
        data = _gunzip(data, max_bytes=max_bytes)
    elif len(data) > max_bytes:
        raise InvalidInput(f"graph exceeds {max_bytes} bytes")
    if not data.strip():
        raise InvalidInput("graph is empty")
    stripped = data.lstrip()
    if stripped[:1] in (b"{", b"[") and _looks_like_text(data):
        try:
            document = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"graph looks like JSON but does not parse: {exc}") from exc
        except RecursionError:
            raise InvalidInput("graph looks like JSON but nests too deeply to parse") from None
        return graph_def_from_json(document)
    if _looks_like_text(data):
        graph = GraphDef()
        try:
            text_format.Parse(data.decode("utf-8"), graph)
        except (text_format.ParseError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"graph is not a valid text GraphDef: {exc}") from exc
        except RecursionError:
            raise InvalidInput("graph is not a valid text GraphDef: it nests too deeply") from None
        return graph
    graph = GraphDef()
    try:
        graph.ParseFromString(data)
    except protobuf_message.DecodeError as exc:
        raise InvalidInput(f"graph is not a valid binary GraphDef: {exc}") from exc
    if not graph.node:
        raise InvalidInput("graph is not a valid binary GraphDef: it has no nodes")
    return graph


def load_graph_def(path: str | Path) -> Any:
    """Read and parse a graph file (see :func:`loads_graph_def`)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidInput(f"cannot read graph file {path}: {exc.strerror}") from exc
    return loads_graph_def(data)
