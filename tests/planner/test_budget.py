"""Budgets that hold: one deadline for every phase, phases that say what they left out,
the search's convergence stop, and the shared work computed once per job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tagplan.planner import plan as plan_module
from tagplan.planner.budget import Deadline, PhaseReport
from tagplan.planner.compile.graphdef import compile_graphdef
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.plan import _FINISH_EVALUATIONS, Planner, PlanOptions, plan
from tagplan.planner.search.layout_branches import is_pipelined_key
from tagplan.planner.search.mcts import SearchOutcome, StrategySearch, _Scored
from tagplan.planner.topology import load_cluster
from tests.planner.zoo_graphs import zoo_ir, zoo_source


def test_a_deadline_is_absolute_and_shares_are_capped_by_what_is_left() -> None:
    deadline = Deadline.after(10.0, start_s=time.time() - 8.0)
    assert deadline.left_s() == pytest.approx(2.0, abs=0.5)
    assert deadline.share_s(0.1) == pytest.approx(1.0)  # 10% of 10 s, less than left
    assert deadline.share_s(0.5) == pytest.approx(deadline.left_s(), abs=0.5)
    assert Deadline.after(1.0, start_s=time.time() - 5.0).share_s(0.5) == 0.0
    report = PhaseReport("truncated", 1.5, "skipped at the budget: m-sct")
    assert PhaseReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report


def test_a_plan_started_past_its_deadline_skips_all_it_may_and_still_answers() -> None:
    """DP-NCCL (the reference) and the final compile always run; every other baseline,
    the search, SFB, the per-GPU timeline and the bound counting communication are skipped,
    and the result says so; memory is still reported for every GPU."""
    ir, cluster = zoo_ir("mlp"), load_cluster("testbed")
    late = Deadline.after(5.0, start_s=time.time() - 60.0)
    result = plan(ir, cluster, options=PlanOptions(budget_s=5.0), deadline=late)
    assert list(result.baselines) == ["dp-nccl"]
    assert result.chosen_from == "dp-nccl"
    assert result.iterations == 0 and result.stop_reason == "skipped"
    phases = result.phases
    assert phases["baselines"]["status"] == "truncated"
    assert "m-sct" in phases["baselines"]["note"]
    assert phases["search"]["status"] == "skipped"
    assert phases["sfb"]["status"] == "skipped"
    assert phases["compile"]["status"] == "truncated"  # DP-NCCL simulated by class only
    assert "first GPU of each symmetry class" in phases["compile"]["note"]
    assert phases["bound"]["status"] == "skipped" and result.comm_bound_s is None
    per_gpu = Evaluator(ir, cluster).evaluate(result.strategy, by_class=False)
    assert result.peak_memory_bytes == {
        str(name): int(peak)
        for name, peak in zip(cluster.device_names, per_gpu.result.peak_memory_bytes, strict=True)
    }
    assert result.plan_time_s >= 60.0  # counted from the deadline's start
    assert "search: skipped" in result.report_markdown()


def test_the_baselines_give_way_to_the_steps_every_plan_runs(monkeypatch) -> None:
    """Past DP-NCCL, a baseline starts only if the finish's simulations (estimated from
    the reference's evaluation) still fit after it: simulations a million evaluations
    long leave the reference alone."""
    monkeypatch.setattr(plan_module, "_FINISH_EVALUATIONS", 10**6)
    options = PlanOptions(budget_s=120.0, pipeline=False)
    planner = Planner(zoo_ir("mlp"), load_cluster("testbed"), options=options)
    assert list(planner.baselines) == ["dp-nccl"]
    assert planner.phases.reports["baselines"].status == "truncated"


@pytest.mark.parametrize("evaluations", [4, 10**6])
def test_time_is_kept_for_a_graphdef_that_fits_and_none_for_one_that_does_not(
    monkeypatch, evaluations
) -> None:
    """The distributed GraphDef's compile is kept time for when it fits in the budget;
    estimated a million evaluations long, it is not (it will follow the answer), and
    the baselines take the time it would have held."""
    monkeypatch.setattr(plan_module, "_GRAPHDEF_EVALUATIONS", evaluations)
    options = PlanOptions(budget_s=120.0, pipeline=False)
    planner = Planner(zoo_ir("mlp"), load_cluster("testbed"), options=options, graphdef=True)
    assert planner.graphdef is (evaluations == 4)
    assert planner.prepared()["graphdef"] is planner.graphdef
    assert len(planner.baselines) > 1
    assert planner.phases.reports["baselines"].status == "done"


def test_a_graphdef_that_does_not_fit_is_left_to_follow_the_answer(monkeypatch) -> None:
    """With the GraphDef's compile estimated past the budget, the plan keeps no time for
    it (the baselines and the search run), answers without it and says so; the GraphDef
    compiled after the answer is the one the chosen strategy compiles to."""
    source, ir = zoo_source("mlp"), zoo_ir("mlp")
    cluster = load_cluster("testbed")
    monkeypatch.setattr(plan_module, "_GRAPHDEF_EVALUATIONS", 10**6)
    options = PlanOptions(budget_s=60.0, iterations=4, pipeline=False)
    result = plan(ir, cluster, graph_def=source.graph_def, options=options)
    assert result.graphdef_deferred and result.distributed is None
    assert result.summary()["graphdef_deferred"] is True
    assert result.phases["compile"]["status"] == "truncated"
    assert "compiled after the answer" in result.phases["compile"]["note"]
    assert result.phases["baselines"]["status"] == "done"
    assert result.iterations == 4
    followed = result.with_graphdef(source.graph_def, ir, cluster)
    assert followed.graphdef_deferred  # it still says how the answer came
    direct = compile_graphdef(source.graph_def, ir, cluster, result.evaluation.resolved)
    assert followed.distributed.graph_def_bytes == direct.graph_def_bytes
    monkeypatch.setattr(plan_module, "_GRAPHDEF_EVALUATIONS", 4)
    kept = plan(ir, cluster, graph_def=source.graph_def, options=options)
    assert not kept.graphdef_deferred and kept.distributed is not None


@pytest.mark.parametrize("evaluations", [0, 10**6])
def test_a_late_plan_compiles_only_a_graphdef_that_adds_a_tenth_of_its_budget(
    monkeypatch, evaluations
) -> None:
    """Past its deadline, a plan still compiles a GraphDef estimated at less than a tenth
    of its budget, and leaves a longer one to follow the answer (the estimate set by the
    per-GPU evaluations it is counted in, not by this machine's speed)."""
    source, ir = zoo_source("mlp"), zoo_ir("mlp")
    monkeypatch.setattr(plan_module, "_GRAPHDEF_EVALUATIONS", evaluations)
    late = Deadline.after(5.0, start_s=time.time() - 60.0)
    options = PlanOptions(budget_s=5.0)
    result = plan(
        ir, load_cluster("testbed"), graph_def=source.graph_def, options=options, deadline=late
    )
    assert result.graphdef_deferred is (evaluations > 0)
    assert (result.distributed is None) is result.graphdef_deferred


_COLD_PLAN = """
import json
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.plan import PlanOptions, plan
from tagplan.planner.topology import load_cluster

source = load_graph_source("zoo:small_cnn")
ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
options = PlanOptions(budget_s=120.0, iterations=3, sfb=False, pipeline=False)
result = plan(ir, load_cluster("testbed"), options=options)
print(json.dumps({"phases": result.phases, "iterations": result.iterations}))
"""


def test_a_cold_simulator_is_not_taken_for_slow_evaluations(tmp_path) -> None:
    """On a fresh install numba builds the simulator's kernels on first use (seconds):
    the planner has them built before it times the reference evaluation, so a first plan
    scores every baseline and searches instead of believing an evaluation costs seconds.
    A process of its own, with an empty kernel cache; the build counts against the budget
    (20-30 s on two cores), which leaves the plan time to spare once it is done."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", _COLD_PLAN], env=env, capture_output=True, text=True, check=True
    )
    assert list(tmp_path.rglob("*.nbi")), "the kernels were not built in the empty cache"
    answer = json.loads(run.stdout.splitlines()[-1])
    assert answer["phases"]["baselines"]["status"] == "done"
    assert answer["phases"]["search"]["status"] == "done" and answer["iterations"] == 3


def test_the_search_gets_the_time_of_a_timeline_over_a_tenth_of_the_budget() -> None:
    """The time after the search is kept for the plan's per-GPU simulation (its timeline)
    while that takes at most a tenth of the budget; a longer one keeps none, and the
    search gets those seconds."""
    options = PlanOptions(budget_s=60.0, sfb=False)
    planner = Planner(zoo_ir("mlp"), load_cluster("testbed"), options=options, graphdef=False)
    planner.deadline = Deadline.after(60.0)
    planner.evaluation_s = 0.5
    planner.per_gpu_factor = 10.0  # a 5 s timeline: kept
    kept = planner.search_budget_s()
    planner.per_gpu_factor = 14.0  # a 7 s timeline: over 6 s, left to the time left over
    searched = planner.search_budget_s()
    assert searched - kept == pytest.approx(5.0, abs=0.1)
    assert searched == pytest.approx(60.0 - _FINISH_EVALUATIONS * 0.5, abs=0.1)


def test_pipelines_are_not_cut_without_time_to_simulate_one() -> None:
    """Cutting a large graph into stages takes seconds: with no time left for a
    simulation of two micro-batches the planner does not cut, and says so."""
    ir, cluster = zoo_ir("small_cnn"), load_cluster("testbed")
    planner = Planner(ir, cluster, options=PlanOptions(budget_s=600.0, sfb=False))
    assert planner.layouts is not None and len(planner.layouts) > 0
    planner.deadline = Deadline.after(2 * planner.evaluation_s * planner.per_gpu_factor)
    assert planner._cut_layouts() is None
    note = planner.phases.reports["search"].note
    assert note.endswith("; pipelines not cut: no time left in the budget")


def _last_improvement(best_s: list[float], upto: int, by: float) -> int:
    """The iteration (1-based) of the last improvement of the best step among the first
    ``upto`` iterations by more than the fraction ``by``."""
    return max(i + 1 for i in range(upto) if i == 0 or best_s[i] < best_s[i - 1] * (1 - by))


def test_the_search_stops_once_it_has_converged() -> None:
    """With patience p the tree converges when its best, found at iteration i, has not
    been beaten for max(p, i) iterations, an iteration its step bound ruled out counting
    a quarter; the refinement then moves the best one op group at a time and stops by a
    window restarted where it starts and at each move 0.2% faster, as long as the
    iterations before the last gain and holding at least half the patience (within the
    first quarter of the budget, which this search never leaves, and far more moves than
    this search makes fit in a tenth of it); the same seed under an iteration cap it does
    not reach stops at the same place (bounded by time alone, a search weighs its step
    bounds by their time, which differs from run to run)."""

    def search(max_groups: int = 8) -> StrategySearch:
        options = PlanOptions(sfb=False, max_groups=max_groups)
        return Planner(zoo_ir("mlp"), load_cluster("testbed"), options=options)._search(0)

    def watched_run(
        patience: int, max_groups: int = 8
    ) -> tuple[SearchOutcome, list[float], list[float]]:
        """The outcome, what each iteration counted for in the window and the best step
        after each."""
        watched = search(max_groups)
        counted: list[float] = []  # per iteration: a pipeline's counts for nothing
        best_s: list[float] = []
        meet = watched._meet

        def count(key: tuple[int, ...], scored: _Scored) -> None:
            counted.append(0.0 if is_pipelined_key(key) else 0.25 if scored.bounded else 1.0)
            meet(key, scored)

        watched._meet = count
        outcome = watched.run(
            budget_s=600,
            iterations=10_000,
            patience=patience,
            progress=lambda p: best_s.append(p.best_step_time_s),
        )
        assert outcome.stop_reason == "converged" and outcome.iterations < 10_000
        assert len(counted) == len(best_s) == outcome.iterations
        return outcome, counted, best_s

    converged, counted, best_s = watched_run(16)
    assert 0.25 in counted and 1.0 in counted
    again = search().run(budget_s=600, iterations=10_000, patience=16)
    assert again.actions == converged.actions and again.iterations == converged.iterations
    # the tree: its best found at iteration i, it went max(16, i) further
    tree = converged.iterations - converged.refined
    found_at = _last_improvement(best_s, tree, 1e-6)
    window = max(16, sum(counted[:found_at]))
    assert sum(counted[found_at:tree]) >= window > sum(counted[found_at : tree - 1])
    # the refinement, from the tree's best: its window restarts at each move 0.2% faster
    # and is then as long as the iterations before it, and at least half the patience
    improved_at = _last_improvement(best_s, converged.iterations, 2e-3)
    assert improved_at > tree  # the refinement gained
    window = max(8, sum(counted[:improved_at]))
    assert sum(counted[improved_at:]) >= window > sum(counted[improved_at:-1])
    assert converged.step_time_s == best_s[-1] < best_s[tree - 1]  # it found a better one
    longer = search().run(iterations=converged.iterations + 40, budget_s=600)
    assert longer.stop_reason == "iterations"
    # a refinement that gains nothing 0.2% faster stops after half the tree's iterations
    # or half the patience, whichever is longer (here half the tree's iterations: a window
    # as long as the tree's would run twice as many moves)
    converged, counted, best_s = watched_run(24, max_groups=2)
    tree = converged.iterations - converged.refined
    assert _last_improvement(best_s, converged.iterations, 2e-3) <= tree
    window = max(12, sum(counted[:tree]) / 2)
    assert window == sum(counted[:tree]) / 2
    assert sum(counted[tree:]) >= window > sum(counted[tree:-1])


def test_shared_work_is_computed_once_and_handed_on_as_json() -> None:
    """A planner built from another's ``prepared()`` groups, scores, cuts its pipelines
    and searches alike."""
    ir, cluster = zoo_ir("small_cnn"), load_cluster("testbed")
    options = PlanOptions(iterations=12, budget_s=600, sfb=False)
    first = Planner(ir, cluster, options=options)
    prepared = json.loads(json.dumps(first.prepared()))
    second = Planner(ir, cluster, options=options, prepared=prepared)
    assert (second.grouping.op_group == first.grouping.op_group).all()
    assert (second.grouping.group_time_s == first.grouping.group_time_s).all()
    assert second.baselines == first.baselines
    assert second.reference_step_s == first.reference_step_s
    assert first.layouts is not None and second.layouts is not None  # cut once, handed on
    assert second.layouts.bound_s == first.layouts.bound_s
    assert second.layouts.cut_s == first.layouts.cut_s > 0
    for mine, theirs in zip(first.layouts.layouts, second.layouts.layouts, strict=True):
        assert mine.to_dict() == theirs.to_dict()
    older = {k: v for k, v in prepared.items() if not k.startswith("layout")}
    assert Planner(ir, cluster, options=options, prepared=older).layouts is None
    first_phases, second_phases = first.phases.reports, second.phases.reports
    assert "group" not in second_phases or second_phases["group"] == first_phases["group"]
    a, b = first.search_shard(0), second.search_shard(0)
    assert (a.actions, a.step_time_s) == (b.actions, b.step_time_s)
    result = second.finish([b])
    assert result.phases["baselines"]["status"] == "done"
    assert result.baselines == {
        name: None if s.oom else s.step_time_s for name, s in first.baselines.items()
    }
