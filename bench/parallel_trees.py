"""Search depth with the machine's cores: root-parallel trees in processes of their own.

For each model and cluster, ``plan()`` with a ``--budget-s`` budget, the uniform prior,
the convergence stop off (the iterations the budget allows) and no distributed GraphDef,
three ways: one tree; ``--trees`` trees taking turns in one process (each for its share
of the search budget); the same trees at once in ``--trees`` processes forked after the
phases before the search (``plan(processes=...)``). Iterations and evaluations are summed
over the trees.
"""

from __future__ import annotations

import argparse
import os

from bench.report import write_section
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.options import PlanOptions
from tagplan.planner.plan import plan
from tagplan.planner.topology import load_cluster

MODELS = ["resnet101", "bert_large"]
CLUSTERS = ["cloud", "scale:64"]


def cells(result) -> list[str]:
    return [
        str(result.iterations),
        str(result.evaluations),
        f"{result.step_time_s * 1e3:,.1f}",
        f"{result.plan_time_s:.1f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--clusters", nargs="*", default=CLUSTERS)
    parser.add_argument("--budget-s", type=float, default=10.0)
    parser.add_argument("--trees", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    trees = args.trees
    lines = []
    for model in args.models:
        source = load_graph_source(f"zoo:{model}")
        ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
        for name in args.clusters:
            row = [model, name]
            for shards, processes in ((1, 1), (trees, 1), (trees, trees)):
                options = PlanOptions(budget_s=args.budget_s, patience=None, shards=shards)
                result = plan(ir, load_cluster(name), options=options, processes=processes)
                row += cells(result)
            lines.append("| " + " | ".join(row) + " |")
            print(lines[-1], flush=True)
    head = "iterations | evaluations | step (ms) | plan (s)"
    body = "\n".join(
        [
            f"`plan()` at the zoo's batch with a {args.budget_s:.0f} s budget, the uniform "
            "prior, the convergence stop off and no distributed GraphDef: one tree; "
            f"{trees} trees taking turns in one process; the same {trees} trees at once, "
            "each in a process forked after the phases before the search "
            f"(`tagplan plan --processes {trees}`). Iterations and evaluations summed over "
            "the trees; the other trees than the first break ties at random "
            "(docs/design.md §7).",
            "",
            f"| model | cluster | one tree: {head} | {trees} in turn: {head} "
            f"| {trees} at once: {head} |",
            "| --- | --- |" + " ---: |" * 12,
            *lines,
        ]
    )
    command = "python -m bench.parallel_trees"
    if args.trees != (os.cpu_count() or 1):
        command += f" --trees {args.trees}"
    write_section("parallel-trees", "Search trees in processes of their own", command, body)


if __name__ == "__main__":
    main()
