"""Pipelines: tagplan with and without pipelined strategies, beside the hand-configured
pipeline baseline and the best baseline that is not a pipeline, on allocations whose
links between machines are slow, on ``cloud``, and on one where nothing fits without a
pipeline. The figure to read is the speed-up of tagplan over the best plan without
pipelines (tagplan's own with ``pipeline=False``, or a baseline)."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

from bench.report import write_section
from tagplan.planner.errors import Infeasible
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.plan import PlanOptions, plan
from tagplan.planner.result import PlanResult
from tagplan.planner.topology import load_cluster

MODELS = ["transformer", "vgg19", "resnet101", "bert_large"]


def _machines(count: int, per_machine: int, kind: str, gbps: float, **gpu_type) -> dict:
    spec: dict = {
        "machines": [
            {
                "name": f"m{i}",
                "gpus": {"type": kind, "count": per_machine},
                "intra_bandwidth_gbps": 96,
            }
            for i in range(count)
        ],
        "network": {"bandwidth_gbps": gbps},
    }
    if gpu_type:
        spec["gpu_types"] = [{"name": kind, **gpu_type}]
    return spec


CLUSTERS = {
    "cloud": "cloud",
    "4x4 V100, 1 Gbps": _machines(4, 4, "V100-16GB", 1),
    "8x2 T4, 1 Gbps": _machines(8, 2, "T4", 1),
}
# four GPUs of 3.8 GiB: neither VGG19's weights and Adam slots on every GPU nor a whole
# batch of its first activations on one fits
TIGHT = _machines(
    4, 1, "T4-3.8GB", 10, fp32_tflops=8.1, memory_bandwidth_gb_per_s=320, memory_gib=3.8
)


def ms(seconds: float | None) -> str:
    return "OOM" if seconds is None else f"{seconds * 1e3:,.1f}"


def _planned(ir, cluster, options: PlanOptions) -> PlanResult | None:
    try:
        return plan(ir, cluster, options=options)
    except Infeasible:
        return None


def row(model: str, name: str, ir, cluster, options: PlanOptions) -> tuple[str, float | None]:
    """A table row and the speed-up over the best plan without pipelines."""
    without = _planned(ir, cluster, replace(options, pipeline=False))
    with_pipelines = _planned(ir, cluster, options)
    reference = with_pipelines or without
    baselines = dict(reference.baselines) if reference else {}
    pipeline_baseline = baselines.pop("pipeline", None)
    fitting = {n: s for n, s in baselines.items() if s is not None}
    best_name = min(fitting, key=fitting.get) if fitting else None
    best_without = min(
        [
            s
            for s in (
                fitting.get(best_name) if best_name else None,
                without.step_time_s if without else None,
            )
            if s is not None
        ],
        default=None,
    )
    speedup = (
        best_without / with_pipelines.step_time_s
        if best_without is not None and with_pipelines is not None
        else None
    )
    note = reference.phases["baselines"]["note"] if reference else ""
    refused = (
        "refused"
        if "pipeline (" in note
        else "skipped"
        if reference is None or "pipeline" not in reference.baselines
        else ms(pipeline_baseline)
    )
    cells = [
        f"{best_name} {ms(fitting[best_name])}" if best_name else "none fits",
        refused,
        ms(without.step_time_s) if without else "infeasible",
        f"**{ms(with_pipelines.step_time_s)}**" if with_pipelines else "infeasible",
        with_pipelines.chosen_from if with_pipelines else "-",
        "inf"
        if best_without is None and with_pipelines
        else (f"{speedup:.2f}x" if speedup else "-"),
        f"{with_pipelines.plan_time_s:.1f}" if with_pipelines else "-",
    ]
    return f"| {model} | {name} | " + " | ".join(cells) + " |", speedup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--budget-s", type=float, default=200.0)
    args = parser.parse_args()
    # the same search in both runs: its iterations bound it, not the clock
    options = PlanOptions(budget_s=args.budget_s, iterations=args.iterations)
    header = (
        "| model | cluster | best baseline without pipelines | pipeline baseline "
        "| tagplan without pipelines | tagplan | chosen from "
        "| speed-up over the best plan without pipelines | plan time (s) |"
    )
    lines = [header, "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
    speedups: list[float] = []
    for model in args.models:
        source = load_graph_source(f"zoo:{model}")
        ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
        for name, spec in CLUSTERS.items():
            line, speedup = row(model, name, ir, load_cluster(spec), options)
            lines.append(line)
            print(line, flush=True)
            if speedup:
                speedups.append(speedup)
    source = load_graph_source("zoo:vgg19")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    tight, _ = row("vgg19", "4x1 GPU of 3.8 GiB", ir, load_cluster(TIGHT), options)
    print(tight, flush=True)
    geomean = math.exp(sum(map(math.log, speedups)) / len(speedups)) if speedups else math.nan
    body = "\n".join(
        [
            "Simulated step time in ms (analytic cost model) of `planner.plan()` with "
            f"{args.iterations} search iterations and a {args.budget_s:.0f} s budget (the "
            "same search in both runs: the iterations bound it, not the clock; the "
            "pipelined candidates get a tenth of the budget), once with `pipeline=False` "
            "(no pipelined strategy weighed, the pipeline baseline left out) and once with "
            "the default; "
            "*pipeline baseline* is one stage per machine, equal compute per stage, "
            "`4p` micro-batches under 1F1B (*refused*: the graph cannot run as a pipeline, "
            "the reason in the plan's baselines phase); *chosen from* `pipelined` when one "
            "of tagplan's pipelined candidates won.",
            "",
            *lines,
            tight,
            "",
            f"Geometric-mean speed-up over the best plan without pipelines: {geomean:.2f}x "
            f"over {len(speedups)} rows.",
            "",
            "Read with the plan-quality table: there, with the default 60 s wall budget, "
            "the search reaches far more than these iterations (Transformer on `cloud` "
            "167.7 ms, VGG19 80.8 ms), ahead of every pipelined candidate; the wins here "
            "are at equal search effort. BERT-Large runs as a pipeline (its masked-LM "
            "head's gather gradient splits by examples), but at the zoo's batch of 16 one "
            "GPU or the search's plan is faster than any pipelined candidate.",
        ]
    )
    write_section("pipeline", "Pipelines", "python -m bench.pipeline", body)


if __name__ == "__main__":
    main()
