"""Parameter servers under many-to-many traffic: Inception-v3's ``dp-ps`` at batch 4096 on
8 machines of 8 P100 (80 Gbit/s inside a machine, 10 Gbit/s between machines), as the
shared-link and the exclusive-link simulator see it.

Every machine's network link carries the pushes of the remote workers' gradients to the
parameter shards it holds and the pulls of those parameters back, so the step cannot be
shorter than the busiest link's traffic, nor than one GPU's compute. Reported per link
model: the step, the busiest link's busy time (bytes at full bandwidth), the busiest
GPU's compute, the step over their sum (at most 1.3 is the bar) and over their maximum,
and how busy the 16 network lanes are on average over the step.
"""

from __future__ import annotations

import argparse

import numpy as np

from bench.report import write_section
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baselines import dp_ps
from tagplan.planner.sim.simulate import LINK_MODELS, simulate
from tagplan.planner.sim.taskgraph import TaskGraph
from tagplan.planner.strategy import ResolvedStrategy, resolve
from tagplan.planner.topology import Cluster, load_cluster


def cluster_spec(machines: int, gpus: int) -> dict:
    return {
        "machines": [
            {"name": f"m{i}", "gpus": {"type": "P100", "count": gpus}, "intra_bandwidth_gbps": 80}
            for i in range(machines)
        ],
        "network": {"bandwidth_gbps": 10},
    }


def dp_ps_graph(
    model: str, batch_size: int | None, cluster_source: object
) -> tuple[GraphIR, Cluster, ResolvedStrategy, TaskGraph]:
    """DP-PS of the zoo ``model`` (at ``batch_size``, None for the zoo's) on the cluster
    ``cluster_source`` names, compiled per GPU: the graph, cluster, strategy and tasks."""
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(
        source.graph_def,
        batch_inputs=source.batch_inputs,
        loss=source.loss,
        batch_size=batch_size,
    )
    cluster = load_cluster(cluster_source)
    evaluator = Evaluator(ir, cluster)
    strategy = dp_ps(ir, cluster, evaluator.costs)
    resolved = resolve(strategy, ir, cluster, op_work=evaluator.costs.work.flops)
    return ir, cluster, resolved, evaluator.compiler.compile(resolved).task_graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="inception_v3")
    parser.add_argument("--batch-size", type=int, default=4096)
    args = parser.parse_args()
    ir, cluster, resolved, graph = dp_ps_graph(args.model, args.batch_size, cluster_spec(8, 8))
    shard_bytes = np.zeros(cluster.num_machines)
    np.add.at(
        shard_bytes,
        cluster.device_machine[
            resolved.group_ps_device[resolved.op_group[ir.parameters.variable_op]]
        ],
        ir.parameters.bytes,
    )
    lines = [
        "| link model | step (s) | busiest link (s) | busiest GPU compute (s) "
        "| step / (link + compute) | step / max(link, compute) | network lanes busy |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for link_model in LINK_MODELS:
        result = simulate(
            graph, device_memory_bytes=cluster.device_memory_bytes, link_model=link_model
        )
        link_s, compute_s = float(result.link_busy_s.max()), float(result.device_busy_s.max())
        lanes = np.sort(result.link_busy_s)[::-1][: 2 * cluster.num_machines]
        step_s = result.step_time_s
        lines.append(
            f"| {link_model} | {step_s:.3f} | {link_s:.3f} | {compute_s:.3f} "
            f"| {step_s / (link_s + compute_s):.2f} | {step_s / max(link_s, compute_s):.2f} "
            f"| {lanes.mean() / step_s:.0%} |"
        )
        print(lines[-1], flush=True)
    body = "\n".join(
        [
            f"{args.model} at batch {args.batch_size} (64 workers of {args.batch_size // 64}), "
            f"{graph.num_tasks:,} tasks. Parameter bytes held per machine: "
            f"{shard_bytes.min() / 1e6:.1f} to {shard_bytes.max() / 1e6:.1f} MB "
            f"(largest parameter {ir.parameters.bytes.max() / 1e6:.1f} MB).",
            "",
            *lines,
            "",
            "*network lanes busy*: the 16 busiest links' busy time (the machines' up- and "
            "downlinks) over the step, averaged.",
        ]
    )
    write_section(
        "ps-traffic",
        "Parameter servers under many-to-many traffic",
        "python -m bench.ps_traffic",
        body,
    )


if __name__ == "__main__":
    main()
