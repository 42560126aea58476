"""The step bound beside the simulated step: how close the bound the search checks
before it simulates a strategy comes to the step, and what it rules out.

For each model and cluster: DP-NCCL, DP-NCCL-P and Horovod, and a walk of ``--steps``
neighbouring strategies from data parallelism over every GPU (*Incremental
evaluation*'s walk: one op group's action changed a step), each bounded
(``Evaluator.step_bound_s``, its placement already made) and simulated by class. Per
row: the baselines' step over bound, the walk's median and smallest step over bound,
the bound's median milliseconds, and of the walk's strategies that step no faster than
the best of the three baselines, how many the bound rules out at that step (a search
whose bar is that baseline does not simulate them). ``--json`` writes the rows for a
later run of other code to print beside its own (``--before``).
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.evaluate_incremental import search_on, walk
from bench.report import (
    add_comparison_arguments,
    before_note,
    kept_for_later,
    measured_lines,
    rows_before,
    write_table,
)
from tagplan.planner.errors import PlannerError
from tagplan.planner.search.baselines import baseline_strategy

MODELS = ["resnet101", "inception_v3", "bert_large"]
CLUSTERS = ["cloud", "scale:64"]
BASELINES = ["dp-nccl", "dp-nccl-p", "horovod"]


def measure(model: str, cluster_name: str, steps: int, seed: int) -> dict:
    search = search_on(model, cluster_name)
    evaluator = search.evaluator
    ir, cluster, costs = evaluator.ir, evaluator.cluster, evaluator.costs

    def bounded(strategy) -> tuple[float, float, float]:
        """The strategy's bound, its seconds (after the placement) and its step."""
        evaluator.placed(strategy)
        started = time.perf_counter()
        bound_s = evaluator.step_bound_s(strategy)
        seconds = time.perf_counter() - started
        return bound_s, seconds, evaluator.evaluate(strategy).step_time_s

    baselines = {}
    for name in BASELINES:
        bound_s, _, step_s = bounded(baseline_strategy(name, ir, cluster, costs))
        baselines[name] = (bound_s, step_s)
    bar_s = min(step_s for _, step_s in baselines.values())
    ratios, seconds, beaten, ruled = [], [], 0, 0
    for key in walk(search, steps, seed):
        try:
            bound_s, spent_s, step_s = bounded(search.strategy_of(key))
        except PlannerError:
            continue  # a strategy the planner refuses is neither bounded nor simulated
        ratios.append(step_s / bound_s)
        seconds.append(spent_s)
        beaten += step_s >= bar_s
        ruled += bound_s >= bar_s
    return {
        "case": f"{model} {cluster_name}",
        "gpus": cluster.num_devices,
        "baselines": {n: step_s / bound_s for n, (bound_s, step_s) in baselines.items()},
        "walk": len(ratios),
        "median_ratio": statistics.median(ratios),
        "least_ratio": min(ratios),
        "bound_ms": statistics.median(seconds) * 1e3,
        "slower": beaten,
        "ruled_out": ruled,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--clusters", nargs="*", default=CLUSTERS)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    add_comparison_arguments(parser)
    args = parser.parse_args()
    before, label = rows_before(args), args.before_label
    lines = [
        "| model | cluster | GPUs | step / bound: "
        + " | ".join(BASELINES)
        + " | walk | median | least | bound (ms) | slower than the best baseline "
        "| ruled out "
        + (
            f"| {label}: ruled out | {label}: bound (ms) | {label}: step / bound, median "
            f"| median's fall |"
            if before
            else "|"
        ),
        "| --- | --- | ---: | "
        + " | ".join("---:" for _ in BASELINES)
        + " | ---: | ---: | ---: | ---: | ---: | ---: "
        + ("| ---: | ---: | ---: | ---: |" if before else "|"),
    ]

    def line_of(case: tuple, row: dict) -> str:
        old = before.get(row["case"])
        cells = f" {old['ruled_out']} | {old['bound_ms']:.0f} |" if old else ""
        return (
            f"| {case[0]} | {case[1]} | {row['gpus']} | "
            + " | ".join(f"{row['baselines'][n]:.2f}" for n in BASELINES)
            + f" | {row['walk']} | {row['median_ratio']:.2f} | {row['least_ratio']:.2f} "
            f"| {row['bound_ms']:.0f} | {row['slower']} | {row['ruled_out']} |" + cells
        )

    rows, measured = measured_lines(
        ((m, c, args.steps, args.seed) for m in args.models for c in args.clusters),
        measure,
        line_of,
        before,
        "median_ratio",
        2,
    )
    lines += measured
    if kept_for_later(args, rows):
        return
    write_table(
        "step-bound",
        "The step bound beside the step",
        "bench.step_bound",
        f"Per row: the simulated step over the step bound (`Evaluator.step_bound_s`, "
        f"docs/design.md §7) of DP-NCCL, DP-NCCL-P and Horovod, and of a walk of "
        f"{args.steps} neighbouring strategies from data parallelism over every GPU (one "
        "op group's action changed a step, as *Incremental evaluation* walks): its "
        "median and least, the bound's median milliseconds once the strategy is placed, "
        "and of the walk's strategies that step no faster than the best of the three "
        "baselines, how many the bound rules out at that step (a search whose bar is that "
        "baseline does not simulate them). A bound never exceeds the step: the least "
        "ratio is at least 1." + before_note(args, before),
        lines,
    )


if __name__ == "__main__":
    main()
