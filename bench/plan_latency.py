"""Plan latency: how long ``tagplan plan`` takes with the default options, and whether a
small budget holds on a large input.

For each zoo model on each cluster, one plan with the default options (60 s budget, the
convergence stop, the distributed GraphDef compiled, as a scheduler's job runs it), timed
from the moment the plan is asked for: p50 and max of the plan time, the stop reason and
the iterations. Then each budget case (a large model on a large allocation with a small
budget) reports its plan time as a share of its budget: a budget holds when the plan
returns within 10% of it.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.report import write_section
from tagplan.planner.budget import Deadline
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.plan import PlanOptions, plan
from tagplan.planner.topology import load_cluster

MODELS = ["vgg19", "resnet101", "inception_v3", "transformer", "bert_small", "bert_large"]
CLUSTERS = ["testbed", "cloud"]
BUDGET_CASES = [("bert_large", "scale:128", 10.0), ("resnet101", "scale:64", 10.0)]


def _plan(model: str, cluster: str, budget_s: float) -> tuple[float, object]:
    """Wall seconds from the request (before reading the graph) to the result, and it."""
    deadline = Deadline.after(budget_s)
    started = time.perf_counter()
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    result = plan(
        ir,
        load_cluster(cluster),
        graph_def=source.graph_def,
        options=PlanOptions(budget_s=budget_s),
        deadline=deadline,
    )
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--clusters", nargs="*", default=CLUSTERS)
    parser.add_argument("--budget-s", type=float, default=PlanOptions().budget_s)
    parser.add_argument("--skip-budget-cases", action="store_true")
    args = parser.parse_args()

    lines = [
        "| model | cluster | plan time (s) | stop reason | iterations | step (ms) "
        "| margin over best data-parallel |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: |",
    ]
    walls: list[float] = []
    for model in args.models:
        for cluster in args.clusters:
            wall, result = _plan(model, cluster, args.budget_s)
            walls.append(wall)
            margin = result.speedup_vs_best_data_parallel
            lines.append(
                f"| {model} | {cluster} | {wall:.1f} | {result.stop_reason} | "
                f"{result.iterations} | {result.step_time_s * 1e3:,.1f} | "
                + (f"{margin:.2f}x |" if margin else "n/a |")
            )
            print(lines[-1], flush=True)
    summary = (
        f"Plan time over {len(walls)} plans: p50 {statistics.median(walls):.1f} s, "
        f"max {max(walls):.1f} s (budget {args.budget_s:.0f} s)."
    )
    cases = [
        "| model | cluster | budget (s) | plan time (s) | share of budget | phases not done |",
        "| --- | --- | ---: | ---: | ---: | --- |",
    ]
    for model, cluster, budget_s in [] if args.skip_budget_cases else BUDGET_CASES:
        wall, result = _plan(model, cluster, budget_s)
        late = ", ".join(
            f"{name} {p['status']}" for name, p in result.phases.items() if p["status"] != "done"
        )
        cases.append(
            f"| {model} | {cluster} | {budget_s:.0f} | {wall:.1f} | {wall / budget_s:.2f} "
            f"| {late or 'none'} |"
        )
        print(cases[-1], flush=True)
    body = "\n".join(
        [
            "Each plan is timed from the request, before the graph is read, to the result "
            "with its compiled GraphDef, as a job's steps run it.",
            "",
            *lines,
            "",
            summary,
            "",
            *(cases if len(cases) > 2 else []),
        ]
    )
    write_section("plan-latency", "Plan latency", "python -m bench.plan_latency", body)


if __name__ == "__main__":
    main()
