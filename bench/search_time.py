"""The search's seconds for a fixed number of iterations on large allocations: what one
iteration costs, apart from how far a time budget lets the search go.

For ResNet-101 and BERT-Large on ``scale:64``, ``plan()`` at the zoo's batch with
``--iterations`` iterations and a budget that does not end the search first, the uniform
prior, the convergence stop off, by symmetry class (the default), each plan in a process
of its own, ``--repeats`` times: the iterations, the strategies simulated, those ruled
out by their step bound and those compiled as one met before (the same on every run of
one code: the search is deterministic for its seed), the step, and the median search
seconds. ``--json`` writes the rows for a later run of other code to print beside its
own (``--before``: its median search seconds, and the ratio).
"""

from __future__ import annotations

import argparse
import statistics

from bench.report import (
    add_comparison_arguments,
    before_note,
    kept_for_later,
    measured_lines,
    rows_before,
    write_table,
)
from bench.search_depth import one_plan

MODELS = ["resnet101", "bert_large"]
CLUSTERS = ["scale:64"]
_BUDGET_S = 600.0  # long enough for the iterations on these cases


def measure(model: str, cluster: str, iterations: int, repeats: int) -> dict:
    """The plan's figures, the search seconds as the median of ``repeats`` runs."""
    runs = [one_plan(model, cluster, _BUDGET_S, True, iterations) for _ in range(repeats)]
    first = runs[0]
    return {
        "case": f"{model} {cluster} {iterations}",
        "iterations": first["iterations"],
        "evaluations": first["evaluations"],
        "bounded": first["bounded"],
        "transposed": first.get("transposed", 0),
        "step_ms": first["step_ms"],
        "search_s": statistics.median(r["search_s"] for r in runs),
        "spread_s": [round(r["search_s"], 1) for r in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--clusters", nargs="*", default=CLUSTERS)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=3)
    add_comparison_arguments(parser)
    args = parser.parse_args()
    before, label = rows_before(args), args.before_label
    lines = [
        "| model | cluster | iterations | evaluations | ruled out | compiled alike | step (ms) "
        "| search (s) | runs (s) "
        + (f"| {label}: search (s) | {label} over this |" if before else "|"),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- "
        + ("| ---: | ---: |" if before else "|"),
    ]
    rows, measured = measured_lines(
        ((m, c, args.iterations, args.repeats) for m in args.models for c in args.clusters),
        measure,
        lambda case, row: (
            f"| {case[0]} | {case[1]} | {row['iterations']} "
            f"| {row['evaluations']} | {row['bounded']} | {row['transposed']} "
            f"| {row['step_ms']:,.1f} "
            f"| {row['search_s']:.1f} | {', '.join(map(str, row['spread_s']))} |"
        ),
        before,
        "search_s",
        1,
    )
    lines += measured
    if kept_for_later(args, rows):
        return
    write_table(
        "search-time",
        "Search time at a fixed number of iterations",
        "bench.search_time",
        f"`plan()` with {args.iterations} iterations and a budget that does not end the "
        "search first, the uniform prior, the convergence stop off, by symmetry class, "
        f"each plan in a process of its own, {args.repeats} runs: *search (s)* the median "
        "of the search phase's seconds, *runs (s)* each run's; *ruled out*: strategies "
        "not simulated because their step bound ruled them out; *compiled alike*: "
        "strategies not simulated because one the tree met before compiles to the same "
        "task graph (docs/design.md §7)." + before_note(args, before),
        lines,
    )


if __name__ == "__main__":
    main()
