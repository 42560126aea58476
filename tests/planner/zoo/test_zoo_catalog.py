"""The committed zoo as the catalog serves it, checked without TensorFlow."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.zoo import get_model, graph_path, list_models, read_graph_bytes

TAG_BATCH = {
    "vgg19": 96,
    "resnet101": 96,
    "inception_v3": 96,
    "transformer": 480,
    "bert_small": 96,
    "bert_large": 16,
}
BEYOND_TAG = {"gnmt_small": 256, "wide_deep": 512}
TINY = {"mlp": 32, "small_cnn": 16, "tiny_lstm": 8, "tiny_wide_deep": 8, "mlp_tf2": 32}
MIB = 1024 * 1024


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, bytes | int]]:
    """Top-level (field, wire type, value) triples of a protobuf message."""
    out: list[tuple[int, int, bytes | int]] = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            out.append((field, wire, value))
        elif wire == 2:
            size, pos = _varint(data, pos)
            out.append((field, wire, data[pos : pos + size]))
            pos += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            out.append((field, wire, data[pos : pos + width]))
            pos += width
        else:
            raise AssertionError(f"unexpected wire type {wire}")
    return out


def _nodes(graph_bytes: bytes) -> dict[str, str]:
    """Node name -> op type of a serialized GraphDef (NodeDef fields 1 and 2)."""
    nodes: dict[str, str] = {}
    for field, _, value in _fields(graph_bytes):
        if field != 1:
            continue
        assert isinstance(value, bytes)
        parts = {f: v for f, _, v in _fields(value) if f in (1, 2)}
        nodes[parts[1].decode()] = parts[2].decode()
    return nodes


@pytest.fixture(scope="module")
def nodes_by_model() -> dict[str, dict[str, str]]:
    return {m.name: _nodes(read_graph_bytes(m.name)) for m in list_models()}


def test_lists_the_tag_models_then_the_others_then_the_tiny_ones() -> None:
    models = list_models()
    assert [m.name for m in models] == [*TAG_BATCH, *BEYOND_TAG, *TINY]
    for m in models:
        assert m.batch_size == {**TAG_BATCH, **BEYOND_TAG, **TINY}[m.name]
        assert (m.tag_table3 is not None) == (m.name in TAG_BATCH)


def test_unknown_name_is_invalid_input_naming_known_models() -> None:
    with pytest.raises(InvalidInput) as info:
        get_model("alexnet")
    message = str(info.value)
    assert "alexnet" in message
    for name in (*TAG_BATCH, *TINY):
        assert name in message
    with pytest.raises(InvalidInput):
        graph_path("alexnet")


def test_graph_files_exist_and_match_manifest_hash() -> None:
    for m in list_models():
        assert graph_path(m.name).is_file()
        assert hashlib.sha256(read_graph_bytes(m.name)).hexdigest() == m.graph_sha256


def test_graph_nodes_match_manifest(nodes_by_model: dict[str, dict[str, str]]) -> None:
    for m in list_models():
        nodes = nodes_by_model[m.name]
        assert len(nodes) == m.op_count, m.name
        assert m.loss_node in nodes and m.train_node in nodes
        if m.init_node is not None:
            assert m.init_node in nodes
        for spec in m.inputs:
            assert nodes[spec["name"]] == "Placeholder"
            assert spec["shape"][0] == m.batch_size
            assert all(d > 0 for d in spec["shape"])
            assert ("high" in spec) == spec["dtype"].startswith("int")


def test_tf1_models_apply_adam_once_per_parameter(
    nodes_by_model: dict[str, dict[str, str]],
) -> None:
    for m in list_models():
        ops = list(nodes_by_model[m.name].values())
        if m.style == "tf1":
            assert m.runnable and m.init_node == "init"
            # a table with sparse gradients: Adam scatters the rows into m and v
            sparse_tables = ops.count("ResourceScatterAdd") // 2
            assert ops.count("ResourceApplyAdam") + sparse_tables == m.trainable_variables
            assert "VariableV2" not in ops
        else:
            assert not m.runnable and m.init_node is None
            assert "ResourceApplyAdam" not in ops
            assert "AssignSubVariableOp" in ops and "AssignAddVariableOp" in ops


def test_tf2_model_maps_resource_placeholders_to_variables(
    nodes_by_model: dict[str, dict[str, str]],
) -> None:
    m = get_model("mlp_tf2")
    nodes = nodes_by_model["mlp_tf2"]
    placeholders = {n for n, op in nodes.items() if op == "Placeholder"}
    captured = {c["placeholder"] for c in m.captured_variables}
    assert placeholders == captured | set(m.input_names)
    trainable = [c for c in m.captured_variables if c["trainable"]]
    assert len(trainable) == m.trainable_variables
    mlp = get_model("mlp")
    assert (m.param_count, m.param_bytes) == (mlp.param_count, mlp.param_bytes)


def test_parameter_sizes_near_tag_table3() -> None:
    vgg = get_model("vgg19")
    assert vgg.tag_table3 is not None
    assert abs(vgg.param_mib - 548) / 548 < 0.15
    for name in ("resnet101", "inception_v3", "transformer"):
        m = get_model(name)
        assert m.tag_table3 is not None
        assert abs(m.param_mib - m.tag_table3["param_size_mib"]) / m.param_mib < 0.05, name
    assert get_model("bert_large").config["layers"] == 24


def test_package_import_does_not_load_tensorflow() -> None:
    code = (
        "import sys, tagplan.planner.zoo as z; z.list_models(); z.read_graph_bytes('mlp');"
        "assert 'tensorflow' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
