"""Warm starts: a strategy found before, adapted to a cluster a machine larger or smaller,
projected onto the search's actions, and a search that starts from it and never returns
anything slower."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.options import PlanOptions
from tagplan.planner.plan import Planner
from tagplan.planner.search.warm_start import adapt_strategy, pair_device_groups, start_actions
from tagplan.planner.strategy import GroupDecision, OpGroup, Option, Strategy
from tagplan.planner.topology import load_cluster
from tests.planner.search.test_mcts import make_search
from tests.planner.zoo_graphs import zoo_ir


def _machine(name: str, kind: str, count: int) -> dict:
    return {"name": name, "gpus": {"type": kind, "count": count}, "intra_bandwidth_gbps": 96}


def _cluster(*machines: dict):
    return load_cluster({"machines": list(machines), "network": {"bandwidth_gbps": 25}})


V100S = [_machine("v0", "V100-16GB", 2), _machine("v1", "V100-16GB", 2)]
T4 = _machine("t0", "T4", 2)


def test_groups_pair_by_type_and_a_missing_machine_leaves_its_group_out() -> None:
    big = _cluster(*V100S, T4)
    small = _cluster(V100S[1], T4)  # one V100 machine fewer
    pairs = pair_device_groups(big, small)
    assert len(pairs) == 2
    for source, target in pairs.items():
        assert big.group_type_name(source) == small.group_type_name(target)
    assert sorted(pairs.values()) == [0, 1]


def test_a_decision_across_machines_takes_in_a_new_machine_of_its_types() -> None:
    small = _cluster(*V100S, T4)
    big = _cluster(*V100S, _machine("v2", "V100-16GB", 2), T4)
    v100 = [g for g in range(small.num_groups) if small.group_type_name(g) == "V100-16GB"]
    every = GroupDecision(device_groups=list(range(small.num_groups)), option=Option.REPLICATE_PS)
    all_v100 = GroupDecision(device_groups=v100, option=Option.MODEL_PARALLEL)
    one_box = GroupDecision(device_groups=v100[:1], option=Option.REPLICATE_ALLREDUCE)
    strategy = Strategy(
        groups=[
            OpGroup(ops=["a"], decision=every),
            OpGroup(ops=["b"], decision=one_box),
        ],
        default=all_v100,
    )
    adapted = adapt_strategy(strategy, small, big)
    assert adapted.groups[0].decision.device_groups == list(range(big.num_groups))
    assert adapted.groups[0].decision.option == Option.REPLICATE_PS
    assert len(adapted.default.device_groups) == 3
    assert {big.group_type_name(g) for g in adapted.default.device_groups} == {"V100-16GB"}
    assert len(adapted.groups[1].decision.device_groups) == 1  # inside one machine: stays


def test_a_strategy_on_groups_that_all_disappear_cannot_be_adapted() -> None:
    t4_only = GroupDecision(device_groups=[1], option=Option.REPLICATE_ALLREDUCE)
    source = _cluster(V100S[0], T4)
    assert source.group_type_name(1) == "T4"
    strategy = Strategy(groups=[OpGroup(ops=["a"], decision=t4_only)])
    assert adapt_strategy(strategy, source, _cluster(*V100S)) is None


@pytest.fixture(scope="module")
def search():
    return make_search("mlp", _cluster(*V100S, T4))


def test_a_strategy_of_the_search_projects_back_onto_its_own_actions(search) -> None:
    rng = np.random.default_rng(0)
    op_time_s = np.ones(search.evaluator.ir.num_ops)
    for _ in range(5):
        key = tuple(int(a) for a in rng.integers(0, len(search.space), search.grouping.num_groups))
        assert start_actions(search.strategy_of(key), search, op_time_s) == key


def test_the_search_starts_from_the_start_and_never_returns_worse(search) -> None:
    key = search.complete([len(search.space) - 1])
    start = search.score(key)
    first = search.run(iterations=1, start=key)
    assert first.actions == key and first.step_time_s == start.step_time_s
    longer = search.run(iterations=30, start=key)
    assert longer.step_time_s <= start.step_time_s
    assert longer.iterations == 30


def test_after_its_start_a_warm_search_walks_the_cold_search_tree() -> None:
    cluster = _cluster(*V100S, T4)
    steps: dict[str, list[float]] = {}
    for name, start in (("cold", None), ("warm", "slowest")):
        search = make_search("mlp", cluster)
        if start:
            start = search.complete([len(search.space) - 1])
        trace = steps.setdefault(name, [])
        search.run(
            iterations=25, start=start, progress=lambda p, t=trace: t.append(p.best_step_time_s)
        )
    # the warm search's iteration k + 1 has the cold search's best of iteration k, or better
    assert all(
        w is not None and (c is None or w <= c)
        for c, w in zip(steps["cold"][:-1], steps["warm"][1:], strict=True)
    )


def test_a_start_of_the_wrong_length_is_refused(search) -> None:
    with pytest.raises(InvalidInput, match="one action"):
        search.run(iterations=3, start=(0,))


def test_a_plan_started_from_a_strategy_is_at_least_as_fast() -> None:
    ir, cluster = zoo_ir("small_cnn"), _cluster(*V100S, T4)
    slow = Strategy(
        groups=[
            OpGroup(
                ops=list(ir.op_names),
                decision=GroupDecision(device_groups=[0], option=Option.REPLICATE_ALLREDUCE),
            )
        ]
    )
    options = PlanOptions(iterations=5, sfb=False, patience=None)
    planner = Planner(ir, cluster, options=options, graphdef=False, start=slow)
    result = planner.finish([planner.search_shard(0)])
    assert result.step_time_s <= planner.evaluator.evaluate(slow).step_time_s
