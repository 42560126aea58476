"""Reading graphs in every supported format, and refusing what is not a graph."""

from __future__ import annotations

import gzip
import json

import pytest
from google.protobuf import text_format

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.load import load_graph_def, loads_graph_def
from tests.planner.graph.builders import dense_graph, graph_def


@pytest.fixture
def dense() -> object:
    return graph_def(dense_graph())


def test_binary_text_gzip_and_json_give_the_same_graph(dense: object) -> None:
    binary = dense.SerializeToString()
    text = text_format.MessageToString(dense).encode()
    as_json = json.dumps(dense_graph()).encode()
    for data in (binary, text, gzip.compress(binary), gzip.compress(text), as_json):
        assert loads_graph_def(data) == dense


def test_file_is_read_by_content_not_extension(tmp_path, dense) -> None:
    path = tmp_path / "graph.json"
    path.write_bytes(gzip.compress(dense.SerializeToString()))
    assert load_graph_def(path) == dense


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"\x1f\x8b\x08\x00garbage", "gzip"),
        (gzip.compress(b"node { name: 'a' op: ")[:-8], "gzip"),
        (b"node { name: 'x' op: 'Placeholder' ", "text GraphDef"),
        (b'{"nodes": [', "JSON"),
        (b"\x0a\xff\xff\xff\xff\x0f", "binary GraphDef"),
        (json.dumps({"nodes": [{"name": "a"}]}).encode(), "non-empty name and op"),
        (json.dumps({"format": "onnx", "nodes": []}).encode(), "format"),
    ],
)
def test_malformed_input_is_refused_with_the_reason(data: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        loads_graph_def(data)


def test_gzip_bomb_is_refused() -> None:
    with pytest.raises(InvalidInput, match="exceeds"):
        loads_graph_def(gzip.compress(b" " * 10_000), max_bytes=1_000)


def test_missing_file_is_an_input_error(tmp_path) -> None:
    with pytest.raises(InvalidInput, match="cannot read"):
        load_graph_def(tmp_path / "absent.pb")
