"""The bound counting communication: by hand on a dense layer, and never above a simulated
strategy of the search's actions, with or without SFB, on clusters with slow links."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.actions import Action, ActionSpace
from tagplan.planner.search.comm_bound import comm_bound
from tagplan.planner.search.grouping import cluster_mean_op_time_s, group_ops
from tagplan.planner.search.lower_bound import lower_bound
from tagplan.planner.search.mcts import StrategySearch
from tagplan.planner.search.sfb import apply_sfb
from tagplan.planner.strategy import Option
from tagplan.planner.topology import load_cluster
from tests.planner.clusters import gpus
from tests.planner.graph.builders import dense_graph, graph_def


def bound_of(ir, cluster, costs: OpCostModel, op_group: np.ndarray, space, **options):
    """:func:`comm_bound` given the communication-free bound, as a plan gives it."""
    free_s = lower_bound(ir, cluster, costs).step_time_s
    return comm_bound(ir, cluster, costs, op_group, space, free_s=free_s, **options)


@pytest.mark.parametrize(("features", "units"), [(256, 256), (256, 4)])
def test_dense_layer_over_two_machines_by_hand(features: int, units: int) -> None:
    """loss = sum(x @ w) data-parallel over two machines of one T4 behind a 0.01 Gbps
    network: each machine must send and receive its partial dw (B = 4 features units
    bytes) or, by SFB, its half of x (the cut of dw = x^T @ ones_like(x @ w) is x: C = 4
    batch features bytes), whichever is less, so the step is at least min(B, C/2) over the
    network after dw, and no more than that plus every op at the full batch."""
    batch = 64
    ir = analyze(graph_def(dense_graph(batch=batch, features=features, units=units)))
    cluster = gpus("T4", 2, 1, network_gbps=0.01)
    costs = OpCostModel(ir, cluster)
    space = ActionSpace(ir, cluster, costs)
    space.actions = (Action((0, 1), Option.REPLICATE_ALLREDUCE),)
    op_group = np.zeros(ir.num_ops, dtype=np.int32)
    bound = bound_of(ir, cluster, costs, op_group, space)
    assert bound is not None
    network_s = min(4 * features * units, 4 * batch * features / 2) / (0.01e9 / 8)
    compute_s = float(costs.op_times(0, batch).seconds.sum())
    assert network_s <= bound.lp_s <= network_s + compute_s
    assert bound.busiest == "critical path"  # the sync after dw, not a link's load alone
    evaluation = Evaluator(ir, cluster, costs=costs).evaluate(
        StrategySearch(
            Evaluator(ir, cluster, costs=costs),
            group_ops(ir, cluster_mean_op_time_s(ir, cluster, costs), max_groups=1),
            space,
            reference_step_s=1.0,
        ).strategy_of((0,))
    )
    assert evaluation.step_time_s >= bound.step_time_s


def test_slow_network_raises_only_the_bound_counting_it() -> None:
    source = load_graph_source("zoo:small_cnn")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    found = {}
    for gbps in (100.0, 0.1):
        cluster = gpus("T4", 2, 1, network_gbps=gbps)
        costs = OpCostModel(ir, cluster)
        grouping = group_ops(ir, cluster_mean_op_time_s(ir, cluster, costs), max_groups=4)
        found[gbps] = bound_of(
            ir, cluster, costs, grouping.op_group, ActionSpace(ir, cluster, costs)
        )
    assert found[100.0].free_s == pytest.approx(found[0.1].free_s)
    assert found[0.1].step_time_s > found[100.0].step_time_s >= found[100.0].free_s


def test_a_spent_time_limit_gives_no_bound() -> None:
    ir = analyze(graph_def(dense_graph()))
    cluster = gpus("T4", 2, 1, network_gbps=10.0)
    costs = OpCostModel(ir, cluster)
    op_group = np.zeros(ir.num_ops, dtype=np.int32)
    space = ActionSpace(ir, cluster, costs)
    assert bound_of(ir, cluster, costs, op_group, space, time_limit_s=0.0) is None


CLUSTERS = ["random:3", "random:11", "slow-pairs"]


def _cluster(name: str):
    if name == "slow-pairs":  # mixed GPUs, a slow network: communication decides
        return load_cluster(
            {
                "machines": [
                    {
                        "name": "a",
                        "gpus": {"type": "V100-32GB", "count": 2},
                        "intra_bandwidth_gbps": 100,
                    },
                    {"name": "b", "gpus": {"type": "T4", "count": 2}, "intra_bandwidth_gbps": 50},
                    {"name": "c", "gpus": {"type": "T4", "count": 1}, "intra_bandwidth_gbps": 50},
                ],
                "network": {"bandwidth_gbps": 1},
            }
        )
    return load_cluster(name)


@pytest.mark.parametrize("model", ["mlp", "small_cnn"])
@pytest.mark.parametrize("cluster_name", CLUSTERS)
def test_no_strategy_of_the_actions_beats_it(model: str, cluster_name: str) -> None:
    """Every action for every group, random mixtures, and SFB applied to some: each
    simulated step is at least the bound, and the bound at least the communication-free
    one."""
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    cluster = _cluster(cluster_name)
    evaluator = Evaluator(ir, cluster)
    costs = evaluator.costs
    space = ActionSpace(ir, cluster, costs)
    grouping = group_ops(ir, cluster_mean_op_time_s(ir, cluster, costs), max_groups=6)
    bound = bound_of(ir, cluster, costs, grouping.op_group, space)
    assert bound is not None
    assert bound.step_time_s >= lower_bound(ir, cluster, costs).step_time_s
    search = StrategySearch(evaluator, grouping, space, reference_step_s=1.0)
    rng = np.random.default_rng(7)
    n = grouping.num_groups
    keys = [(a,) * n for a in range(len(space.actions))]
    keys += [tuple(rng.integers(len(space.actions), size=n).tolist()) for _ in range(12)]
    strategies = [search.strategy_of(key) for key in keys]
    strategies += [
        apply_sfb(s, ir, cluster, costs)[0] for s in strategies[:: max(1, len(keys) // 6)]
    ]
    steps = [e.step_time_s for e in map(evaluator.evaluate, strategies) if not e.result.oom]
    assert steps
    assert min(steps) >= bound.step_time_s * (1 - 1e-9)
