"""The capped action generator of the search and the decisions actions turn into."""

from __future__ import annotations

import numpy as np

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.search.actions import Action, ActionSpace, candidate_actions
from tagplan.planner.strategy import Option
from tagplan.planner.topology import load_cluster
from tests.planner.graph.builders import dense_graph, graph_def


def test_testbed_candidates() -> None:
    cluster = load_cluster("testbed")  # 7 device groups: 4xV100, 4 machines of 2x1080Ti, 2x2xP100
    speed = np.array([4.0, 1.0, 1.0, 1.0, 1.0, 1.5, 1.5])
    actions = candidate_actions(cluster, speed)
    assert actions[0] == Action(tuple(range(7)), Option.REPLICATE_ALLREDUCE)
    assert len(set(actions)) == len(actions)
    # the k fastest: V100 group, then the P100 groups
    assert Action((0, 5, 6), Option.REPLICATE_PS) in actions
    # dropping the slowest group, and every option on multi-GPU placements
    assert {a.option for a in actions if a.device_groups == (0, 1, 2, 3, 5, 6)} == set(Option)
    assert Action((0,), Option.MODEL_PARALLEL) in actions


def test_single_gpu_placements_offer_one_option_and_the_cap_holds() -> None:
    cluster = load_cluster("random:3")
    speed = np.ones(cluster.num_groups)
    actions = candidate_actions(cluster, speed, max_actions=20)
    assert len(actions) <= 20
    for action in candidate_actions(cluster, speed):
        if cluster.group_size[list(action.device_groups)].sum() == 1:
            assert action.option == Option.REPLICATE_ALLREDUCE


def test_mixed_gpu_replicas_get_speed_proportional_shares() -> None:
    ir = analyze(graph_def(dense_graph()))
    cluster = load_cluster(
        {
            "machines": [
                {
                    "name": "a",
                    "gpus": {"type": "V100-32GB", "count": 1},
                    "intra_bandwidth_gbps": 100,
                },
                {"name": "b", "gpus": {"type": "T4", "count": 1}, "intra_bandwidth_gbps": 100},
            ],
            "network": {"bandwidth_gbps": 10},
        }
    )
    costs = OpCostModel(ir, cluster)
    space = ActionSpace(ir, cluster, costs)
    both = space.decision(Action((0, 1), Option.REPLICATE_ALLREDUCE))
    local = ir.batch_size // 2
    v100 = 1 / costs.op_times(costs.type_of("V100-32GB"), local).total_s
    t4 = 1 / costs.op_times(costs.type_of("T4"), local).total_s
    weights = both.batch_weights
    assert weights is not None
    assert weights[cluster.device_names[0]] / weights[cluster.device_names[1]] == v100 / t4
    # duplication and model parallelism split no batch
    assert space.decision(Action((0, 1), Option.DUPLICATE)).batch_weights is None
    assert space.decision(Action((0,), Option.REPLICATE_ALLREDUCE)).batch_weights is None


def test_forty_device_groups_stay_within_the_cap_with_every_kind_represented() -> None:
    kinds = ["V100-16GB", "T4", "P100", "A10"]
    cluster = load_cluster(
        {
            "machines": [
                {
                    "name": f"m{i}",
                    "gpus": {"type": kinds[i % 4], "count": 1 + i % 3},
                    "intra_bandwidth_gbps": 96,
                }
                for i in range(40)
            ],
            "network": {"bandwidth_gbps": 25},
        }
    )
    speed = np.arange(40, 0, -1, dtype=float)
    actions = candidate_actions(cluster, speed, max_actions=300)
    assert cluster.num_groups == 40 and len(actions) == 300
    placements = {a.device_groups for a in actions}
    assert tuple(range(40)) in placements  # everything
    assert (0,) in placements and (1,) in placements  # the fastest single groups
    assert tuple(range(39)) in placements  # the slowest dropped
    by_type = tuple(np.flatnonzero(cluster.group_type == cluster.group_type[0]).tolist())
    assert by_type in placements
