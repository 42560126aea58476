"""Evaluation cost at allocation scale: one ``Evaluator.evaluate`` per GPU against by
symmetry class, on ``scale:N`` clusters of 16 to 256 GPUs (the search depth it buys:
``bench.search_depth``).

For ResNet-101 and BERT-Large, DP-NCCL and two mixed strategies (the op groups alternating
AllReduce and a parameter server over every GPU, the servers on one GPU or spread), each
evaluation is timed after one warm-up (median of ``--runs``), with the fragments and
crossings the compiler keeps forgotten before each run, and once more by class with them
kept (what the search pays for a strategy it simulated parts of), with the task counts of
both task graphs; both must give the same step time and per-GPU peak memory, or the script
stops. Per-GPU evaluations above ``--per-gpu-max`` GPUs are left out (millions of tasks).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from bench.report import write_section
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.search.grouping import cluster_mean_op_time_s, group_ops
from tagplan.planner.strategy import GroupDecision, OpGroup, Option, Strategy

MODELS = ["resnet101", "bert_large"]
# examples per GPU: the zoo's batches (96 and 16, TAG Table 3) would leave most of a large
# allocation without a replica, so the global batch grows with the GPUs
EXAMPLES_PER_GPU = {"resnet101": 8, "bert_large": 2}
SIZES = [16, 32, 64, 128, 256]


def mixed_strategy(ir, cluster, costs, *, spread_servers: bool) -> Strategy:
    """METIS op groups alternating replicate-allreduce and replicate-ps over every GPU, the
    parameter servers on the first GPU or, ``spread_servers``, each group's on another."""
    grouping = group_ops(ir, cluster_mean_op_time_s(ir, cluster, costs))
    every = list(range(cluster.num_groups))
    first = None if spread_servers else str(cluster.device_names[0])
    groups = []
    for g in range(grouping.num_groups):
        ps = g % 2 == 1
        decision = GroupDecision(
            device_groups=every,
            option=Option.REPLICATE_PS if ps else Option.REPLICATE_ALLREDUCE,
            ps_device=first if ps else None,
        )
        groups.append(OpGroup(ops=[ir.op_names[o] for o in grouping.ops(g)], decision=decision))
    return Strategy(name="mixed", groups=groups)


def timed(evaluator: Evaluator, strategy: Strategy, by_class: bool, runs: int, *, kept: bool):
    """The evaluation and its median seconds, the compiler's parts forgotten before each
    run unless ``kept``."""
    evaluation = evaluator.evaluate(strategy, by_class=by_class)
    seconds = []
    for _ in range(runs):
        if not kept:
            evaluator.compiler.forget_parts()
        started = time.perf_counter()
        evaluator.evaluate(strategy, by_class=by_class)
        seconds.append(time.perf_counter() - started)
    return evaluation, statistics.median(seconds)


def evaluation_rows(models: list[str], sizes: list[int], runs: int, per_gpu_max: int) -> list[str]:
    from tagplan.planner.topology import load_cluster

    lines = []
    for model in models:
        source = load_graph_source(f"zoo:{model}")
        for size in sizes:
            ir = analyze(
                source.graph_def,
                batch_inputs=source.batch_inputs,
                loss=source.loss,
                batch_size=EXAMPLES_PER_GPU[model] * size,
            )
            cluster = load_cluster(f"scale:{size}")
            evaluator = Evaluator(ir, cluster)
            strategies = {
                "dp-nccl": baseline_strategy("dp-nccl", ir, cluster, evaluator.costs),
                "mixed": mixed_strategy(ir, cluster, evaluator.costs, spread_servers=False),
                "mixed, servers spread": mixed_strategy(
                    ir, cluster, evaluator.costs, spread_servers=True
                ),
            }
            for name, strategy in strategies.items():
                by_class, by_class_s = timed(evaluator, strategy, True, runs, kept=False)
                _, kept_s = timed(evaluator, strategy, True, runs, kept=True)
                cells = [
                    model,
                    str(size),
                    f"{ir.batch_size:,}",
                    str(cluster.num_groups),
                    name,
                    f"{by_class.compiled.task_graph.num_tasks:,}",
                ]
                if size <= per_gpu_max:
                    per_gpu, per_gpu_s = timed(evaluator, strategy, False, runs, kept=False)
                    same = np.isclose(per_gpu.step_time_s, by_class.step_time_s, rtol=1e-9)
                    same &= np.array_equal(
                        per_gpu.result.peak_memory_bytes, by_class.result.peak_memory_bytes
                    )
                    if not same:
                        raise SystemExit(f"{model} {name} on {size} GPUs: the compiles disagree")
                    cells[5:5] = [f"{per_gpu.compiled.task_graph.num_tasks:,}"]
                    cells += [
                        f"{per_gpu_s:.3f}",
                        f"{by_class_s:.3f}",
                        f"{per_gpu_s / by_class_s:.1f}x",
                    ]
                else:
                    cells[5:5] = ["—"]
                    cells += ["—", f"{by_class_s:.3f}", "—"]
                cells.append(f"{kept_s:.3f}")
                cells.append("by class" if by_class.compiled.symmetry is not None else "per GPU")
                cells.append(f"{by_class.step_time_s * 1e3:,.1f}")
                lines.append("| " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--sizes", nargs="*", type=int, default=SIZES)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--per-gpu-max", type=int, default=128)
    args = parser.parse_args()
    evaluations = evaluation_rows(args.models, args.sizes, args.runs, args.per_gpu_max)
    body = "\n".join(
        [
            "One `Evaluator.evaluate` (resolve + compile + simulate) per GPU and by symmetry "
            "class on `scale:N` (machines of 8 GPUs) at a global batch of "
            f"{EXAMPLES_PER_GPU['resnet101']} (ResNet-101) and {EXAMPLES_PER_GPU['bert_large']} "
            f"(BERT-Large) examples per GPU, median of {args.runs} after a warm-up, the "
            "fragments and crossings the compiler keeps forgotten before each run (docs/"
            "design.md §5); *by class, parts kept*: the same evaluation with them kept, what "
            "the search pays for a strategy whose every op group it placed so before; both "
            "compiles give the same step and per-GPU peak memory (checked). *mixed*: the "
            "op groups alternate AllReduce and a parameter server over every GPU, the servers "
            "on the first GPU; *servers spread*: each group's server on another GPU (TAG's "
            "round robin), which leaves no two GPUs alike. *compiled*: how the by-class "
            "evaluation ran (per GPU when a rule singles out one GPU of a class). Per-GPU "
            f"evaluations above {args.per_gpu_max} GPUs are left out.",
            "",
            "| model | GPUs | batch | device groups | strategy | tasks per GPU | tasks by class "
            "| per GPU (s) | by class (s) | speedup | by class, parts kept (s) | compiled "
            "| step (ms) |",
            "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- "
            "| ---: |",
            *evaluations,
            "",
            "Time grows with the classes (about two per device group under data "
            "parallelism), not with the GPUs; a strategy that puts a parameter server on "
            "every GPU leaves no two alike and costs what it cost per GPU.",
        ]
    )
    write_section(
        "evaluate-scale",
        "Evaluation cost at allocation scale",
        "python -m bench.evaluate_scale",
        body,
    )


if __name__ == "__main__":
    main()
