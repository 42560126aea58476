"""The sweep of uniform strategies at the start of a plan's first tree: its order, its
stopping rule, and what it gives a search on a large allocation."""

from __future__ import annotations

import math
import time
from dataclasses import replace

from tagplan.planner.errors import InvalidInput
from tagplan.planner.options import PlanOptions
from tagplan.planner.plan import Planner, plan
from tagplan.planner.report import report_markdown
from tagplan.planner.search.uniform_sweep import UniformSweep, sweep_order
from tagplan.planner.topology import load_cluster
from tests.planner.search.test_mcts import make_search
from tests.planner.zoo_graphs import zoo_ir


def test_actions_come_least_bound_first_while_one_could_still_win() -> None:
    """Order: bound, then the candidate generator's order. The first is always taken; then
    an action is taken while its bound times the smallest step / bound simulated for its
    kind (1 before one) is below the best step; one passed over is not taken later."""
    kinds = {0: "ps", 1: "ar", 2: "ar", 3: "ps", 4: "ar"}
    sweep = UniformSweep({0: 3.0, 1: 1.0, 2: 2.0, 3: 1.0, 4: 2.2}, kinds)
    assert sweep.order == [1, 3, 2, 4, 0]
    assert sweep.next(None) == 1
    sweep.simulated(1, 1.2)  # "ar": step / bound 1.2
    assert sweep.next(1.2) == 3  # "ps" has no ratio yet: 1.0 < 1.2
    sweep.simulated(3, 1.5)  # "ps": 1.5
    assert sweep.next(2.5) == 2  # 2.0 * 1.2 = 2.4 < 2.5
    sweep.simulated(2, 2.3)  # "ar": 1.15, the tightest now
    assert sweep.next(2.3) is None  # 2.2 * 1.15 and 3.0 * 1.5 are no less than 2.3
    assert sweep.next(100.0) is None and sweep.taken == [1, 3, 2]


def test_before_a_simulation_the_bound_alone_decides() -> None:
    """With no ratio of its kind yet a bound is compared as it is: an action whose bound
    is no less than the best step (a baseline's) is not taken. A ratio below 1 (a bound
    above its step) makes the rule looser, not stricter."""
    sweep = UniformSweep({0: 2.0, 1: 1.0})
    assert sweep.next(1.5) == 1
    assert sweep.next(1.5) is None
    looser = UniformSweep({0: 2.0, 1: 1.0})
    looser.next(None)
    looser.simulated(1, 0.5)
    assert looser.next(1.5) == 0  # 2.0 * 0.5 < 1.5


def test_the_order_bounds_within_its_time_and_leaves_out_refused_actions() -> None:
    def bound_s(action: int) -> float:
        if action == 2:
            raise InvalidInput("refused")
        return 10.0 - action

    assert sweep_order(bound_s, 5, math.inf).order == [4, 3, 1, 0]
    assert sweep_order(bound_s, 5, time.perf_counter()).order == []


def test_a_sweeping_tree_starts_with_the_uniform_strategies_in_bound_order() -> None:
    """The tree's first iterations are the uniform strategies the sweep's rule takes,
    replayed here from bounds computed apart from the search: least step bound first,
    while the bound times the tightest step / bound simulated for its replication option
    is below the best step so far. Each is its root edge's first visit, so the tree holds
    them as it holds its own."""
    search = make_search("small_cnn", load_cluster("testbed"))
    search.sweep = True
    met: list[tuple[int, ...]] = []
    meet = search._meet

    def record(key: tuple[int, ...], scored) -> None:
        met.append(key)
        meet(key, scored)

    search._meet = record  # type: ignore[method-assign]
    outcome = search.run(iterations=60)
    groups = search.grouping.num_groups
    bounds = {
        a: search.evaluator.step_bound_s(search.strategy_of((a,) * groups))
        for a in range(len(search.space))
    }
    expected, tightest, best_s = [], {}, math.inf
    for a in sorted(bounds, key=lambda a: (bounds[a], a)):
        option = search.space.actions[a].option
        if expected and bounds[a] * tightest.get(option, 1.0) >= best_s:
            continue
        expected.append(a)
        scored = search._scores[(a,) * groups]
        if not scored.oom:
            best_s = min(best_s, scored.step_time_s)
            ratio = scored.step_time_s / bounds[a]
            tightest[option] = min(tightest.get(option, math.inf), ratio)
    assert 2 <= outcome.swept == len(expected) < 60
    assert expected != sorted(expected)  # not the generator's order
    assert met[: len(expected)] == [(a,) * groups for a in expected]
    assert all(search._root.visits[a] >= 1 for a in expected)


def test_a_plan_sweeps_in_its_first_tree_only() -> None:
    """The first tree (the plan's seed, ties in the generator's order) sweeps; the
    root-parallel trees beside it, which shuffle their ties to search elsewhere, do not."""
    ir = zoo_ir("mlp")
    options = PlanOptions(iterations=12, budget_s=600, seed=4, sfb=False)
    planner = Planner(ir, load_cluster("testbed"), options=options)
    first, other = planner.search_shard(4), planner.search_shard(5)
    assert first.swept >= 1 and other.swept == 0
    result = plan(ir, load_cluster("testbed"), options=replace(options, shards=2))
    assert result.swept == first.swept
    assert f"{first.swept} of them on uniform strategies" in report_markdown(result.summary())


def test_the_tree_takes_the_sweeps_bounds_instead_of_bounding_again() -> None:
    """Every uniform strategy is bounded once, by the sweep: the strategies the tree then
    meets (the swept ones among them) are looked up, not bounded a second time."""
    search = make_search("small_cnn", load_cluster("testbed"))
    search.sweep = True
    bound_s = search.evaluator.step_bound_s
    bounded: list[str] = []

    def once(strategy):
        bounded.append(strategy.model_dump_json())
        return bound_s(strategy)

    search.evaluator.step_bound_s = once  # type: ignore[method-assign]
    outcome = search.run(iterations=60)
    assert outcome.swept >= 2
    assert len(bounded) == len(set(bounded)) > len(search.space)
