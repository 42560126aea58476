"""Pipelines: tagplan with and without pipelines in its search, beside the hand-configured
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
from tagplan.planner.topology.named import random_cluster_spec

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


def _slow_random(seed: int, machines: int) -> dict:
    """A random allocation of TAG §5.2's generator, its links between machines at a
    tenth of their drawn rate (2-5 Gbps)."""
    spec = random_cluster_spec(seed, machines).model_dump(mode="json", exclude_none=True)
    network = spec["network"]
    network["bandwidth_gbps"] /= 10
    for link in network.get("links", []):
        link["bandwidth_gbps"] /= 10
    return spec


CLUSTERS = {
    "cloud": "cloud",
    "4x4 V100, 1 Gbps": _machines(4, 4, "V100-16GB", 1),
    "8x2 T4, 1 Gbps": _machines(8, 2, "T4", 1),
    "random 4 machines (seed 0), links / 10": _slow_random(0, 4),
    "random 4 machines (seed 3), links / 10": _slow_random(3, 4),
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


def _chosen(result: PlanResult | None) -> str:
    """Where the plan came from; a pipeline's layout, micro-batches and stage sync."""
    if result is None:
        return "-"
    if result.strategy.pipeline is not None:
        return f"{result.chosen_from}: `{result.strategy.name}`"
    return result.chosen_from


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
        _chosen(with_pipelines),
        "inf"
        if best_without is None and with_pipelines
        else (f"{speedup:.2f}x" if speedup else "-"),
        f"{without.plan_time_s:.1f}" if without else "-",
        f"{with_pipelines.plan_time_s:.1f}" if with_pipelines else "-",
    ]
    return f"| {model} | {name} | " + " | ".join(cells) + " |", speedup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--budget-s", type=float, default=60.0)
    args = parser.parse_args()
    options = PlanOptions(budget_s=args.budget_s)  # the defaults: convergence stops both
    header = (
        "| model | cluster | best baseline without pipelines | pipeline baseline "
        "| tagplan without pipelines | tagplan | chosen from "
        "| speed-up over the best plan without pipelines | plan time without (s) "
        "| plan time (s) |"
    )
    lines = [header, "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
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
            f"the default options and a {args.budget_s:.0f} s budget, once with "
            "`pipeline=False` (no pipelined strategy weighed, the pipeline baseline left "
            "out) and once with the default, where the search's root chooses between "
            "TAG's per-group decisions and tagplan's stage layouts, and below a layout "
            "the micro-batches and each stage's gradient synchronization (docs/design.md "
            "§7). *pipeline baseline* is one stage per machine, equal compute per stage, "
            "`4p` micro-batches under 1F1B (*refused*: the graph cannot run as a pipeline, "
            "the reason in the plan's baselines phase); *chosen from* names the pipelined "
            "strategy when the plan is one (`x<m>` micro-batches; `-ap...`: AllReduce or "
            "parameter server per stage where a stage does not AllReduce).",
            "",
            *lines,
            tight,
            "",
            f"Geometric-mean speed-up over the best plan without pipelines: {geomean:.2f}x "
            f"over {len(speedups)} rows.",
            "",
            "With ties broken in order, TAG's decisions get the same iterations with or "
            "without the layouts beside them (tests/planner/search/"
            "test_layout_branches.py), so the column without pipelines is also what the "
            "search's TAG branch reached in the run with them where both converge before "
            "the budget; the difference in plan time is what simulating pipelines cost.",
        ]
    )
    write_section("pipeline", "Pipelines", "python -m bench.pipeline", body)


if __name__ == "__main__":
    main()
