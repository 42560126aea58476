"""A compiled plan moved to a renumbered cluster runs there: every node on the GPU (or its
task's CPU) the isomorphism maps it to, and TensorFlow computes the single-device step."""

from __future__ import annotations

import dataclasses

import pytest

from tagplan.planner.compile.graphdef import compile_graphdef, task_map, worker_device
from tagplan.planner.compile.renumber import renumber_graph
from tagplan.planner.compile.state import graph_digest, task_cpu
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.protos import GraphDef
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.strategy import resolve
from tagplan.planner.topology import load_cluster, map_devices
from tagplan.planner.verify.check import verify_many
from tests.planner.verify.test_verify import BATCH, _batch_four

SOURCE = {
    "machines": [
        {"name": "a", "gpus": {"type": "V100-16GB", "count": 2}, "intra_bandwidth_gbps": 100},
        {"name": "b", "gpus": {"type": "T4", "count": 1}, "intra_bandwidth_gbps": 50},
        {"name": "c", "gpus": {"type": "T4", "count": 2}, "intra_bandwidth_gbps": 50},
    ],
    "network": {"bandwidth_gbps": 10, "latency_us": 10},
}
# the same allocation: machines renamed and listed in another order
TARGET = {
    **SOURCE,
    "machines": [
        {**SOURCE["machines"][2], "name": "node-x"},
        {**SOURCE["machines"][0], "name": "node-y"},
        {**SOURCE["machines"][1], "name": "node-z"},
    ],
}


@pytest.fixture(scope="module")
def plans():
    source, target = load_cluster(SOURCE), load_cluster(TARGET)
    graph_def, ir = _batch_four("mlp")
    costs = OpCostModel(ir, source)
    compiled = {
        name: compile_graphdef(
            graph_def, ir, source, resolve(baseline_strategy(name, ir, source, costs), ir, source)
        )
        for name in ("dp-nccl", "dp-ps")
    }
    return source, target, compiled


def _renumbered(plans, name):
    source, target, compiled = plans
    distributed = compiled[name]
    devices = map_devices(source, target)
    data, device_map = renumber_graph(
        distributed.graph_def.SerializeToString(), distributed.device_map, source, target, devices
    )
    return devices, GraphDef.FromString(data), device_map


@pytest.mark.parametrize("name", ["dp-nccl", "dp-ps"])
def test_every_node_moves_to_the_mapped_device(plans, name) -> None:
    source, target, compiled = plans
    devices, graph_def, device_map = _renumbered(plans, name)
    assert sorted(devices.tolist()) == list(range(source.num_devices))
    expected = {
        worker_device(source, d): worker_device(target, int(t)) for d, t in enumerate(devices)
    }
    expected |= {task_cpu(a): task_cpu(b) for a, b in expected.items()}
    before = {n.name: n.device for n in compiled[name].graph_def.node}
    moved = {n.name: n.device for n in graph_def.node}
    assert moved.keys() == before.keys()
    assert all(moved[node] == expected[device] for node, device in before.items() if device)
    assert device_map["tasks"] == task_map(target)
    assert device_map["graph_sha256"] == graph_digest(graph_def)
    assert device_map["variables"] == compiled[name].device_map["variables"]


def test_a_graph_on_devices_the_cluster_lacks_is_refused(plans) -> None:
    source, target, compiled = plans
    graph_def = GraphDef()
    graph_def.CopyFrom(compiled["dp-nccl"].graph_def)
    graph_def.node[0].device = "/job:worker/replica:0/task:7/device:GPU:0"
    with pytest.raises(InvalidInput, match="not a device of the cluster"):
        renumber_graph(
            graph_def.SerializeToString(),
            compiled["dp-nccl"].device_map,
            source,
            target,
            map_devices(source, target),
        )


@pytest.mark.tf
def test_the_renumbered_graph_computes_the_single_device_step(plans) -> None:
    _, target, compiled = plans
    moved = []
    for name in ("dp-nccl", "dp-ps"):
        _, graph_def, device_map = _renumbered(plans, name)
        moved.append(
            dataclasses.replace(
                compiled[name],
                graph_def_bytes=graph_def.SerializeToString(),
                device_map=device_map,
            )
        )
    for report in verify_many("zoo:mlp", target, moved, batch_size=BATCH):
        assert report.passed, report.summary()
        assert report.loss_rel_error < 1e-4
