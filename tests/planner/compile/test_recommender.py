"""A wide-and-deep recommender whose embedding tables train from sparse gradients (the
zoo's ``tiny_wide_deep``): the tables are sparse parameters, and plans that replicate
them, keep one copy on a parameter server, or spread them over GPUs compute what the
single-device step computes."""

from __future__ import annotations

import pytest

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baselines import baseline_strategy
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


@pytest.mark.tf
@pytest.mark.slow
def test_plans_of_the_tables_train_as_the_single_device_graph(ir) -> None:
    cluster = load_cluster(TWO_MACHINES)
    costs = OpCostModel(ir, cluster)
    strategies = [baseline_strategy(n, ir, cluster, costs) for n in ("dp-nccl", "dp-ps", "m-etf")]
    reports = verify_many_apart("zoo:tiny_wide_deep", cluster, strategies, batch_size=6)
    for report in reports:
        assert report.passed, report.summary()
