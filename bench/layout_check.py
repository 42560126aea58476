"""What the check for reads across layouts saves in the search: before compiling by
symmetry class, the compiler looks in the quotient placement for a split op reading rows
of a split producer that no class holds as they are (``reads_across_layouts``), and
compiles such strategies per GPU at once instead of after a partial compile by class that
stops there.

The walk of :mod:`bench.evaluate_incremental` (one op group's action changed a step) is
evaluated by two evaluators of the same model, cluster and cost model, alternating
strategy by strategy so that both see the same machine: one as the planner runs, one with
the check patched to answer no (the compile by class is tried on every strategy with
classes, as before the check). Both must give the same step. Totals over ``--rounds``
passes of the walk.
"""

from __future__ import annotations

import argparse
import sys
import time
from unittest import mock

from bench.evaluate_incremental import CLUSTERS, MODELS, search_on, walk
from bench.report import write_section
from tagplan.planner.compile import task_compiler
from tagplan.planner.errors import PlannerError
from tagplan.planner.evaluate import Evaluator


def measure(model: str, cluster_name: str, steps: int, seed: int, rounds: int) -> dict:
    search = search_on(model, cluster_name)
    first = search.evaluator
    ir, cluster, costs, comm = first.ir, first.cluster, first.costs, first.comm
    checked = Evaluator(ir, cluster, costs=costs, comm=comm)
    unchecked = Evaluator(ir, cluster, costs=costs, comm=comm)
    seconds = {"checked": 0.0, "unchecked": 0.0}
    per_gpu = evaluated = 0
    strategies = [search.strategy_of(key) for key in walk(search, steps, seed)]
    for _ in range(rounds):
        for strategy in strategies:
            try:
                started = time.perf_counter()
                with_check = checked.evaluate(strategy)
                seconds["checked"] += time.perf_counter() - started
                with mock.patch.object(task_compiler, "reads_across_layouts", return_value=False):
                    started = time.perf_counter()
                    without = unchecked.evaluate(strategy)
                    seconds["unchecked"] += time.perf_counter() - started
            except PlannerError:
                continue  # a strategy the planner refuses costs no evaluation
            if with_check.step_time_s != without.step_time_s:
                raise SystemExit(f"{model} on {cluster_name}: the two evaluations differ")
            evaluated += 1
            per_gpu += with_check.compiled.symmetry is None
    return {
        "model": model,
        "cluster": cluster_name,
        "evaluated": evaluated,
        "per_gpu": per_gpu,
        **seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--clusters", nargs="*", default=CLUSTERS)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write", action="store_true", help="write BENCHMARKS.md")
    args = parser.parse_args()
    lines = [
        "| model | cluster | evaluations | compiled per GPU | with the check (s) "
        "| without (s) | saved |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for model in args.models:
        for cluster in args.clusters:
            row = measure(model, cluster, args.steps, args.seed, args.rounds)
            line = (
                f"| {model} | {cluster} | {row['evaluated']} | {row['per_gpu']} "
                f"| {row['checked']:.2f} | {row['unchecked']:.2f} "
                f"| {1 - row['checked'] / row['unchecked']:.0%} |"
            )
            lines.append(line)
            print(line, flush=True)
    body = "\n".join(
        [
            f"The walk of *Incremental evaluation* ({args.steps} steps from AllReduce over "
            f"every device group), {args.rounds} passes, each strategy evaluated in turn by "
            "an evaluator with the check and by one with the check patched to answer no; "
            "seconds summed over the walk. *compiled per GPU*: the evaluations with no "
            "class to compile alike or a read across layouts; both paths compile those per GPU.",
            "",
            *lines,
        ]
    )
    if args.write:
        command = " ".join(["python -m bench.layout_check", *sys.argv[1:]])
        write_section(
            "layout-check", "Reads across layouts, checked before compiling", command, body
        )


if __name__ == "__main__":
    main()
