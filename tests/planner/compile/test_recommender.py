"""A wide-and-deep recommender whose embedding tables train from sparse gradients (the
zoo's ``tiny_wide_deep``): the tables are sparse parameters, and plans that replicate
them, keep one copy on a parameter server, or spread them over GPUs compute what the
single-device step computes."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.compile.placement import place
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.strategy import resolve
from tagplan.planner.topology import load_cluster
from tagplan.planner.zoo import get_model
from tests.planner.verify.own_process import verify_many_apart

TWO_MACHINES = {
    "machines": [
        {"name": "a", "gpus": {"type": "T4", "count": 2}, "intra_bandwidth_gbps": 100},
        {"name": "b", "gpus": {"type": "V100-16GB", "count": 1}, "intra_bandwidth_gbps": 100},
    ],
    "network": {"bandwidth_gbps": 10},
}


@pytest.fixture(scope="module")
def ir():
    source = load_graph_source("zoo:tiny_wide_deep")
    return analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)


def test_the_tables_are_sparse_parameters(ir) -> None:
    tables = ir.sparse_parameters
    assert sorted(tables.names) == sorted(
        [f"deep/embedding_{i}" for i in range(3)] + [f"wide/weights_{i}" for i in range(3)]
    )
    rows = (50, 40, 30)
    expected = [r * 4 * 4 for r in rows] + [r * 2 * 4 for r in rows]  # width 4; 2 classes
    assert sorted(tables.bytes.tolist()) == sorted(expected)
    assert (tables.slot_bytes == 2 * tables.bytes).all()  # Adam's m and v
    summary = ir.summary()
    assert summary["trainable_bytes"] == get_model("tiny_wide_deep").param_bytes
    assert len(ir.parameters) == 4  # the tower's kernels and biases


def _table_devices(ir, strategy_name: str) -> list[set[int]]:
    """Per table: the GPUs its variable, slots, lookups and updates run on."""
    cluster = load_cluster(TWO_MACHINES)
    strategy = baseline_strategy(strategy_name, ir, cluster, OpCostModel(ir, cluster))
    placement = place(ir, resolve(strategy, ir, cluster))
    tables = ir.sparse_parameters
    found = []
    for row in range(len(tables)):
        colocated = np.flatnonzero(ir.colocation == ir.colocation[tables.variable_op[row]])
        ops = {
            *colocated.tolist(),
            *tables.update_op[tables.update_ptr[row] : tables.update_ptr[row + 1]].tolist(),
        }
        found.append({int(d) for op in ops for d in placement.devices(op)})
    return found


def test_a_table_on_a_parameter_server_stays_there(ir) -> None:
    # dp-ps: each table, its lookups and its sparse updates on one GPU (the PS layout:
    # replicas pull rows and push gradient rows); the tables spread over the GPUs
    on_servers = _table_devices(ir, "dp-ps")
    assert all(len(devices) == 1 for devices in on_servers)
    assert len(set().union(*on_servers)) > 1
    # dp-nccl: mirrored on every GPU, each replica applying every replica's rows
    assert all(devices == {0, 1, 2} for devices in _table_devices(ir, "dp-nccl"))


@pytest.mark.tf
@pytest.mark.slow
def test_plans_of_the_tables_train_as_the_single_device_graph(ir) -> None:
    cluster = load_cluster(TWO_MACHINES)
    costs = OpCostModel(ir, cluster)
    strategies = [baseline_strategy(n, ir, cluster, costs) for n in ("dp-nccl", "dp-ps", "m-etf")]
    reports = verify_many_apart("zoo:tiny_wide_deep", cluster, strategies, batch_size=6)
    for report in reports:
        assert report.passed, report.summary()
