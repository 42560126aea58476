"""GraphDef compile at allocation scale: from a resolved strategy to the bytes of
``distributed.pb`` (what a plan's last phase hands the job), for the zoo's large models
under DP-NCCL and DP-PS on clusters of 16 to 64 GPUs.

Each compile is timed after one warm-up (median of ``--runs``), with the node count of
the graph and the time per node. ``--json`` writes the rows for a later run to print
beside its own (``--before``): the figures of other code, measured in the same session.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bench.report import (
    add_comparison_arguments,
    before_cells,
    before_note,
    kept_for_later,
    rows_before,
    write_table,
)
from tagplan.planner.compile.graphdef import compile_graphdef
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.strategy import resolve
from tagplan.planner.topology import load_cluster

MODELS = ["resnet101", "transformer", "bert_large"]
CLUSTERS = ["testbed", "cloud", "scale:64"]
STRATEGIES = ["dp-nccl", "dp-ps"]


def measure(model: str, cluster_name: str, strategy: str, runs: int) -> dict:
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    cluster = load_cluster(cluster_name)
    costs = OpCostModel(ir, cluster)
    resolved = resolve(baseline_strategy(strategy, ir, cluster, costs), ir, cluster)
    seconds, size = [], 0
    for _ in range(runs + 1):
        started = time.perf_counter()
        distributed = compile_graphdef(source.graph_def, ir, cluster, resolved)
        size = len(distributed.graph_def_bytes)
        seconds.append(time.perf_counter() - started)
    nodes = len(distributed.graph_def.node)
    return {
        "case": f"{model} {cluster_name} {strategy}",
        "gpus": cluster.num_devices,
        "nodes": nodes,
        "mib": size / 2**20,
        "s": statistics.median(seconds[1:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--clusters", nargs="*", default=CLUSTERS)
    parser.add_argument("--strategies", nargs="*", default=STRATEGIES)
    parser.add_argument("--runs", type=int, default=3)
    add_comparison_arguments(parser)
    args = parser.parse_args()

    before = rows_before(args)
    rows = []
    label = args.before_label
    lines = [
        "| model | cluster | strategy | GPUs | nodes | MiB | seconds | µs per node "
        + (f"| {label} (s) | speed-up |" if before else "|"),
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: "
        + ("| ---: | ---: |" if before else "|"),
    ]
    for model in args.models:
        for cluster in args.clusters:
            for strategy in args.strategies:
                row = measure(model, cluster, strategy, args.runs)
                rows.append(row)
                line = (
                    f"| {model} | {cluster} | {strategy} | {row['gpus']} | {row['nodes']:,} "
                    f"| {row['mib']:.1f} | {row['s']:.2f} | {row['s'] / row['nodes'] * 1e6:.1f} |"
                )
                line += before_cells(before.get(row["case"]), "s", row["s"], 2)
                lines.append(line)
                print(line, flush=True)
    if kept_for_later(args, rows):
        return
    compared = before_note(args, before) + (" The graphs are byte-identical." if before else "")
    write_table(
        "graphdef-compile",
        "GraphDef compile at scale",
        "bench.graphdef_compile",
        "Seconds from a resolved strategy to the bytes of `distributed.pb` "
        f"(`compile_graphdef`, median of {args.runs} after a warm-up), one core; zoo batch "
        f"sizes.{compared}",
        lines,
    )


if __name__ == "__main__":
    main()
