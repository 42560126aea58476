"""planner.plan(): phases, budgets, determinism, root-parallel shards, the choice against
the baselines, infeasible inputs, and proof by execution of the returned plan."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import pytest

from tagplan.planner import plan as plan_module
from tagplan.planner.budget import Deadline
from tagplan.planner.errors import Cancelled, Infeasible, InvalidInput
from tagplan.planner.forked import can_fork
from tagplan.planner.plan import PHASES, Planner, PlanOptions, SearchOutcome, plan
from tagplan.planner.search.baselines import DATA_PARALLEL_BASELINES
from tagplan.planner.topology import load_cluster
from tests.planner.clusters import gpus
from tests.planner.verify.own_process import verify_many_apart
from tests.planner.zoo_graphs import zoo_ir, zoo_source


def test_a_plan_is_never_slower_than_a_baseline_and_reports_everything() -> None:
    source, ir = zoo_source("vgg19"), zoo_ir("vgg19")
    phases: list[str] = []
    result = plan(
        ir,
        load_cluster("testbed"),
        graph_def=source.graph_def,
        options=PlanOptions(iterations=30, budget_s=600, every_baseline=True),
        progress=lambda p: phases.append(p.phase),
    )
    assert not result.evaluation.result.oom
    fitting = [s for s in result.baselines.values() if s is not None]
    assert set(result.baselines) >= {"dp-nccl", "dp-nccl-p", "horovod", "m-topo", "m-etf"}
    assert result.step_time_s <= min(fitting)
    assert result.speedup_vs_dp_nccl == pytest.approx(
        result.baselines["dp-nccl"] / result.step_time_s
    )
    data_parallel = {n: s for n, s in result.baselines.items() if n in DATA_PARALLEL_BASELINES}
    best = min((s, n) for n, s in data_parallel.items() if s is not None)
    assert result.best_data_parallel == (best[1], best[0])
    assert result.speedup_vs_best_data_parallel == pytest.approx(best[0] / result.step_time_s)
    assert "the best data-parallel baseline" in result.report_markdown()
    assert 0 < result.lower_bound_s <= result.step_time_s
    assert result.comm_bound_s is not None and result.comm_bound_s >= result.lower_bound_s
    if result.chosen_from == "search":  # a strategy of the search's actions
        assert result.comm_bound_s <= result.step_time_s
    assert result.iterations == 30
    # phases in order, each reported
    order = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    assert order == [p for p in PHASES if p != "analyze"]
    summary = json.loads(json.dumps(result.summary()))
    assert summary["peak_memory_bytes"] == result.peak_memory_bytes
    assert summary["estimated"]["communication"] == "analytic"
    assert result.distributed is not None
    assert len(result.distributed.graph_def.node) > len(source.graph_def.node)
    trace = result.chrome_trace()
    assert trace["traceEvents"]
    report = result.report_markdown()
    assert "| dp-nccl |" in report and "lower bound" in report


def test_a_baseline_bounded_above_the_best_one_is_not_simulated() -> None:
    ir, cluster = zoo_ir("bert_small"), load_cluster("testbed")
    options = PlanOptions(iterations=5, budget_s=600, sfb=False)
    result = plan(ir, cluster, options=options)
    everything = plan(ir, cluster, options=replace(options, every_baseline=True))
    ruled_out = set(everything.baselines) - set(result.baselines)
    assert ruled_out >= {"m-topo", "m-etf", "m-sct"}  # model parallelism of a deep chain
    note = result.phases["baselines"]["note"]
    assert all(name in note for name in ruled_out) and "critical path" in note
    # the bound kept its word: none of them would have been the plan
    best = min(s for s in result.baselines.values() if s is not None)
    assert all(
        everything.baselines[n] is None or everything.baselines[n] >= best for n in ruled_out
    )
    assert result.strategy == everything.strategy and result.step_time_s == everything.step_time_s


def test_a_seed_gives_the_same_plan_and_shards_merge() -> None:
    ir = zoo_ir("mlp")
    cluster = load_cluster("testbed")
    options = PlanOptions(iterations=15, budget_s=600, seed=4, sfb=False)
    a, b = plan(ir, cluster, options=options), plan(ir, cluster, options=options)
    assert a.strategy == b.strategy and a.step_time_s == b.step_time_s
    # shards spread over workers: the same trees run one by one, merged by best result
    planner = Planner(ir, cluster, options=options)
    outcomes = [
        SearchOutcome.from_dict(json.loads(json.dumps(planner.search_shard(seed).to_dict())))
        for seed in (4, 5)
    ]
    merged = planner.finish(outcomes)
    assert merged.iterations == 30
    assert merged.step_time_s <= a.step_time_s
    together = plan(
        ir, cluster, options=PlanOptions(iterations=15, budget_s=600, seed=4, sfb=False, shards=2)
    )
    assert together.step_time_s == merged.step_time_s


@pytest.mark.skipif(not can_fork(), reason="needs the fork start method")
def test_trees_in_processes_of_their_own_find_what_they_find_taking_turns() -> None:
    ir, cluster = zoo_ir("mlp"), load_cluster("testbed")
    options = PlanOptions(iterations=15, budget_s=600, seed=4, sfb=False, shards=2)
    in_turn = plan(ir, cluster, options=options)
    searched: list[int] = []

    def progress(p) -> None:
        if p.phase == "search":
            searched.append(p.iterations)

    at_once = plan(ir, cluster, options=options, processes=2, progress=progress)
    assert at_once.strategy == in_turn.strategy and at_once.step_time_s == in_turn.step_time_s
    assert at_once.iterations == in_turn.iterations == 30
    assert at_once.evaluations == in_turn.evaluations
    assert max(searched) == 30  # both trees' iterations, merged in the parent
    assert at_once.phases["search"]["status"] == "done"


@pytest.mark.skipif(not can_fork(), reason="needs the fork start method")
def test_baselines_beside_the_search_score_what_they_score_before_it(monkeypatch) -> None:
    """Where the planner can fork, DP-PS, Baechi's placers and the pipeline are simulated
    in a child while the search runs: the same scores and the same plan as a planner that
    cannot fork and simulates them first, and the phase says so."""
    ir, cluster = zoo_ir("mlp"), load_cluster("testbed")
    options = PlanOptions(iterations=6, budget_s=600, every_baseline=True, sfb=False)
    beside = plan(ir, cluster, options=options)
    monkeypatch.setattr(plan_module, "can_fork", lambda: False)
    first = plan(ir, cluster, options=options)
    assert beside.baselines == first.baselines
    assert {"dp-ps", "m-topo", "m-etf", "m-sct", "pipeline"} <= set(beside.baselines)
    assert beside.strategy == first.strategy and beside.step_time_s == first.step_time_s
    assert "simulated beside the search" in beside.phases["baselines"]["note"]
    assert "beside" not in first.phases["baselines"]["note"]


@pytest.mark.skipif(not can_fork(), reason="needs the fork start method")
def test_cancel_stops_trees_in_processes() -> None:
    seen = []

    def cancel() -> bool:
        return any(p.phase == "search" and p.iterations > 2 for p in seen)

    with pytest.raises(Cancelled):
        plan(
            zoo_ir("mlp"),
            load_cluster("testbed"),
            options=PlanOptions(iterations=100_000, budget_s=600, shards=2, patience=None),
            progress=seen.append,
            cancel=cancel,
            processes=2,
        )


def test_cancel_stops_the_plan() -> None:
    ir = zoo_ir("mlp")
    seen = []

    def cancel() -> bool:
        return len(seen) > 3

    with pytest.raises(Cancelled):
        plan(
            ir,
            load_cluster("testbed"),
            options=PlanOptions(iterations=1000, budget_s=600),
            progress=seen.append,
            cancel=cancel,
        )


def test_bad_options_are_refused() -> None:
    with pytest.raises(InvalidInput, match="budget_s"):
        PlanOptions(budget_s=0)
    with pytest.raises(InvalidInput, match="shards"):
        PlanOptions(shards=0)


def test_a_graph_that_fits_nowhere_is_infeasible_with_its_overflow() -> None:
    ir = zoo_ir("vgg19")
    with pytest.raises(Infeasible, match="even with every op group") as raised:
        plan(ir, gpus("TINY", 1, 2, memory_gib=0.5), options=PlanOptions(iterations=3))
    assert raised.value.overflow_bytes > 0


def test_a_refusal_says_when_the_budget_cut_the_attempt() -> None:
    ir = zoo_ir("vgg19")
    options = PlanOptions(iterations=3)
    passed = Deadline.after(options.budget_s, start_s=time.time() - options.budget_s)
    with pytest.raises(Infeasible, match="until the budget ran out"):
        plan(ir, gpus("TINY", 1, 2, memory_gib=0.5), options=options, deadline=passed)


@pytest.mark.slow
def test_bert_large_where_data_parallelism_runs_out_of_memory_gets_a_plan_that_fits() -> None:
    # batch 48 on four 11 GiB GTX-1080Ti: each replica of DP holds every parameter, its
    # Adam slots and a quarter of the activations, 11.9 GiB
    ir = zoo_ir("bert_large", 48)
    result = plan(
        ir, gpus("GTX-1080Ti", 2, 2), options=PlanOptions(iterations=4, budget_s=600, sfb=False)
    )
    assert result.baselines["dp-nccl"] is None and result.baselines["horovod"] is None
    assert not result.evaluation.result.oom
    assert result.summary()["oom"] is False


@pytest.mark.slow
def test_a_budget_that_skips_the_baselines_that_fit_still_gets_a_plan_that_fits() -> None:
    # The same case with a deadline that has passed when planning starts: DP-NCCL (which
    # always runs) runs out of memory, the other baselines and the search get no time,
    # and moving groups to model parallelism stops at once; DP-PS, whose sharded
    # parameters fit, is tried before refusing
    ir = zoo_ir("bert_large", 48)
    options = PlanOptions(budget_s=2, sfb=False)
    passed = Deadline.after(options.budget_s, start_s=time.time() - options.budget_s)
    result = plan(ir, gpus("GTX-1080Ti", 2, 2), options=options, deadline=passed)
    assert result.baselines["dp-nccl"] is None and "dp-ps" not in result.baselines
    assert result.chosen_from == "dp-ps" and not result.evaluation.result.oom


@pytest.mark.tf
@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp", "small_cnn"])
def test_the_returned_plan_computes_the_single_device_step(model) -> None:
    cluster = gpus("GTX-1080Ti", 2, 1)
    result = plan(zoo_ir(model, 4), cluster, options=PlanOptions(iterations=20))
    # its own process, so TensorFlow's memory goes back when it ends
    (report,) = verify_many_apart(f"zoo:{model}", cluster, [result.strategy], batch_size=4)
    assert report.passed is True, report.summary()


def test_sfb_is_decided_for_the_best_baseline_too() -> None:
    # TAG Table 5's setting: one GTX-1080Ti in each of two machines, batch 4; VGG19's
    # fully connected gradients go faster as sufficient factors than as AllReduce
    from tagplan.planner.evaluate import Evaluator
    from tagplan.planner.search.baselines import baseline_strategy
    from tagplan.planner.search.sfb import apply_sfb

    ir = zoo_ir("vgg19", 4)
    cluster = gpus("GTX-1080Ti", 2, 1, network_gbps=100)
    evaluator = Evaluator(ir, cluster)
    dp = baseline_strategy("dp-nccl", ir, cluster, evaluator.costs)
    with_sfb, _, _ = apply_sfb(dp, ir, cluster, evaluator.costs)
    dp_sfb_s = evaluator.evaluate(with_sfb).step_time_s
    assert dp_sfb_s < evaluator.evaluate(dp).step_time_s
    result = plan(ir, cluster, options=PlanOptions(iterations=3, budget_s=600))
    assert result.step_time_s <= dp_sfb_s * (1 + 1e-9)
    assert any(d.applied for d in result.sfb)
    assert result.strategy.sfb


def test_where_only_a_pipeline_fits_the_plan_is_pipelined() -> None:
    """VGG19 on four GPUs of 3.8 GiB: data parallelism holds every weight and its Adam
    slots on each GPU, model parallelism a whole batch of the first convolutions'
    activations; 1F1B over four stages holds a quarter of the weights and four
    micro-batches of activations. Without pipelines, what fits at all is a mix of
    decisions the refinement of the search reaches, several times slower."""
    ir = zoo_ir("vgg19")
    cluster = gpus("T4", 4, 1, memory_gib=3.8, network_gbps=10)
    try:
        flat_s = plan(ir, cluster, options=PlanOptions(budget_s=60, pipeline=False)).step_time_s
    except Infeasible:
        flat_s = math.inf
    result = plan(ir, cluster, options=PlanOptions(budget_s=60))
    assert result.chosen_from == "search"
    assert not result.evaluation.result.oom
    assert result.strategy.pipeline is not None and len(result.strategy.pipeline.stages) >= 2
    assert result.step_time_s * 2 < flat_s
    assert (
        result.baselines["pipeline"] is None or result.step_time_s <= result.baselines["pipeline"]
    )
