"""Search depth with the machine's cores: root-parallel trees in processes of their own.

For each model and cluster, one planner (grouping, baselines and layouts done with a
generous budget, the uniform prior, the convergence stop off), then its search for
``--search-s`` seconds three ways: one tree; ``--trees`` trees taking turns in this process
(each for its share); the same trees at once, each in a process forked from the planner
(:meth:`~tagplan.planner.plan.Planner.search_shards` with ``processes``, what
``tagplan plan --processes`` runs). The search alone is timed, so the phases before it do
not blur the comparison. Iterations and evaluations are summed over the trees; the best
step is the search's own (before SFB).
"""

from __future__ import annotations

import argparse
import os

from bench.report import write_section
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.options import PlanOptions
from tagplan.planner.plan import Planner
from tagplan.planner.search.mcts import best_outcome
from tagplan.planner.topology import load_cluster

MODELS = ["resnet101", "bert_large"]
CLUSTERS = ["cloud", "scale:64"]


def cells(outcomes) -> list[str]:
    searched = [o for o in outcomes if o.iterations]
    best = best_outcome(searched).step_time_s * 1e3 if searched else float("nan")
    return [
        str(sum(o.iterations for o in outcomes)),
        str(sum(o.evaluations for o in outcomes)),
        f"{best:,.1f}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--clusters", nargs="*", default=CLUSTERS)
    parser.add_argument("--search-s", type=float, default=10.0)
    parser.add_argument("--trees", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    trees, search_s = args.trees, args.search_s
    seeds = list(range(trees))
    lines = []
    for model in args.models:
        source = load_graph_source(f"zoo:{model}")
        ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
        for name in args.clusters:
            options = PlanOptions(budget_s=3600, patience=None, shards=trees)
            planner = Planner(ir, load_cluster(name), options=options)
            row = [model, name]
            for tree_seeds, processes in (([0], 1), (seeds, 1), (seeds, trees)):
                outcomes = planner.search_shards(tree_seeds, processes=processes, budget_s=search_s)
                row += cells(outcomes)
            lines.append("| " + " | ".join(row) + " |")
            print(lines[-1], flush=True)
    head = "iterations | evaluations | best step (ms)"
    body = "\n".join(
        [
            f"The search alone for {search_s:.0f} s, after the phases before it (run once per "
            "row with a generous budget), the uniform prior and the convergence stop off: "
            f"one tree; {trees} trees taking turns in one process; the same {trees} trees "
            "at once, each in a process forked from the planner (`tagplan plan --processes "
            f"{trees}`). Iterations and evaluations summed over the trees; the other trees "
            "than the first break ties at random (docs/design.md §7). The three run in "
            "this order on one planner, whose compiler remembers what strategies share "
            "(about 1.1x, *Incremental evaluation*).",
            "",
            f"| model | cluster | one tree: {head} | {trees} in turn: {head} "
            f"| {trees} at once: {head} |",
            "| --- | --- |" + " ---: |" * 9,
            *lines,
        ]
    )
    command = "python -m bench.parallel_trees"
    if args.trees != (os.cpu_count() or 1):
        command += f" --trees {args.trees}"
    if args.search_s != 10.0:
        command += f" --search-s {args.search_s:g}"
    write_section("parallel-trees", "Search trees in processes of their own", command, body)


if __name__ == "__main__":
    main()
