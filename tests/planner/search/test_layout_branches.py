"""Pipelines as decisions of the search tree: keys, strategies, the root's prior and
values, the bound and time rules that keep a pipeline from being simulated, and what the
layouts leave TAG's own decisions."""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np
import pytest

from tagplan.planner.evaluate import Evaluator
from tagplan.planner.plan import Planner, PlanOptions
from tagplan.planner.search.layout_branches import (
    SYNC_CHOICES,
    LayoutBranches,
    bounded_layouts,
    is_pipelined_key,
)
from tagplan.planner.search.mcts import _Vertex
from tagplan.planner.search.pipeline_stages import device_speed, pipeline_layouts
from tagplan.planner.strategy import Option
from tagplan.planner.topology import Cluster
from tests.planner.clusters import gpus
from tests.planner.zoo_graphs import zoo_ir


def _branches(
    model: str, cluster: Cluster, *, micro_batch_s: float = 0.0, bar_s: float = math.inf
) -> tuple[Evaluator, LayoutBranches]:
    ir = zoo_ir(model)
    evaluator = Evaluator(ir, cluster)
    speed = device_speed(ir, cluster, evaluator.costs)
    bounded = bounded_layouts(
        evaluator, pipeline_layouts(ir, cluster, evaluator.costs), speed, bar_s
    )
    branches = LayoutBranches(
        ir,
        cluster,
        bounded.layouts,
        speed,
        bound_s=bounded.bound_s,
        micro_batch_s=micro_batch_s,
        evaluation_s=0.01,
    )
    return evaluator, branches


def test_a_key_completes_with_first_choices_and_names_its_micro_batches_and_sync() -> None:
    cluster = gpus("V100-16GB", 4, 2)
    evaluator, branches = _branches("small_cnn", cluster, micro_batch_s=0.25)
    four = next(k for k, x in enumerate(branches.layouts) if x.num_stages == 4)
    layout = branches.layouts[four]
    assert branches.level_sizes(four) == (len(layout.micro_batches), 2, 2, 2, 2)
    assert branches.key(four, []) == (-1 - four, 0, 0, 0, 0, 0)
    key = branches.key(four, [len(layout.micro_batches) - 1, 1, 0, 1])
    assert key == (-1 - four, len(layout.micro_batches) - 1, 1, 0, 1, 0)
    assert is_pipelined_key(key) and not is_pipelined_key((0, 3, 1))
    strategy = branches.strategy(key)
    assert strategy.pipeline is not None
    assert strategy.pipeline.micro_batches == layout.micro_batches[-1]
    stage_options = [
        strategy.groups[stage[0]].decision.option for stage in strategy.pipeline.stages
    ]
    assert stage_options == [SYNC_CHOICES[c] for c in (1, 0, 1, 0)]
    assert stage_options[0] == Option.REPLICATE_PS
    bound_s, cost_s = branches.least(four, key[1:])
    assert cost_s == branches.cost_s(key) == pytest.approx(0.25 * layout.micro_batches[-1])
    assert branches.cost_s((0, 1, 2)) == 0.01  # TAG's strategies: one evaluation
    assert bound_s == pytest.approx(evaluator.compute_bound_s(strategy))
    assert evaluator.evaluate(strategy).step_time_s >= bound_s
    # the whole layout: its least bound and its fewest micro-batches
    assert branches.least(four, []) == (
        min(branches.bound_s[four]),
        pytest.approx(0.25 * layout.micro_batches[0]),
    )


def test_the_root_prior_keeps_tag_decisions_and_favours_the_least_bounded_layout() -> None:
    _, branches = _branches("small_cnn", gpus("V100-16GB", 4, 2))
    prior = branches.root_prior()
    assert len(prior) == 1 + len(branches) and prior.sum() == pytest.approx(1.0)
    assert prior[0] == 0.75
    fewest = [bounds[0] for bounds in branches.bound_s]
    assert int(np.argmax(prior[1:])) == int(np.argmin(fewest))
    # in inverse proportion to the bound at the fewest micro-batches
    assert prior[1] / prior[2] == pytest.approx(fewest[1] / fewest[0])


def test_micro_batch_counts_bounded_at_or_above_the_bar_are_left_out() -> None:
    cluster = gpus("V100-16GB", 4, 2)
    evaluator, everything = _branches("small_cnn", cluster)
    bounds = [b for layout in everything.bound_s for b in layout]
    middle = sorted(bounds)[len(bounds) // 2]
    ir = evaluator.ir
    speed = device_speed(ir, cluster, evaluator.costs)
    layouts = list(pipeline_layouts(ir, cluster, evaluator.costs))
    halved = bounded_layouts(evaluator, layouts, speed, middle)
    assert halved.ruled_out == sum(b >= middle for b in bounds) > 0
    assert all(b < middle for layout in halved.bound_s for b in layout)
    assert sum(len(x.micro_batches) for x in halved.layouts) == sum(b < middle for b in bounds)
    none = bounded_layouts(evaluator, layouts, speed, min(bounds))
    assert none.layouts == [] and none.ruled_out == len(bounds)
    assert halved.complete and halved.cut == len(layouts)
    # past the deadline no layout is cut: the iterator is not even asked
    asked = []
    late = bounded_layouts(
        evaluator, (asked.append(x) or x for x in layouts), speed, math.inf, until=0.0
    )
    assert (late.layouts, late.cut, late.complete, asked) == ([], 0, False, [])


def _planner(model: str, cluster: Cluster, **options) -> Planner:
    return Planner(zoo_ir(model), cluster, options=PlanOptions(sfb=False, **options))


def test_a_branch_of_pipelines_that_cannot_win_or_finish_in_time_is_not_simulated() -> None:
    planner = _planner("small_cnn", gpus("V100-16GB", 4, 2))
    search = planner._search(0)
    layouts = search.layouts
    assert layouts is not None
    flat = search.complete([0])
    scored = search.score(flat)
    layout = min(range(len(layouts)), key=lambda k: layouts.least(k, [])[0])
    bound_s, cost_s = layouts.least(layout, [])
    assert bound_s < scored.step_time_s  # the layouts were bounded by the best baseline
    path = [1 + layout]
    key = layouts.key(layout, [])
    assert not search._not_worth_simulating(path, key, math.inf, flat)
    # a best step at the layout's least bound: none of its pipelines can win
    search._scores[flat] = replace(scored, step_time_s=bound_s)
    assert search._not_worth_simulating(path, key, math.inf, flat)
    # one micro-batch count above the best step, the layout's least below it
    counts = layouts.bound_s[layout]
    if len(counts) > 1 and counts[-1] > counts[0]:
        search._scores[flat] = replace(scored, step_time_s=counts[-1])
        assert search._not_worth_simulating([*path, len(counts) - 1], key, math.inf, flat)
        assert not search._not_worth_simulating(path, key, math.inf, flat)
    search._scores[flat] = scored
    assert search._not_worth_simulating(path, key, time.perf_counter() + cost_s / 2, flat)
    assert not search._not_worth_simulating(path, key, time.perf_counter() + 60 + cost_s, flat)


def test_pipelines_too_slow_to_simulate_close_their_edges_and_are_never_simulated() -> None:
    planner = _planner("small_cnn", gpus("V100-16GB", 4, 2))
    search = planner._search(0)
    search.layouts.micro_batch_s = 1e3  # no pipeline can be simulated in the budget
    search.layouts.cut_s = 0.0  # nor held back by the share
    outcome = search.run(budget_s=3.0)
    assert not any(is_pipelined_key(k) for k in search._scores)
    root = search._root
    tried = root.visits[1:] > 0
    assert root.closed[1:].all() and not root.closed[0]
    assert not tried.any()  # closing is not a visit
    assert not outcome.pipelined


def test_layouts_leave_tag_decisions_as_a_tree_without_them_searches_them() -> None:
    """With deterministic ties, TAG's decisions see the same iterations in the same order
    with or without the layouts beside them, and the convergence window counts them only:
    the layouts cost the search time, never a strategy it would have found."""
    cluster = gpus("V100-16GB", 4, 2)
    without = _planner("small_cnn", cluster, pipeline=False)._search(0)
    alone = without.run(iterations=400, patience=20)
    planner = _planner("small_cnn", cluster)
    search = planner._search(0)
    search.layouts.cut_s = 0.0  # the share as a ratio of fixed estimates only
    mixed = search.run(iterations=400 + len(search.layouts) * 50, patience=20)
    flat_keys = [k for k in search._scores if not is_pipelined_key(k)]
    assert flat_keys == list(without._scores)
    assert any(is_pipelined_key(k) for k in search._scores)
    assert alone.stop_reason == mixed.stop_reason == "converged"
    assert mixed.step_time_s <= alone.step_time_s
    best_flat = min(flat_keys, key=lambda k: search._scores[k].step_time_s)
    assert search._scores[best_flat].step_time_s == alone.step_time_s


def test_the_layout_root_values_an_edge_by_its_best_reward_on_the_best_scale() -> None:
    vertex = _Vertex(np.array([0.75, 0.25]), np.zeros(2), by_best=True)
    vertex.visits[:] = [9, 0]
    vertex.best[:] = [4.0, -np.inf]
    vertex.reward_sum[:] = [9 * 0.5, 0.0]  # a poor mean: the best decides
    # U = best / 4 + 1.5 G sqrt(9) / (1 + N); the unvisited layout scores as the reference
    u = [1.0 + 1.5 * 0.75 * 3 / 10, 1.0 / 4 + 1.5 * 0.25 * 3 / 1]
    assert vertex.select(1.5) == int(np.argmax(u)) == 1
    vertex.visits[1], vertex.best[1] = 1, 0.5
    assert vertex.select(1.5) == 0


def test_a_tree_whose_strategies_are_all_seen_stops_as_exhausted() -> None:
    """Every strategy of the tree simulated, ruled out by its step bound or compiled as
    one of those; the best is a simulated one, and no ruled-out strategy's bound is below
    it."""
    ir = zoo_ir("mlp")
    cluster = gpus("V100-16GB", 1, 2)  # one device group: four actions
    options = PlanOptions(sfb=False, max_groups=2, pipeline=False)  # TAG's decisions alone
    planner = Planner(ir, cluster, options=options)
    search = planner._search(0)
    assert search.layouts is None and len(search.space) == 4
    groups = search.grouping.num_groups
    outcome = search.run(iterations=10_000)
    assert outcome.stop_reason == "exhausted"
    seen = outcome.evaluations + outcome.bounded + outcome.transposed
    assert seen == len(search.space) ** groups
    assert outcome.step_time_s == min(s.step_time_s for s in search._scores.values())
    assert all(s.step_time_s >= outcome.step_time_s for s in search._bounded.values())


def test_pipelines_get_at_most_a_fifth_of_the_simulation_time_and_the_cut_counts() -> None:
    """Estimated with the job's fixed figures: one pipeline of two micro-batches costs 200
    of TAG's simulations here, so after the first one (allowed with nothing spent) the
    root holds the layouts until TAG's strategies have had four times as long."""
    assert LayoutBranches.may_simulate(0.0, 0.0)
    assert LayoutBranches.may_simulate(1.0, 4.0) and not LayoutBranches.may_simulate(1.01, 4.0)
    planner = _planner("small_cnn", gpus("V100-16GB", 4, 2))
    search = planner._search(0)
    search.layouts.micro_batch_s, search.layouts.evaluation_s = 1.0, 0.01
    search.layouts.cut_s = 0.0
    outcome = search.run(iterations=300)
    assert not outcome.oom
    tag = [k for k in search._scores if not is_pipelined_key(k)]
    pipelined = [k for k in search._scores if is_pipelined_key(k)]
    assert len(pipelined) == 1 and len(tag) * 0.01 < 4 * search.layouts.cost_s(pipelined[0])
    # with the pipelines as cheap as TAG's strategies they take more of the iterations
    cheap = planner._search(0)
    cheap.layouts.micro_batch_s, cheap.layouts.evaluation_s = 0.001, 0.01
    cheap.run(iterations=300)
    assert sum(is_pipelined_key(k) for k in cheap._scores) > 1
    # cutting the layouts counts as the pipelines' time: ten seconds of it hold them all
    cut = planner._search(0)
    cut.layouts.cut_s = 10.0
    cut.run(iterations=300)
    assert not any(is_pipelined_key(k) for k in cut._scores)
