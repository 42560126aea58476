"""Every baseline's simulated step time for the zoo models on ``testbed`` and ``cloud``,
and the wall time of compiling + simulating DP-NCCL of BERT-Large on the testbed."""

from __future__ import annotations

import argparse
import time

from bench.report import write_section
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baselines import BASELINES, baseline_strategy
from tagplan.planner.topology import load_cluster

MODELS = ["vgg19", "resnet101", "inception_v3", "transformer", "bert_small", "bert_large"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--clusters", nargs="*", default=["testbed", "cloud"])
    args = parser.parse_args()
    header = "| model | cluster | " + " | ".join(BASELINES) + " |"
    lines = [header, "|" + " --- |" * 2 + " ---: |" * len(BASELINES)]
    timing = ""
    for model in args.models:
        source = load_graph_source(f"zoo:{model}")
        ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
        for cluster_name in args.clusters:
            evaluator = Evaluator(ir, load_cluster(cluster_name))
            cells = []
            for name in BASELINES:
                start = time.perf_counter()
                evaluation = evaluator.evaluate(
                    baseline_strategy(name, ir, evaluator.cluster, evaluator.costs)
                )
                wall = time.perf_counter() - start
                result = evaluation.result
                cells.append("OOM" if result.oom else f"{result.step_time_s * 1e3:,.1f}")
                if (model, cluster_name, name) == ("bert_large", "testbed", "dp-nccl"):
                    timing = (
                        f"Compile + simulate DP-NCCL of BERT-Large on the 16-GPU testbed: "
                        f"{wall:.1f} s wall ({evaluation.compiled.task_graph.num_tasks:,} tasks)."
                    )
            lines.append(f"| {model} | {cluster_name} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    body = "\n".join(
        [
            "Simulated step time in ms at the TAG Table 3 batch sizes; estimates from the "
            "analytic cost model (no GPU profiles), OOM when a GPU's peak memory exceeds "
            "its capacity.",
            "",
            *lines,
            "",
            timing,
        ]
    )
    write_section(
        "baselines",
        "Baseline step times",
        "python -m bench.baselines --models " + " ".join(args.models),
        body,
    )


if __name__ == "__main__":
    main()
