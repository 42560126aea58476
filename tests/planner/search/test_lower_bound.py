"""The step-time lower bound against hand computation and against every baseline."""

from __future__ import annotations

import pytest

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baselines import BASELINES, baseline_strategy
from tagplan.planner.search.lower_bound import lower_bound
from tagplan.planner.topology import load_cluster
from tests.planner.graph.builders import dense_graph, graph_def


def two_gpus(kind_a: str, kind_b: str):
    return load_cluster(
        {
            "machines": [
                {"name": "a", "gpus": {"type": kind_a, "count": 1}, "intra_bandwidth_gbps": 100},
                {"name": "b", "gpus": {"type": kind_b, "count": 1}, "intra_bandwidth_gbps": 100},
            ],
            "network": {"bandwidth_gbps": 10},
        }
    )


def test_perfect_spread_over_two_gpus_by_hand() -> None:
    ir = analyze(graph_def(dense_graph()))
    cluster = two_gpus("V100-32GB", "T4")
    costs = OpCostModel(ir, cluster)
    v100 = costs.op_times(costs.type_of("V100-32GB"), ir.batch_size).total_s
    t4 = costs.op_times(costs.type_of("T4"), ir.batch_size).total_s
    bound = lower_bound(ir, cluster, costs)
    assert bound.perfect_spread_s == pytest.approx(1 / (1 / v100 + 1 / t4))
    assert bound.step_time_s == max(bound.critical_path_s, bound.perfect_spread_s)
    # identical GPUs: exactly half of one GPU's step
    same = two_gpus("T4", "T4")
    assert lower_bound(ir, same, costs).perfect_spread_s == pytest.approx(t4 / 2)


@pytest.mark.parametrize("model", ["vgg19", "bert_small"])
def test_no_baseline_beats_the_bound(model: str) -> None:
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    evaluator = Evaluator(ir, load_cluster("testbed"))
    bound = lower_bound(ir, evaluator.cluster, evaluator.costs).step_time_s
    for name in BASELINES:
        strategy = baseline_strategy(name, ir, evaluator.cluster, evaluator.costs)
        assert evaluator.evaluate(strategy).step_time_s >= bound
