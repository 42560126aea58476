"""Search depth: the iterations a plan's tree search reaches in a fixed budget on large
allocations, per GPU and by symmetry class.

For ResNet-101 and BERT-Large on ``cloud`` (32 GPUs) and ``scale:64``, ``plan()`` at the
zoo's batch with each ``--budgets`` budget and the convergence stop off (the iterations
the budget allows), without the distributed GraphDef (whose compile alone takes seconds
on 64 GPUs: see *GraphDef compile at scale*): with the uniform prior once evaluating per
GPU and once by class, and with the shipped GNN prior (what ``tagplan plan`` searches
with) by class: iterations, the strategies simulated (an iteration that reaches one
simulated before costs a look-up), by class those ruled out by their step bound and those
compiled as one met before, the search's seconds, the plan time and the plan's step.
Each plan runs in a process of its own, so none finds what an earlier one left in
memory; the prior is loaded before the plan starts.

``--json`` writes the rows for a later run of other code to print beside its own
(``--before``: its iterations by class, under each prior, and steps).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from bench.report import (
    add_comparison_arguments,
    before_note,
    kept_for_later,
    rows_before,
    write_table,
)

MODELS = ["resnet101", "bert_large"]
CLUSTERS = ["cloud", "scale:64"]
BUDGETS_S = [10.0, 30.0]

_ONE_PLAN = """
import json, sys
from tagplan.gnn import resolve_prior
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.options import PlanOptions
from tagplan.planner.plan import plan
from tagplan.planner.topology import load_cluster

model, cluster, budget_s, by_class = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
iterations = int(sys.argv[5]) or None
prior, _ = resolve_prior(sys.argv[6])
source = load_graph_source(f"zoo:{model}")
ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
options = PlanOptions(
    budget_s=budget_s, by_class=by_class == "1", patience=None, iterations=iterations
)
result = plan(ir, load_cluster(cluster), options=options, prior=prior)
print(json.dumps({
    "iterations": result.iterations,
    "evaluations": result.evaluations,
    "bounded": getattr(result, "bounded", 0),
    "transposed": getattr(result, "transposed", 0),
    "search_s": result.phases["search"]["seconds"],
    "plan_s": result.plan_time_s,
    "step_ms": result.step_time_s * 1e3,
}))
"""


def one_plan(
    model: str,
    cluster: str,
    budget_s: float,
    by_class: bool,
    iterations: int | None = None,
    prior: str = "uniform",
) -> dict:
    """The figures of one plan, planned in a new process (``iterations``: the search's,
    where the budget does not end it first; ``prior``: ``uniform`` or ``gnn``)."""
    argv = [model, cluster, str(budget_s), "1" if by_class else "0", str(iterations or 0), prior]
    done = subprocess.run([sys.executable, "-c", _ONE_PLAN, *argv], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{model} on {cluster}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cells(figures: dict, bounded: bool = False) -> list[str]:
    return [
        str(figures["iterations"]),
        str(figures["evaluations"]),
        *([str(figures.get("bounded", 0)), str(figures.get("transposed", 0))] if bounded else []),
        f"{figures['search_s']:.1f}",
        f"{figures['plan_s']:.1f}",
        f"{figures['step_ms']:,.1f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--clusters", nargs="*", default=CLUSTERS)
    parser.add_argument("--budgets", nargs="*", type=float, default=BUDGETS_S)
    add_comparison_arguments(parser)
    args = parser.parse_args()
    before, label = rows_before(args), args.before_label
    lines = [
        "| model | cluster | budget (s) | per GPU: iterations | evaluations | search (s) "
        "| plan time (s) | step (ms) | by class: iterations | evaluations | ruled out "
        "| compiled alike | search (s) | plan time (s) | step (ms) | GNN prior: iterations "
        "| evaluations | ruled out | compiled alike | search (s) | plan time (s) | step (ms) |"
        + (
            f" {label}: iterations by class | {label}: step (ms) "
            f"| {label}: GNN prior: iterations | {label}: GNN prior: step (ms) |"
            if before
            else ""
        ),
        "| --- | --- | ---: |" + " ---: |" * 19 + (" ---: |" * 4 if before else ""),
    ]
    rows = []
    for model in args.models:
        for cluster in args.clusters:
            for budget_s in args.budgets:
                per_gpu = one_plan(model, cluster, budget_s, by_class=False)
                by_class = one_plan(model, cluster, budget_s, by_class=True)
                gnn = one_plan(model, cluster, budget_s, by_class=True, prior="gnn")
                case = f"{model} {cluster} {budget_s:g}"
                rows.append({"case": case, "per_gpu": per_gpu, "by_class": by_class, "gnn": gnn})
                cells = [
                    model,
                    cluster,
                    f"{budget_s:g}",
                    *_cells(per_gpu),
                    *_cells(by_class, bounded=True),
                    *_cells(gnn, bounded=True),
                ]
                old = before.get(case)
                if before:
                    for kind in ("by_class", "gnn"):
                        found = old.get(kind) if old else None
                        cells += (
                            [str(found["iterations"]), f"{found['step_ms']:,.1f}"]
                            if found
                            else ["—", "—"]
                        )
                lines.append("| " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
    if kept_for_later(args, rows):
        return
    write_table(
        "search-depth",
        "Search depth at allocation scale",
        "bench.search_depth",
        "`plan()` at the zoo's batch, the convergence stop off, no distributed GraphDef, "
        "each plan in a process of its own: with the uniform prior per GPU and by class, "
        "and with the shipped GNN prior (what `tagplan plan` searches with, loaded before "
        "the plan starts) by class; *search (s)*: the search phase's seconds (the rest of "
        "the plan: the baselines before it, SFB and the final per-GPU simulation after "
        "it); *evaluations*: the strategies simulated (an iteration that reaches one "
        "simulated before costs a look-up); *ruled out*: strategies not simulated because "
        "their step bound was no less than the best step found or the best baseline's; "
        "*compiled alike*: strategies not simulated because one the tree met before "
        "compiles to the same task graph, or to one on twin machines (docs/design.md §7)."
        + before_note(args, before),
        lines,
    )


if __name__ == "__main__":
    main()
