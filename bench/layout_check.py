"""What refining symmetry classes around reads across layouts saves in the search: before
compiling by class, the compiler looks in the quotient placement for split ops reading
rows of a split producer that no class holds as they are, splits the classes that read
or hold them into single GPUs (``refined_for_reads``) and compiles the rest of the
classes once; before, such a strategy was compiled per GPU whole.

The walk of :mod:`bench.evaluate_incremental` (one op group's action changed a step) is
evaluated by two evaluators of the same model, cluster and cost model, alternating
strategy by strategy so that both see the same machine: one as the planner runs, one with
the refinement patched to give up on any read across layouts (per GPU, as before). Both
must give the same step and the same peak memory on every GPU. Totals over ``--rounds``
passes of the walk.
"""

from __future__ import annotations

import argparse
import sys
import time
from unittest import mock

import numpy as np

from bench.evaluate_incremental import CLUSTERS, MODELS, search_on, walk
from bench.report import write_section
from tagplan.planner.compile import task_compiler
from tagplan.planner.compile.symmetry import Symmetry, classes_reading_across_layouts
from tagplan.planner.errors import PlannerError
from tagplan.planner.evaluate import Evaluator


def _given_up(
    symmetry: Symmetry,
    _placement: object,
    producer: np.ndarray,
    reader: np.ndarray,
    **_share: int,
) -> Symmetry | None:
    """No classes where any class reads across layouts: the strategy compiles per GPU
    (and by class otherwise, whatever share of the instances the classes keep)."""
    return None if classes_reading_across_layouts(symmetry, producer, reader) else symmetry


def measure(model: str, cluster_name: str, steps: int, seed: int, rounds: int) -> dict:
    search = search_on(model, cluster_name)
    first = search.evaluator
    ir, cluster, costs, comm = first.ir, first.cluster, first.costs, first.comm
    refined = Evaluator(ir, cluster, costs=costs, comm=comm)
    whole = Evaluator(ir, cluster, costs=costs, comm=comm)
    seconds = {"refined": 0.0, "per_gpu": 0.0}
    counts = {"evaluated": 0, "refined_classes": 0, "still_per_gpu": 0}
    strategies = [search.strategy_of(key) for key in walk(search, steps, seed)]
    for _ in range(rounds):
        for strategy in strategies:
            try:
                started = time.perf_counter()
                classes = refined.evaluate(strategy)
                seconds["refined"] += time.perf_counter() - started
                with mock.patch.object(task_compiler, "refined_for_reads", _given_up):
                    started = time.perf_counter()
                    per_gpu = whole.evaluate(strategy)
                    seconds["per_gpu"] += time.perf_counter() - started
            except PlannerError:
                continue  # a strategy the planner refuses costs no evaluation
            if classes.step_time_s != per_gpu.step_time_s or not np.array_equal(
                classes.result.peak_memory_bytes, per_gpu.result.peak_memory_bytes
            ):
                raise SystemExit(f"{model} on {cluster_name}: the two evaluations differ")
            counts["evaluated"] += 1
            counts["still_per_gpu"] += classes.compiled.symmetry is None
            counts["refined_classes"] += (
                classes.compiled.symmetry is not None and per_gpu.compiled.symmetry is None
            )
    return {"model": model, "cluster": cluster_name, **counts, **seconds}


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
        "| model | cluster | evaluations | by refined classes | still per GPU "
        "| refined (s) | per GPU (s) | saved |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for model in args.models:
        for cluster in args.clusters:
            row = measure(model, cluster, args.steps, args.seed, args.rounds)
            line = (
                f"| {model} | {cluster} | {row['evaluated']} | {row['refined_classes']} "
                f"| {row['still_per_gpu']} | {row['refined']:.2f} | {row['per_gpu']:.2f} "
                f"| {1 - row['refined'] / row['per_gpu']:.0%} |"
            )
            lines.append(line)
            print(line, flush=True)
    body = "\n".join(
        [
            f"The walk of *Incremental evaluation* ({args.steps} steps from AllReduce over "
            f"every device group), {args.rounds} passes, each strategy evaluated in turn by "
            "an evaluator that refines the classes around reads across layouts and by one "
            "that compiles such a strategy per GPU whole; seconds summed over the walk, the "
            "same step and peak memory from both. *by refined classes*: evaluations the "
            "second compiles per GPU and the first by class; *still per GPU*: those with no "
            "class left (or none to begin with), per GPU on both.",
            "",
            *lines,
        ]
    )
    if args.write:
        command = " ".join(["python -m bench.layout_check", *sys.argv[1:]])
        write_section("layout-check", "Classes refined around reads across layouts", command, body)


if __name__ == "__main__":
    main()
