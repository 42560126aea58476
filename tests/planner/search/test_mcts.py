"""MCTS (TAG §4.2.2): PUCT selection, inheritance, rewards, determinism, budgets,
cancellation, root-parallel merge and the repair of plans that do not fit."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np
import pytest

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.errors import BudgetExhausted, Cancelled, InvalidInput
from tagplan.planner.evaluate import Evaluator, relabeled
from tagplan.planner.search.actions import Action, ActionSpace
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.search.grouping import group_ops
from tagplan.planner.search.mcts import (
    SearchOutcome,
    StrategySearch,
    _BoundPayoff,
    _Vertex,
    best_outcome,
    make_feasible,
)
from tagplan.planner.search.prior import PriorQuery
from tagplan.planner.strategy import Option
from tagplan.planner.topology import load_cluster
from tests.planner.clusters import gpus
from tests.planner.zoo_graphs import zoo_ir


def make_search(
    model: str, cluster, *, seed: int = 0, prior=None, shuffle_ties: bool = False
) -> StrategySearch:
    ir = zoo_ir(model)
    evaluator = Evaluator(ir, cluster)
    reference = baseline_strategy("dp-nccl", ir, cluster, evaluator.costs)
    catalog = OpCostModel.for_gpu_types(ir)  # V100 times group ops whatever the cluster
    grouping = group_ops(ir, catalog.op_times(catalog.type_of("V100-32GB"), ir.batch_size).seconds)
    space = ActionSpace(ir, cluster, evaluator.costs)
    return StrategySearch(
        evaluator,
        grouping,
        space,
        reference_step_s=evaluator.evaluate(reference).step_time_s,
        seed=seed,
        prior=prior,
        shuffle_ties=shuffle_ties,
    )


def test_puct_prefers_the_higher_score_by_hand() -> None:
    vertex = _Vertex(np.array([0.5, 0.3, 0.2]), np.zeros(3))
    vertex.visits[:] = [3, 1, 0]
    vertex.reward_sum[:] = [3.0, 1.5, 0.0]
    # Q = [1.0, 1.5, mean 1.125]; U = Q + 1.5 * G * sqrt(4) / (1 + N)
    u = [1.0 + 1.5 * 0.5 * 2 / 4, 1.5 + 1.5 * 0.3 * 2 / 2, 1.125 + 1.5 * 0.2 * 2 / 1]
    assert vertex.select(1.5) == int(np.argmax(u)) == 1
    # with a large exploration coefficient the unvisited, well-prior'd edge wins
    assert vertex.select(100.0) == 2


def test_undecided_groups_inherit_the_most_expensive_groups_action() -> None:
    search = make_search("mlp", load_cluster("testbed"))
    first, second = int(search.order[0]), int(search.order[1])
    key = search.complete([7, 3])
    assert key[first] == 7 and key[second] == 3
    assert all(a == 7 for g, a in enumerate(key) if g not in (first, second))


def test_rewards_are_speedups_and_overflow_is_penalized_by_its_size() -> None:
    search = make_search("vgg19", load_cluster("testbed"))
    everywhere = search.space.actions.index(Action(tuple(range(7)), Option.REPLICATE_ALLREDUCE))
    scored = search.score(search.complete([everywhere]))
    assert not scored.oom
    assert scored.reward == pytest.approx(search.reference_step_s / scored.step_time_s)
    tiny = load_cluster(
        {
            "gpu_types": [
                {
                    "name": "TINY",
                    "fp32_tflops": 10,
                    "memory_bandwidth_gb_per_s": 500,
                    "memory_gib": 1,
                }
            ],
            "machines": [
                {"name": "m", "gpus": {"type": "TINY", "count": 2}, "intra_bandwidth_gbps": 100}
            ],
        }
    )
    small = make_search("vgg19", tiny)
    scored = small.score(small.complete([0]))
    assert scored.oom and scored.reward < 0
    overflow = scored.feedback.overflow_bytes
    capacity = tiny.device_memory_bytes[overflow > 0].sum()
    assert scored.reward == pytest.approx(-overflow.sum() / capacity)


def test_a_seed_and_an_iteration_budget_give_the_same_search() -> None:
    cluster = load_cluster("testbed")
    a = make_search("vgg19", cluster, seed=3, shuffle_ties=True).run(iterations=25, budget_s=600)
    b = make_search("vgg19", cluster, seed=3, shuffle_ties=True).run(iterations=25, budget_s=600)
    assert a.actions == b.actions and a.step_time_s == b.step_time_s
    assert a.iterations == 25
    assert SearchOutcome.from_dict(a.to_dict()) == a


def test_ties_follow_the_generator_order_unless_shuffled() -> None:
    cluster = load_cluster("testbed")
    firsts = []
    for seed, shuffle in [(0, False), (1, False), (1, True), (2, True)]:
        search = make_search("mlp", cluster, seed=seed, shuffle_ties=shuffle)
        outcome = search.run(iterations=1, budget_s=600)
        firsts.append(outcome.actions[int(search.order[0])])
    assert firsts[0] == firsts[1] == 0  # "every GPU, replicate with AllReduce" first
    assert len(set(firsts)) > 1


def test_the_search_beats_dp_nccl_on_the_heterogeneous_testbed() -> None:
    search = make_search("vgg19", load_cluster("testbed"))
    outcome = search.run(iterations=60, budget_s=600)
    assert not outcome.oom
    assert outcome.step_time_s < search.reference_step_s
    assert outcome.first_better_iteration is not None
    assert outcome.first_better_iteration <= outcome.iterations
    # the returned strategy simulates to the reported step
    again = search.evaluator.evaluate(outcome.strategy)
    assert again.step_time_s == pytest.approx(outcome.step_time_s)


def test_the_prior_is_asked_once_per_expanded_vertex_with_progress() -> None:
    seen: list[PriorQuery] = []

    class Recording:
        name = "recording"

        def probabilities(self, query: PriorQuery) -> np.ndarray:
            seen.append(query)
            return np.full(len(query.actions), 1.0 / len(query.actions))

    search = make_search("mlp", load_cluster("testbed"), prior=Recording())
    outcome = search.run(iterations=10, budget_s=600)
    assert seen[0].level == 0 and seen[0].feedback is None
    assert all(q.level == len(q.decided) for q in seen)
    # every iteration below the last level expands exactly one vertex
    assert len(seen) == 1 + outcome.iterations
    # below the root each vertex gets a simulation's feedback: a strategy ruled out by its
    # bound lends its parent's or the best strategy's
    assert outcome.bounded > 0
    assert all(q.feedback is not None for q in seen[1:])


def test_the_refinement_moves_one_op_group_round_the_groups_in_the_priors_order() -> None:
    """From an incumbent, every move changes one op group's action: first each group's
    first-ranked action (groups by descending parameter bytes, ties in the tree's decision
    order), then each one's second; the prior ranks each group's actions at the
    incumbent, decided up to that group's level, with the incumbent's feedback;
    strategies already known are left out."""
    asked: list[PriorQuery] = []

    class LastFirst:  # ranks the candidate generator's last action first
        name = "last-first"

        def probabilities(self, query: PriorQuery) -> np.ndarray:
            asked.append(query)
            weights = np.arange(1.0, len(query.actions) + 1)
            return weights / weights.sum()

    search = make_search("mlp", load_cluster("testbed"), prior=LastFirst())
    incumbent = search.complete([0])
    scored = search.score(incumbent)
    known = list(incumbent)
    known[int(search.order[1])] = len(search.space) - 1  # a move the search has met
    search.score(tuple(known))
    groups, actions = search.grouping.num_groups, len(search.space)
    moves = list(search._moves(lambda: incumbent))
    assert len(moves) == groups * (actions - 1) - 1
    changed = [np.flatnonzero(np.array(m) != np.array(incumbent)) for m in moves]
    assert all(len(c) == 1 for c in changed)
    first_round = [
        (int(c[0]), m[int(c[0])])
        for c, m in zip(changed[: groups - 1], moves[: groups - 1], strict=True)
    ]
    params = search.grouping.group_param_bytes
    by_params = sorted(range(groups), key=lambda level: (-params[search.order[level]], level))
    assert len(set(params.tolist())) > 2  # the order is not the tree's
    assert by_params != list(range(groups))
    expected = [int(search.order[level]) for level in by_params if level != 1]
    assert first_round == [(g, actions - 1) for g in expected]
    assert [q.level for q in asked] == by_params
    assert all(q.decided == tuple(incumbent[g] for g in search.order[: q.level]) for q in asked)
    assert all(q.feedback is scored.feedback for q in asked)


def test_the_refinements_window_holds_no_more_moves_than_fit_in_a_tenth_of_the_budget() -> None:
    """Within the long share of the budget, the refinement's window after a gain is as
    long as the iterations before it, but no longer than the moves that fit in a tenth of
    the budget at their mean time (before the first move, the tree's mean simulation),
    and never shorter than half the patience; past the long share it is that least."""
    search = make_search("mlp", load_cluster("testbed"))
    search._simulation_s, search._simulations = 2.0, 10  # 0.2 s a simulation
    assert search._moves_fit(60.0, math.inf, 0) == pytest.approx(30.0)  # 6 s of 0.2 s
    assert search._moves_fit(math.inf, math.inf, 0) == math.inf  # no time budget
    started = time.perf_counter() - 1.0  # 4 moves took a second
    assert 0.1 * 60.0 / search._moves_fit(60.0, started, 4) == pytest.approx(0.25, rel=0.05)
    later = time.perf_counter() + 3600
    # after a gain at counted iteration 200, of a refinement that started at 120
    assert search._window(64, 200, 120, later, moves_fit=math.inf) == 200
    assert search._window(64, 200, 120, later, moves_fit=50.0) == 50.0
    assert search._window(64, 200, 120, later, moves_fit=10.0) == 32  # half the patience
    assert search._window(64, 120, 120, later, moves_fit=math.inf) == 60  # no gain yet
    assert search._window(64, 200, 120, time.perf_counter(), moves_fit=math.inf) == 32
    assert search._window(64, 200, None, later, moves_fit=10.0) == 200  # the tree's


def test_the_refinement_moves_from_the_incumbent_as_it_changes() -> None:
    search = make_search("mlp", load_cluster("testbed"))
    current = [search.complete([0])]
    search.score(current[0])
    moves = search._moves(lambda: current[0])
    first = next(moves)
    search.score(first)
    current[0] = first  # the move was kept
    for move in itertools.islice(moves, 50):
        assert np.count_nonzero(np.array(move) != np.array(first)) == 1


def test_the_refinement_ends_at_a_strategy_no_single_move_improves() -> None:
    """Given a window longer than every move of the answer, the search ends where no
    single-group move steps faster: each was simulated no faster or ruled out."""
    ir = zoo_ir("mlp")
    cluster = load_cluster("testbed")
    evaluator = Evaluator(ir, cluster)
    reference = baseline_strategy("dp-nccl", ir, cluster, evaluator.costs)
    catalog = OpCostModel.for_gpu_types(ir)
    times = catalog.op_times(catalog.type_of("V100-32GB"), ir.batch_size).seconds
    search = StrategySearch(
        evaluator,
        group_ops(ir, times, max_groups=4),
        ActionSpace(ir, cluster, evaluator.costs, max_actions=12),
        reference_step_s=evaluator.evaluate(reference).step_time_s,
    )
    outcome = search.run(iterations=20_000, budget_s=600, patience=100)
    assert outcome.stop_reason == "converged" and outcome.refined > 0
    best = outcome.actions
    for group in range(search.grouping.num_groups):
        for action in range(len(search.space)):
            move = (*best[:group], action, *best[group + 1 :])
            scored = search._scored(move)
            assert scored is not None
            assert scored.bounded or scored.oom or scored.step_time_s >= outcome.step_time_s


def test_visit_targets_are_the_visit_distributions_of_well_visited_vertices() -> None:
    search = make_search("mlp", load_cluster("testbed"), shuffle_ties=True, seed=3)
    assert search.visit_targets(1) == []  # no search has run
    outcome = search.run(iterations=60)
    targets = search.visit_targets(5)
    root_query, root_pi = targets[0]
    # the root saw every iteration; each target is a distribution over the actions
    assert root_query.level == 0 and root_query.decided == ()
    assert np.allclose(root_pi * outcome.iterations, np.round(root_pi * outcome.iterations))
    for query, pi in targets:
        assert pi.shape == (len(search.space),)
        assert pi.sum() == pytest.approx(1.0) and (pi >= 0).all()
        assert query.level == len(query.decided)
        assert query.context is search.context
    # a higher threshold keeps a subset, the same search gives the same list
    assert len(search.visit_targets(20)) <= len(targets)
    again = make_search("mlp", load_cluster("testbed"), shuffle_ties=True, seed=3)
    again.run(iterations=60)
    assert [(q.decided, p.tolist()) for q, p in again.visit_targets(5)] == [
        (q.decided, p.tolist()) for q, p in targets
    ]


def test_cancellation_and_progress() -> None:
    search = make_search("mlp", load_cluster("testbed"))
    calls = []
    with pytest.raises(Cancelled):
        search.run(iterations=100, progress=calls.append, cancel=lambda: len(calls) >= 3)
    assert [p.iterations for p in calls] == [1, 2, 3]
    with pytest.raises(InvalidInput, match="budget"):
        search.run()
    with pytest.raises(BudgetExhausted, match="no search iteration"):
        search.run(budget_s=0.0)


def test_a_simulation_that_would_end_past_the_budget_is_not_started() -> None:
    search = make_search("mlp", load_cluster("testbed"))
    evaluate = search.evaluator.evaluate

    def slow(strategy, **kwargs):  # every new strategy takes a second to simulate
        time.sleep(1.0)
        return evaluate(strategy, **kwargs)

    search.evaluator.evaluate = slow
    outcome = search.run(budget_s=2.5, patience=None)
    # the third simulation would have started at about 2 s and ended at about 3 s
    assert outcome.evaluations == 2 and outcome.stop_reason == "budget"
    assert outcome.elapsed_s < 2.5


@pytest.mark.parametrize(
    ("model", "cluster"),
    [("mlp", "testbed"), ("small_cnn", "cloud"), ("tiny_wide_deep", "random:5")],
)
def test_strategies_that_compile_alike_are_simulated_once(model: str, cluster: str) -> None:
    """A strategy whose compile identity (placement, op groups, collectives, gradient
    synchronization, SFB) is that of one met before takes its score without a
    simulation; simulated after all, each pair has the same step, OOM and task graph, and
    the same peak memory on the GPU at the same place (twin machines traded: the
    runtime feedback taken is this strategy's GPUs'), and the counts say which
    strategies were simulated."""
    search = make_search(model, load_cluster(cluster))
    outcome = search.run(iterations=60)
    known = {**search._scores, **search._bounded}
    pairs = [(key, s.same_as) for key, s in known.items() if s.same_as is not None]
    assert outcome.transposed == len(pairs) > 0
    assert outcome.evaluations + outcome.bounded + outcome.transposed == len(known)
    evaluator = search.evaluator
    for key, same in pairs:
        assert key != same and known[same].same_as is None
        assert known[key].step_time_s == known[same].step_time_s
        a = evaluator.evaluate(search.strategy_of(key))
        b = evaluator.evaluate(search.strategy_of(same))
        assert evaluator.identity(a.strategy) == evaluator.identity(b.strategy)
        assert a.step_time_s == b.step_time_s
        assert a.result.oom == b.result.oom
        moved = relabeled(  # twin machines traded: the GPU at each one's place
            b.result,
            evaluator.twin_map(b.strategy),
            evaluator.twin_map(a.strategy),
            evaluator.cluster,
        )
        np.testing.assert_array_equal(moved.peak_memory_bytes, a.result.peak_memory_bytes)
        if known[key].feedback is not None:  # the feedback it took is its own GPUs'
            feedback = known[key].feedback.peak_memory_bytes
            np.testing.assert_array_equal(feedback, a.result.peak_memory_bytes)
        ga, gb = a.compiled.task_graph, b.compiled.task_graph
        assert ga.num_tasks == gb.num_tasks
        np.testing.assert_array_equal(ga.task_duration_s, gb.task_duration_s)


def test_a_strategy_whose_bound_cannot_win_is_scored_by_its_bound() -> None:
    """Once a strategy fits, one whose step bound is no less than the best step is not
    simulated: simulated after all, each steps no faster than the search's best, which
    is a simulated strategy; the bound is its step, and its reward that of the bound
    scaled by how far above their bounds the tree's bounded-then-simulated strategies
    stepped; the counts say which strategies were simulated."""
    search = make_search("small_cnn", load_cluster("testbed"))
    outcome = search.run(iterations=60)
    own_bounds = {k: b for k, b in search._bounded.items() if b.same_as is None}
    assert outcome.bounded == len(own_bounds) > 0
    assert outcome.evaluations == sum(s.same_as is None for s in search._scores.values())
    assert outcome.iterations == 60 and outcome.actions in search._scores
    ratios = search._step_over_bound
    assert ratios and min(ratios) >= 1 - 1e-9  # every simulated step above its bound
    best_s = outcome.step_time_s
    for key, scored in search._bounded.items():
        assert key not in search._scores
        simulated = search.evaluator.evaluate(search.strategy_of(key)).result
        assert scored.step_time_s <= simulated.step_time_s * (1 + 1e-9)
        assert simulated.oom or simulated.step_time_s >= best_s * (1 - 1e-9)
        estimate_s = search.reference_step_s / scored.reward
        assert scored.step_time_s * (1 - 1e-9) <= estimate_s
        assert estimate_s <= scored.step_time_s * max(ratios) * (1 + 1e-9)
        assert scored.step_time_s >= best_s


def test_a_bar_found_before_the_search_rules_out_what_cannot_beat_it() -> None:
    """``bar_s`` (the baselines' best step) rules out, after the tree's first simulation,
    every strategy whose bound is no less; a ruled-out strategy is never the best. A bar
    nothing beats leaves the first strategy the only one simulated; the step a search
    without a bar ends at rules out more, sooner, than that search's own best did."""
    cluster = load_cluster("testbed")
    unbeatable = make_search("small_cnn", cluster)
    unbeatable.bar_s = 1e-9
    outcome = unbeatable.run(iterations=40)
    assert outcome.evaluations == 1 and outcome.actions in unbeatable._scores
    own_bounds = [b for b in unbeatable._bounded.values() if b.same_as is None]
    assert outcome.iterations == 40 and outcome.bounded == len(own_bounds) > 0
    plain = make_search("small_cnn", cluster)
    plain_outcome = plain.run(iterations=40)
    barred = make_search("small_cnn", cluster)
    barred.bar_s = plain_outcome.step_time_s
    barred_outcome = barred.run(iterations=40)
    assert barred_outcome.bounded > plain_outcome.bounded
    floor_s = min(barred.bar_s, barred_outcome.step_time_s)
    assert all(s.step_time_s >= floor_s for s in barred._bounded.values())
    assert barred_outcome.actions in barred._scores


def test_a_bound_that_seldom_rules_out_is_computed_only_now_and_then() -> None:
    """A bound of 0.1 s that ruled nothing out in 16 tries (chance 1/18) is not worth it
    against a 1 s simulation, only every eighth time; worth it against 2 s; and again
    once it rules strategies out, or once a new best makes it forget."""
    payoff = _BoundPayoff()
    assert payoff.worth(1.0)
    for _ in range(16):
        payoff.record(False, 0.1)
    assert [payoff.worth(1.0) for _ in range(16)] == ([False] * 7 + [True]) * 2
    assert payoff.worth(2.0)
    for _ in range(4):
        payoff.record(True, 0.1)
    assert payoff.worth(1.0)  # chance 5/18
    for _ in range(16):
        payoff.record(False, 0.1)
    assert not payoff.worth(1.0)
    payoff.forget()  # a new best: chance 1/2 again
    assert payoff.worth(1.0)


def test_a_bound_not_worth_computing_still_checks_the_busiest_gpus_compute(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under a time budget, with the whole bound judged not worth its time, a strategy
    is ruled out by its busiest GPU's compute alone when that is no less than the step
    to beat (its bound is then that compute), and left to the simulation otherwise,
    without the whole bound computed either way."""
    search = make_search("small_cnn", load_cluster("testbed"))
    search._timed = True
    monkeypatch.setattr(search._payoff, "worth", lambda simulation_s: False)

    def refused(strategy: object) -> float:
        raise AssertionError("the whole bound was computed")

    monkeypatch.setattr(search.evaluator, "step_bound_s", refused)
    key = search.complete([0])
    compute_s = search.evaluator.compute_bound_s(search.strategy_of(key))
    assert search._ruled_out(key, compute_s * 1.01) is None
    ruled = search._ruled_out(key, compute_s)
    assert ruled is not None and ruled.bounded and ruled.step_time_s == compute_s


def test_root_parallel_merge_takes_the_fastest_plan_that_fits() -> None:
    def outcome(seed: int, step: float, oom: bool, overflow: int = 0) -> SearchOutcome:
        return SearchOutcome(seed, (0,), "{}", step, oom, overflow, 1, 1, 0, None, 0.0)

    merged = best_outcome(
        [outcome(0, 2.0, False), outcome(1, 1.0, True, 5), outcome(2, 1.5, False)]
    )
    assert merged.seed == 2
    assert best_outcome([outcome(0, 1.0, True, 9), outcome(1, 3.0, True, 4)]).seed == 1


def test_more_model_parallelism_until_the_step_fits() -> None:
    ir = zoo_ir("bert_small", 2)
    # two machines of two 1.2 GiB GPUs: replicas hold every parameter and its Adam slots
    # (1.25 GiB with the reserve) and overflow; split over the GPUs the step fits
    cluster = gpus("SMALL", 2, 2, memory_gib=1.2)
    evaluator = Evaluator(ir, cluster)
    grouping = group_ops(
        ir, evaluator.costs.op_times(evaluator.costs.type_of("SMALL"), ir.batch_size).seconds
    )
    space = ActionSpace(ir, cluster, evaluator.costs)
    search = StrategySearch(evaluator, grouping, space, reference_step_s=1.0)
    everywhere = space.actions.index(Action((0, 1), Option.REPLICATE_ALLREDUCE))
    start = search.complete([everywhere])
    assert search.score(start).oom
    key, evaluation = make_feasible(search, start)
    assert not evaluation.result.oom
    spread = space.actions.index(Action((0, 1), Option.MODEL_PARALLEL))
    assert spread in key
    assert math.isfinite(evaluation.step_time_s)
