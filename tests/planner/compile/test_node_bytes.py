"""Nodes emitted as bytes are the nodes a message-by-message build gives, byte for byte in
protobuf's deterministic serialization, and a compiled graph's bytes are that serialization
of the whole graph (so ``graph_sha256`` hashes them directly)."""

from __future__ import annotations

import pytest

from tagplan.planner.compile.node_bytes import (
    NodeStore,
    NodeTemplate,
    serialize_graph,
    shapes_entry,
)
from tagplan.planner.compile.state import graph_digest
from tagplan.planner.graph.protos import AttrValue, GraphDef, NodeDef
from tagplan.planner.graph.source import load_graph_source
from tests.planner.compile.test_graphdef import STRATEGIES, compiled, two_by_two

# TF1 and TF2 exports, attrs whose keys protobuf orders apart from string order (Tlabels, T),
# functions in attributes, colocation hints
MODELS = ["mlp", "mlp_tf2", "small_cnn", "tiny_lstm", "tiny_wide_deep", "bert_small"]
DEVICE = "/job:worker/replica:0/task:1/device:GPU:0"


def _message_instance(original, name: str, inputs: list[str], shapes) -> bytes:
    """An instance built as the GraphDef back end built it before it emitted bytes."""
    node = NodeDef()
    node.CopyFrom(original)
    node.name, node.device = name, DEVICE
    del node.input[:]
    node.input.extend(inputs)
    for key in ("_class", "_output_shapes"):
        if key in node.attr:
            del node.attr[key]
    if shapes is not None:
        attr = node.attr["_output_shapes"]
        for shape in shapes:
            proto = attr.list.shape.add()
            for size in shape:
                proto.dim.add().size = size
    return node.SerializeToString(deterministic=True)


def _shapes_entry(shapes) -> bytes:
    return b"" if shapes is None else shapes_entry(shapes)


@pytest.mark.parametrize("model", MODELS)
def test_every_instance_is_the_message_built_one_byte_for_byte(model: str) -> None:
    graph_def = load_graph_source(f"zoo:{model}").graph_def
    for original in graph_def.node:
        template = NodeTemplate(original)
        inputs = [*original.input, "other/replica_2:1", "^barrier"]
        for shapes in (None, ((8, 3),), ((), (5, 0, 2))):
            data = template.instance(
                f"{original.name}/replica_3", inputs, DEVICE, _shapes_entry(shapes)
            )
            assert data == _message_instance(
                original, f"{original.name}/replica_3", inputs, shapes
            ), original.name


@pytest.mark.parametrize("model", ["mlp", "mlp_tf2", "tiny_lstm"])
def test_a_copy_can_keep_the_originals_shapes(model: str) -> None:
    graph_def = load_graph_source(f"zoo:{model}").graph_def
    assert any("_output_shapes" in n.attr for n in graph_def.node)
    for original in graph_def.node:
        template = NodeTemplate(original)
        expected = NodeDef()
        expected.CopyFrom(original)
        expected.name, expected.device = "copy", DEVICE
        del expected.input[:]
        expected.input.extend(["a", "b:1"])
        if "_class" in expected.attr:
            del expected.attr["_class"]
        data = template.instance("copy", ["a", "b:1"], DEVICE, template.shapes)
        assert data == expected.SerializeToString(deterministic=True), original.name


def test_a_store_parses_a_node_when_read_and_keeps_what_changed() -> None:
    original = NodeDef(name="a", op="Identity", device=DEVICE)
    original.attr["T"].type = 1
    store = NodeStore()
    store["a"] = original.SerializeToString(deterministic=True)
    store["b"] = NodeDef(name="b", op="NoOp")
    assert isinstance(dict.__getitem__(store, "a"), bytes)
    store["a"].input.append("^b")  # parsed once, and the change kept
    assert store.get("a").input == ["^b"] and store.get("missing") is None
    rest = GraphDef()
    rest.versions.producer = 7
    data = serialize_graph(store, rest)
    graph = GraphDef.FromString(data)
    assert [n.name for n in graph.node] == ["a", "b"]
    assert graph.node[0].input == ["^b"] and graph.versions.producer == 7
    assert data == graph.SerializeToString(deterministic=True)


def test_an_empty_attribute_value_keeps_its_place() -> None:
    original = NodeDef(name="n", op="Op")
    original.attr["T"].CopyFrom(AttrValue())
    original.attr["Tlabels"].type = 3
    original.attr["_class"].list.s.append(b"loc:@x")
    data = NodeTemplate(original).instance("n/replica_0", [], DEVICE, _shapes_entry(((2,),)))
    assert data == _message_instance(original, "n/replica_0", [], ((2,),))


@pytest.mark.parametrize("model", ["mlp", "small_cnn"])
@pytest.mark.parametrize("name", STRATEGIES)
def test_a_compiled_graph_is_its_own_deterministic_serialization(model: str, name: str) -> None:
    *_, distributed = compiled(model, name, two_by_two())
    data = distributed.graph_def_bytes
    graph = GraphDef.FromString(data)
    assert data == graph.SerializeToString(deterministic=True)
    assert distributed.device_map["graph_sha256"] == graph_digest(distributed.graph_def)
