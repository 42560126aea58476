"""The device map of a TF2 concrete function (docs/run-a-plan.md, "Captured variables"):
every captured variable of the Keras 3 MLP, named as its manifest names it, with the
placeholder each replica binds and that placeholder's device."""

from __future__ import annotations

import pytest

from tagplan.planner.compile.graphdef import compile_graphdef
from tagplan.planner.graph.protos import DT_RESOURCE
from tagplan.planner.strategy import resolve
from tagplan.planner.zoo import catalog
from tests.planner.compile.test_graphdef import committed, strategy, two_by_two


def compiled_tf2(name: str):
    cluster = two_by_two()
    graph_def, ir = committed("mlp_tf2")
    resolved = resolve(strategy(name, ir, cluster, "MatMul_2"), ir, cluster)
    manifest = catalog.get_model("mlp_tf2").captured_variables
    names = {c["placeholder"]: c["variable"] for c in manifest}
    return ir, compile_graphdef(graph_def, ir, cluster, resolved, names)


@pytest.mark.parametrize("name", ["dp-nccl", "partial", "model-parallel"])
def test_every_captured_variable_is_mapped_on_every_replica(name: str) -> None:
    ir, distributed = compiled_tf2(name)
    captured = distributed.device_map["captured_variables"]
    manifest = {c["placeholder"]: c for c in catalog.get_model("mlp_tf2").captured_variables}
    assert set(captured) == set(manifest)
    nodes = {n.name: n for n in distributed.graph_def.node}
    for placeholder, entry in captured.items():
        expected = manifest[placeholder]
        assert {k: entry[k] for k in ("variable", "dtype", "shape", "trainable")} == {
            k: expected[k] for k in ("variable", "dtype", "shape", "trainable")
        }
        instances = distributed.placement.instances(ir.op_index(placeholder))
        assert len(entry["replicas"]) == len(instances) >= 1
        for replica in entry["replicas"]:
            node = nodes[replica["placeholder"]]
            assert node.op == "Placeholder" and node.attr["dtype"].type == DT_RESOURCE
            assert node.device == replica["device"]
        devices = [r["device"] for r in entry["replicas"]]
        assert len(set(devices)) == len(devices)  # one variable per GPU it is mirrored on
    assert distributed.device_map["variables"] == {}
    replicas = distributed.variable_replicas()
    assert {n: len(r) for n, r in replicas.items()} == {
        n: len(e["replicas"]) for n, e in captured.items()
    }


def test_data_parallelism_binds_a_variable_on_every_gpu() -> None:
    _, distributed = compiled_tf2("dp-nccl")
    for entry in distributed.device_map["captured_variables"].values():
        assert len(entry["replicas"]) == 4


def test_a_tf1_graph_captures_nothing_and_keeps_its_variables() -> None:
    graph_def, ir = committed("mlp")
    cluster = two_by_two()
    resolved = resolve(strategy("dp-nccl", ir, cluster, "dense_2"), ir, cluster)
    device_map = compile_graphdef(graph_def, ir, cluster, resolved).device_map
    assert device_map["captured_variables"] == {}
    assert len(device_map["variables"]["dense_0/kernel"]) == 4


def test_a_graph_without_own_variables_gets_checkpoint_ops_that_move_nothing() -> None:
    _, distributed = compiled_tf2("dp-nccl")
    nodes = {n.name: n for n in distributed.graph_def.node}
    checkpoint = distributed.device_map["checkpoint"]
    assert set(checkpoint.values()) <= set(nodes)
    assert not [n for n in nodes.values() if n.op in ("SaveV2", "RestoreV2")]
