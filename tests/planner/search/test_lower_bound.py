"""The step-time lower bound against hand computation and against every baseline."""

from __future__ import annotations

import numpy as np
import pulp
import pytest

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baechi import m_etf, m_sct, m_topo
from tagplan.planner.search.baselines import BASELINES, baseline_strategy
from tagplan.planner.search.lower_bound import lower_bound, model_parallel_bound_s, spread_bound_s
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
    v100 = costs.op_times(costs.type_of("V100-32GB"), ir.batch_size).seconds
    t4 = costs.op_times(costs.type_of("T4"), ir.batch_size).seconds
    bound = lower_bound(ir, cluster, costs)
    assert bound.perfect_spread_s == pytest.approx(_exact_spread_s(np.stack([v100, t4]), [1, 1]))
    # never above both GPUs doing a share of every op; never below every op on the faster
    assert bound.perfect_spread_s <= 1 / (1 / v100.sum() + 1 / t4.sum()) * (1 + 1e-9)
    assert bound.perfect_spread_s >= np.minimum(v100, t4).sum() / 2
    assert bound.step_time_s == max(bound.critical_path_s, bound.perfect_spread_s)
    # identical GPUs: exactly half of one GPU's step
    same = two_gpus("T4", "T4")
    assert lower_bound(ir, same, costs).perfect_spread_s == pytest.approx(t4.sum() / 2)


def test_ops_faster_on_different_types_run_side_by_side() -> None:
    # op A 1 s on type 1 and 10 s on type 2, op B the reverse: A beside B takes 1 s, where
    # spreading the whole step over both GPUs in proportion would say 5.5 s
    times = np.array([[1.0, 10.0], [10.0, 1.0]])
    assert spread_bound_s(times, np.array([1, 1])) == pytest.approx(1.0)


def test_one_factor_between_types_gives_the_proportional_spread() -> None:
    times = np.array([[1.0, 2.0, 3.0], [2.5, 5.0, 7.5]])  # type 2 is 2.5x slower at every op
    counts = np.array([2, 3])
    expected = 1 / (2 / times[0].sum() + 3 / times[1].sum())
    assert spread_bound_s(times, counts) == pytest.approx(expected)


def _exact_spread_s(times: np.ndarray, counts: list[int]) -> float:
    """The total-work LP of lower_bound's docstring, solved by CBC."""
    types, ops = times.shape
    problem = pulp.LpProblem("spread", pulp.LpMinimize)
    step = pulp.LpVariable("T", 0)
    share = [[pulp.LpVariable(f"y_{o}_{t}", 0) for t in range(types)] for o in range(ops)]
    problem += step
    for o in range(ops):
        problem += pulp.lpSum(share[o]) == 1
    for t in range(types):
        problem += pulp.lpSum(share[o][t] * times[t, o] for o in range(ops)) <= counts[t] * step
    problem.solve(pulp.PULP_CBC_CMD(msg=0))
    return float(step.value())


@pytest.mark.parametrize("types", [2, 3, 4])
def test_the_spread_bound_is_the_lp_optimum_or_below_it(types: int) -> None:
    rng = np.random.default_rng(types)
    for _ in range(10):
        ops = int(rng.integers(2, 10))
        times = rng.uniform(0.1, 10, size=(types, ops)) * rng.uniform(0.5, 2, size=(types, 1))
        counts = rng.integers(1, 5, size=types)
        exact = _exact_spread_s(times, counts.tolist())
        bound = spread_bound_s(times, counts)
        assert bound <= exact * (1 + 1e-6)  # CBC reports 7 significant digits
        if types <= 3:  # found exactly up to three types
            assert bound == pytest.approx(exact, rel=1e-6)


@pytest.mark.parametrize("model", ["vgg19", "bert_small"])
def test_no_baseline_beats_the_bound(model: str) -> None:
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    evaluator = Evaluator(ir, load_cluster("testbed"))
    bound = lower_bound(ir, evaluator.cluster, evaluator.costs).step_time_s
    for name in BASELINES:
        strategy = baseline_strategy(name, ir, evaluator.cluster, evaluator.costs)
        assert evaluator.evaluate(strategy).step_time_s >= bound


@pytest.mark.parametrize("model", ["small_cnn", "bert_small"])
@pytest.mark.parametrize("cluster_name", ["testbed", "two GPU types"])
def test_no_baechi_placement_beats_model_parallelisms_bound(model: str, cluster_name: str) -> None:
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    cluster = load_cluster("testbed") if cluster_name == "testbed" else two_gpus("V100-32GB", "T4")
    evaluator = Evaluator(ir, cluster)
    costs = evaluator.costs
    bound = model_parallel_bound_s(ir, cluster, costs)
    # no op split: at least the critical path of split ops, at most every op in turn on
    # the fastest type
    fastest = np.min(
        [costs.op_times(t, ir.batch_size).seconds for t in set(cluster.device_type.tolist())],
        axis=0,
    )
    assert lower_bound(ir, cluster, costs).critical_path_s <= bound <= fastest.sum() * (1 + 1e-9)
    for placer in (m_topo, m_etf, m_sct):
        assert evaluator.evaluate(placer(ir, cluster, costs)).step_time_s >= bound
