"""Compiling by symmetry class against per GPU on random mixed strategies: how many
compile by class, and whether any simulates otherwise.

For each model and cluster, ``--mixes`` strategies of six op groups, each group an
action drawn at random from the search's candidates (seeded), are evaluated per GPU (the
reference) and by class with every share of instances worth it (as the equivalence tests
do), by two evaluators of the same cost model (neither finds what the other compiled),
alternating. A strategy *differs* when the step (relative 1e-9), any GPU's peak
memory, the OOM verdict or any GPU's busy time is not the reference's. Where a rule
singles out a member of a class, the compile splits that class and tries again; what no
class survives is compiled per GPU on both sides (docs/design.md §5).

``--json`` writes the rows for a later run of other code to print beside its own
(``--before``: its strategies by class and those that differ).
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

import numpy as np

from bench.report import (
    add_comparison_arguments,
    before_note,
    kept_for_later,
    rows_before,
    write_table,
)
from tagplan.planner.compile import task_compiler
from tagplan.planner.errors import PlannerError
from tagplan.planner.evaluate import Evaluation, Evaluator, warm_up
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.actions import ActionSpace
from tagplan.planner.search.grouping import cluster_mean_op_time_s, group_ops
from tagplan.planner.search.mcts import StrategySearch
from tagplan.planner.topology import load_cluster

MODELS = ["mlp", "small_cnn", "tiny_wide_deep", "tiny_lstm"]
CLUSTERS = ["testbed", "scale:32", "random:4", "random:9"]
_GROUPS = 6


def _differs(reference: Evaluation, by_class: Evaluation) -> bool:
    a, b = reference.result, by_class.result
    return not (
        abs(a.step_time_s - b.step_time_s) <= 1e-9 * a.step_time_s
        and np.array_equal(a.peak_memory_bytes, b.peak_memory_bytes)
        and a.oom == b.oom
        and np.allclose(a.device_busy_s, b.device_busy_s, rtol=1e-9, atol=1e-15)
    )


def measure(model: str, cluster_name: str, mixes: int, seed: int) -> dict:
    """The counts and seconds of ``mixes`` random strategies of ``model`` on the cluster."""
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    evaluator = Evaluator(ir, load_cluster(cluster_name))
    costs, cluster = evaluator.costs, evaluator.cluster
    per_gpu = Evaluator(ir, cluster, costs=costs, comm=evaluator.comm, by_class=False)
    space = ActionSpace(ir, cluster, costs)
    grouping = group_ops(ir, cluster_mean_op_time_s(ir, cluster, costs), max_groups=_GROUPS)
    search = StrategySearch(evaluator, grouping, space, reference_step_s=1.0)
    rng = np.random.default_rng(seed)
    counts = {"evaluated": 0, "by_class": 0, "differ": 0}
    seconds = {"per_gpu_s": 0.0, "by_class_s": 0.0}
    with mock.patch.object(task_compiler, "_CLASSES_WORTH_SHARE", 1.0):
        for _ in range(mixes):
            key = rng.integers(len(space.actions), size=grouping.num_groups).tolist()
            strategy = search.strategy_of(tuple(key))
            try:
                started = time.perf_counter()
                reference = per_gpu.evaluate(strategy)
                seconds["per_gpu_s"] += time.perf_counter() - started
                started = time.perf_counter()
                by_class = evaluator.evaluate(strategy)
                seconds["by_class_s"] += time.perf_counter() - started
            except PlannerError:
                continue  # a strategy the planner refuses is simulated by neither
            counts["evaluated"] += 1
            counts["by_class"] += by_class.compiled.symmetry is not None
            counts["differ"] += _differs(reference, by_class)
    return {"case": f"{model} {cluster_name}", **counts, **seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--clusters", nargs="*", default=CLUSTERS)
    parser.add_argument("--mixes", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    add_comparison_arguments(parser)
    args = parser.parse_args()
    before, label = rows_before(args), args.before_label
    warm_up()  # the simulator's kernels loaded before anything is timed
    lines = [
        "| model | cluster | strategies | by class | differ | per GPU (s) | by class (s) "
        + (f"| {label}: by class | {label}: differ |" if before else ""),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if before else ""),
    ]
    rows = []
    for model in args.models:
        for cluster in args.clusters:
            row = measure(model, cluster, args.mixes, args.seed)
            rows.append(row)
            old = before.get(row["case"])
            lines.append(
                f"| {model} | {cluster} | {row['evaluated']} | {row['by_class']} "
                f"| {row['differ']} | {row['per_gpu_s']:.2f} | {row['by_class_s']:.2f} |"
                + (f" {old['by_class']} | {old['differ']} |" if old else "")
            )
            print(lines[-1], flush=True)
    if kept_for_later(args, rows):
        return
    intro = (
        f"{args.mixes} strategies per row, each of the {_GROUPS} op groups an action drawn "
        f"at random (seed {args.seed}) from the search's candidates, evaluated per GPU and by "
        "class with every share of instances worth it; *by class*: those that kept classes "
        "of several GPUs; *differ*: those whose step, peak memory, OOM or busy time per GPU "
        "is not the per-GPU simulation's; seconds summed over the row." + before_note(args, before)
    )
    write_table(
        "class-equivalence",
        "Compiling by class against per GPU on random mixes",
        "bench.class_equivalence",
        intro,
        lines,
    )


if __name__ == "__main__":
    main()
