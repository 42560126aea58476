"""Plan latency: how long ``tagplan plan`` takes with the default options, and whether a
small budget holds on a large input.

For each zoo model on each cluster, one plan with the default options (60 s budget, the
convergence stop, the shipped GNN prior, the distributed GraphDef compiled, as a
scheduler's job runs it), timed from the moment the plan is asked for: p50 and max of
the plan time, the stop reason and the iterations. Then each budget case (a large model
on a large allocation with a small budget) reports its plan time as a share of its
budget: a budget holds when the plan answers within 10% of it (a GraphDef whose compile
did not fit follows the answer: its seconds after it are reported beside).

``--json`` writes the rows for a later run to print beside its own (``--before``): the
figures of other code or another ``--prior``, measured just before on the same machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from bench.report import add_comparison_arguments, rows_before, write_section
from tagplan.gnn import resolve_prior
from tagplan.planner.budget import Deadline
from tagplan.planner.evaluate import warm_up
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.plan import PlanOptions, plan
from tagplan.planner.search.prior import Prior
from tagplan.planner.topology import load_cluster

MODELS = ["vgg19", "resnet101", "inception_v3", "transformer", "bert_small", "bert_large"]
CLUSTERS = ["testbed", "cloud"]
BUDGET_CASES = [("bert_large", "scale:128", 10.0), ("resnet101", "scale:64", 10.0)]


def _plan(
    model: str, cluster: str, budget_s: float, prior: Prior
) -> tuple[float, object, float | None]:
    """Wall seconds from the request (before reading the graph) to the answer, the
    answer, and the seconds its GraphDef took after it (``None`` when it came with it)."""
    deadline = Deadline.after(budget_s)
    started = time.perf_counter()
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    target = load_cluster(cluster)
    result = plan(
        ir,
        target,
        graph_def=source.graph_def,
        options=PlanOptions(budget_s=budget_s),
        deadline=deadline,
        prior=prior,
    )
    wall_s = time.perf_counter() - started
    if not result.graphdef_deferred:
        return wall_s, result, None
    started = time.perf_counter()
    result.with_graphdef(source.graph_def, ir, target)
    return wall_s, result, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--clusters", nargs="*", default=CLUSTERS)
    parser.add_argument("--budget-s", type=float, default=PlanOptions().budget_s)
    parser.add_argument("--skip-budget-cases", action="store_true")
    parser.add_argument(
        "--prior",
        default="gnn",
        help="the search's prior, named as `tagplan plan --prior` takes it (default: the "
        "shipped checkpoint, what plans and jobs use)",
    )
    add_comparison_arguments(parser)
    args = parser.parse_args()
    warm_up()  # a worker compiles the simulator's kernels before its first job
    prior, prior_note = resolve_prior(args.prior)  # a worker loads it before its first job
    if prior_note:
        print(prior_note, file=sys.stderr)

    before = rows_before(args)
    label = args.before_label
    lines = [
        "| model | cluster | plan time (s) | stop reason | iterations | step (ms) "
        "| margin over best data-parallel "
        + (f"| {label}: plan time (s) | {label}: step (ms) |" if before else "|"),
        "| --- | --- | ---: | --- | ---: | ---: | ---: " + ("| ---: | ---: |" if before else "|"),
    ]
    rows: list[dict] = []
    for model in args.models:
        for cluster in args.clusters:
            wall, result, _ = _plan(model, cluster, args.budget_s, prior)
            case = f"{model} {cluster}"
            rows.append({"case": case, "s": wall, "step_ms": result.step_time_s * 1e3})
            margin = result.speedup_vs_best_data_parallel
            lines.append(
                f"| {model} | {cluster} | {wall:.1f} | {result.stop_reason} | "
                f"{result.iterations} | {result.step_time_s * 1e3:,.1f} | "
                + (f"{margin:.2f}x |" if margin else "n/a |")
            )
            old = before.get(case)
            if old:
                lines[-1] += f" {old['s']:.1f} | {old['step_ms']:,.1f} |"
            print(lines[-1], flush=True)
    walls = [r["s"] for r in rows]
    summary = (
        f"Plan time over {len(walls)} plans: p50 {statistics.median(walls):.1f} s, "
        f"max {max(walls):.1f} s (budget {args.budget_s:.0f} s)."
    )
    if before:
        old_walls = [before[r["case"]]["s"] for r in rows if r["case"] in before]
        summary += (
            f" {label}: p50 {statistics.median(old_walls):.1f} s, max {max(old_walls):.1f} s."
        )
    cases = [
        "| model | cluster | budget (s) | plan time (s) | share of budget | phases not done "
        "| GraphDef after the answer (s) |",
        "| --- | --- | ---: | ---: | ---: | --- | ---: |",
    ]
    if before:
        cases[0] += f" {label}: plan time (s) |"
        cases[1] += " ---: |"
    for model, cluster, budget_s in [] if args.skip_budget_cases else BUDGET_CASES:
        wall, result, graphdef_s = _plan(model, cluster, budget_s, prior)
        case = f"{model} {cluster} budget {budget_s:g}"
        rows.append({"case": case, "s": wall, "step_ms": result.step_time_s * 1e3})
        late = ", ".join(
            f"{name} {p['status']}" for name, p in result.phases.items() if p["status"] != "done"
        )
        cases.append(
            f"| {model} | {cluster} | {budget_s:.0f} | {wall:.1f} | {wall / budget_s:.2f} "
            f"| {late or 'none'} | {'-' if graphdef_s is None else f'{graphdef_s:.1f}'} |"
        )
        old = before.get(case)
        if old:
            cases[-1] += f" {old['s']:.1f} |"
        print(cases[-1], flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
        return
    body = "\n".join(
        [
            "Each plan is timed from the request, before the graph is read, to the answer "
            "with its compiled GraphDef, as a job's steps run it; a GraphDef whose compile "
            "did not fit in the budget follows the answer (its seconds after it in the "
            f"budget table). Search prior: {prior.name}"
            + (" (the shipped checkpoint, as plans and jobs use)." if args.prior == "gnn" else ".")
            + (
                f" *{label}*: the same script with other code or another prior, run just "
                "before on the same machine (`--json`), read back with `--before`."
                if before
                else ""
            ),
            "",
            *lines,
            "",
            summary,
            "",
            *(cases if len(cases) > 2 else []),
        ]
    )
    command = " ".join(["python -m bench.plan_latency", *sys.argv[1:]])
    write_section("plan-latency", "Plan latency", command, body)


if __name__ == "__main__":
    main()
