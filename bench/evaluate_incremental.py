"""Evaluations inside the search against cold ones: what the compiler remembers between
neighbouring strategies buys.

For each model and cluster, a walk of ``--steps`` strategies from data parallelism over
every GPU (each op group replicated with AllReduce on every device group), each step
giving one op group another action at random, as the search's neighbouring strategies
differ. Each strategy is evaluated (resolve + compile by class + simulate) twice: by the
evaluator that evaluated the walk so far (*in the search*), and by a new evaluator with
the same cost model (*cold*: nothing remembered). Medians over the walk; both must give
the same step, or the script stops. ``--json`` writes the rows for a later run of other
code to print beside its own (``--before``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from bench.report import (
    add_comparison_arguments,
    before_note,
    kept_for_later,
    measured_lines,
    rows_before,
    write_table,
)
from tagplan.planner.errors import PlannerError
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.actions import ActionSpace
from tagplan.planner.search.grouping import cluster_mean_op_time_s, group_ops
from tagplan.planner.search.mcts import StrategySearch
from tagplan.planner.strategy import Option
from tagplan.planner.topology import load_cluster

MODELS = ["resnet101", "inception_v3", "bert_large"]
CLUSTERS = ["cloud", "scale:64"]


def walk(search: StrategySearch, steps: int, seed: int) -> list[tuple[int, ...]]:
    """Keys from data parallelism over every device group, one op group changed a step."""
    actions = search.space.actions
    every = max(len(a.device_groups) for a in actions)
    start = next(
        i
        for i, a in enumerate(actions)
        if a.option == Option.REPLICATE_ALLREDUCE and len(a.device_groups) == every
    )
    rng = np.random.default_rng(seed)
    key = [start] * search.grouping.num_groups
    keys = [tuple(key)]
    for _ in range(steps):
        key[int(rng.integers(len(key)))] = int(rng.integers(len(actions)))
        keys.append(tuple(key))
    return keys


def search_on(model: str, cluster_name: str) -> StrategySearch:
    """A search over the zoo model's op groups and actions on the named cluster, whose
    evaluator evaluates the walk."""
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    cluster = load_cluster(cluster_name)
    evaluator = Evaluator(ir, cluster)
    costs = evaluator.costs
    grouping = group_ops(ir, cluster_mean_op_time_s(ir, cluster, costs))
    space = ActionSpace(ir, cluster, costs)
    return StrategySearch(evaluator, grouping, space, reference_step_s=1)


def measure(model: str, cluster_name: str, steps: int, seed: int) -> dict:
    search = search_on(model, cluster_name)
    evaluator, grouping = search.evaluator, search.grouping
    ir, cluster, costs = evaluator.ir, evaluator.cluster, evaluator.costs
    warm, cold, tasks = [], [], []
    for key in walk(search, steps, seed):
        strategy = search.strategy_of(key)
        fresh = Evaluator(ir, cluster, costs=costs, comm=evaluator.comm)
        try:
            started = time.perf_counter()
            first = fresh.evaluate(strategy)
            cold.append(time.perf_counter() - started)
            started = time.perf_counter()
            second = evaluator.evaluate(strategy)
            warm.append(time.perf_counter() - started)
        except PlannerError:
            continue  # a strategy the planner refuses costs no evaluation
        if first.step_time_s != second.step_time_s:
            raise SystemExit(f"{model} on {cluster_name}: the two evaluations differ")
        tasks.append(second.compiled.task_graph.num_tasks)
    return {
        "case": f"{model} {cluster_name}",
        "gpus": cluster.num_devices,
        "groups": grouping.num_groups,
        "evaluated": len(warm),
        "tasks": statistics.median(tasks),
        "cold_s": statistics.median(cold),
        "warm_s": statistics.median(warm),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--clusters", nargs="*", default=CLUSTERS)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    add_comparison_arguments(parser)
    args = parser.parse_args()
    before, label = rows_before(args), args.before_label
    lines = [
        "| model | cluster | GPUs | op groups | evaluated | tasks (median) | cold (s) "
        "| in the search (s) | speed-up "
        + (f"| {label}: in the search (s) | over {label} |" if before else "|"),
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        + ("| ---: | ---: |" if before else "|"),
    ]
    rows, measured = measured_lines(
        ((m, c, args.steps, args.seed) for m in args.models for c in args.clusters),
        measure,
        lambda case, row: (
            f"| {case[0]} | {case[1]} | {row['gpus']} | {row['groups']} "
            f"| {row['evaluated']} | {row['tasks']:,.0f} | {row['cold_s']:.3f} "
            f"| {row['warm_s']:.3f} | {row['cold_s'] / row['warm_s']:.2f}x |"
        ),
        before,
        "warm_s",
        3,
    )
    lines += measured
    if kept_for_later(args, rows):
        return
    write_table(
        "evaluate-incremental",
        "Incremental evaluation",
        "bench.evaluate_incremental",
        f"A walk of {args.steps} neighbouring strategies per row (one op group's action "
        "changed a step, from AllReduce over every device group), each evaluated (resolve, "
        "compile by class, simulate) by the evaluator that evaluated the walk so far and by "
        "a new one: medians, one core, zoo batch sizes." + before_note(args, before),
        lines,
    )


if __name__ == "__main__":
    main()
