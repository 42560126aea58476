"""Cost-model calibration (issue bar: median estimate/measured over the top ops in [0.5, 2]).

1. The CPU's catalog entry comes from its measured peaks (large MatMuls for FLOP/s, a
   large elementwise op for memory bandwidth).
2. For VGG19 and ResNet101 profiled on the CPU at a small batch (``bench/profiles/``,
   written by ``tagplan profile``), the analytic estimate of the 20 most expensive ops is
   compared with the measured time, op by op and per op type.
3. The sum of the profiled op times is compared with the measured whole-step wall time.
4. Sanity against public figures: the estimated forward+backward+update time of
   ResNet-50 on V100 and A100 vs NVIDIA's published TensorFlow training throughput.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

from bench.report import write_section
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.cost.profile import InMemoryProfileSource, Profile, load_profile
from tagplan.planner.cost.profiler import measure_device_peaks, profile_graph
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.load import loads_graph_def
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.topology import GpuTypeSpec, load_cluster

PROFILES = Path(__file__).resolve().parent / "profiles"
TOP = 20

# NVIDIA DeepLearningExamples, the README of ResNet-50 v1.5 for TensorFlow,
# "Training performance results" (TensorFlow 20.06-tf1-py3 container), 1 GPU:
# DGX-1 V100 16GB, FP32 + XLA, batch 128: 412 img/s; DGX A100 40GB, TF32 + XLA, batch 256:
# 909 img/s. (TF32 runs convolutions on tensor cores; our A100 entry uses the FP32 peak.)
PUBLISHED = [("V100-16GB", 128, 412.0), ("A100-40GB", 256, 909.0)]


def cpu_spec() -> GpuTypeSpec:
    peaks = measure_device_peaks("/CPU:0")
    return GpuTypeSpec(
        name="CPU",
        fp32_tflops=peaks.fp32_flops / 1e12,
        memory_bandwidth_gb_per_s=peaks.memory_bandwidth_bytes_per_s / 1e9,
        memory_gib=16,
        winograd=False,
        source="measured by bench/calibrate_cost.py on the benchmark machine",
    )


def compare(model: str, profile: Profile, spec: GpuTypeSpec) -> tuple[list[str], dict]:
    batch = max(profile.batch_sizes)
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(
        source.graph_def, batch_size=batch, batch_inputs=source.batch_inputs, loss=source.loss
    )
    measured_by_key = {entry.cost_key: entry.times_s[batch] for entry in profile.ops}
    costs = OpCostModel.for_gpu_types(ir, [spec])
    estimate = costs.estimate(costs.type_of(spec.name), batch)
    rows = [
        (measured_by_key[key], float(estimate[op]), ir.op_types[op], key)
        for op, key in enumerate(ir.cost_keys)
        if key in measured_by_key
    ]
    unique = {row[3]: row for row in rows}
    top = sorted(unique.values(), key=lambda r: -r[0])[:TOP]
    ratios = [est / meas for meas, est, _, _ in top if meas > 0]
    by_type: dict[str, list[float]] = defaultdict(list)
    for meas, est, op_type, _ in top:
        by_type[op_type].append(est / meas)
    step = profile.step_time_s[batch]
    op_sum = sum(measured_by_key[key] for key in ir.cost_keys if key in measured_by_key)
    lines = [
        f"**{model}** at batch {batch}: median estimate/measured over the top {len(top)} ops "
        f"= **{statistics.median(ratios):.2f}** (range {min(ratios):.2f}-{max(ratios):.2f}); "
        f"sum of profiled op times / measured step wall time = **{op_sum / step:.2f}** "
        f"({op_sum * 1e3:.1f} ms / {step * 1e3:.1f} ms).",
        "",
        "| op type | ops in top | median estimate/measured |",
        "| --- | ---: | ---: |",
    ]
    for op_type, values in sorted(by_type.items(), key=lambda kv: -len(kv[1])):
        lines.append(f"| {op_type} | {len(values)} | {statistics.median(values):.2f} |")
    return lines, {"median": statistics.median(ratios), "step_ratio": op_sum / step}


def simulated_vs_measured(model: str, profile: Profile, spec: GpuTypeSpec) -> str:
    """One row: the simulator's single-device step with the CPU profile vs TensorFlow's
    measured step on the same CPU (issue bar for the simulator's fidelity)."""
    batch = max(profile.batch_sizes)
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(
        source.graph_def, batch_size=batch, batch_inputs=source.batch_inputs, loss=source.loss
    )
    cluster = load_cluster(
        {
            "gpu_types": [spec.model_dump(exclude_none=True)],
            "machines": [
                {"name": "cpu", "gpus": {"type": "CPU", "count": 1}, "intra_bandwidth_gbps": 100}
            ],
        }
    )
    costs = OpCostModel(ir, cluster, profiles=InMemoryProfileSource([profile]))
    evaluation = Evaluator(ir, cluster, costs=costs).evaluate(
        baseline_strategy("single", ir, cluster, costs)
    )
    simulated, measured = evaluation.step_time_s, profile.step_time_s[batch]
    return (
        f"| {model} | {batch} | {simulated * 1e3:,.1f} | {measured * 1e3:,.1f} | "
        f"{simulated / measured:.2f} |"
    )


def resnet50_sanity() -> list[str]:
    from tagplan.planner.zoo.models.applications import image_classifier
    from tagplan.planner.zoo.models.common import build_tf1

    lines = [
        "| GPU | batch | estimated step (ms) | estimated img/s | published img/s | ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for gpu, batch, published in PUBLISHED:
        graph = build_tf1(lambda b=batch: image_classifier("ResNet50", b, 224))
        ir = analyze(
            loads_graph_def(graph.graph_def.SerializeToString()),
            batch_inputs=[i["name"] for i in graph.inputs],
            loss=graph.loss_node,
        )
        costs = OpCostModel.for_gpu_types(ir)
        step = costs.op_times(costs.type_of(gpu), batch).total_s
        rate = batch / step
        lines.append(
            f"| {gpu} | {batch} | {step * 1e3:,.0f} | {rate:,.0f} | {published:,.0f} | "
            f"{rate / published:.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=["vgg19", "resnet101"])
    args = parser.parse_args()
    spec = cpu_spec()
    body = [
        f"CPU catalog entry from measured peaks: {spec.fp32_tflops * 1e3:,.1f} GFLOP/s FP32 "
        f"(best large MatMul), {spec.memory_bandwidth_gb_per_s:,.1f} GB/s (large elementwise "
        "op, read + write).",
        "",
    ]
    summary = {}
    for model in args.models:
        lines, summary[model] = compare(model, load_profile(PROFILES / f"cpu_{model}.json"), spec)
        body += [*lines, ""]
    body += [
        "Simulated single-device step (CPU profile, simulator) vs TensorFlow's measured "
        "step on this CPU:",
        "",
        "| model | batch | simulated (ms) | measured (ms) | simulated / measured |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for model in ("mlp", "small_cnn"):
        profile = profile_graph(f"zoo:{model}", gpu_type="CPU", batch_sizes=[8], runs=5)
        body.append(simulated_vs_measured(model, profile, spec))
    for model in args.models:
        body.append(
            simulated_vs_measured(model, load_profile(PROFILES / f"cpu_{model}.json"), spec)
        )
    body.append("")
    body.append("ResNet-50 forward + backward + Adam, estimated from the catalog's FP32 peaks:")
    body.append("")
    body += resnet50_sanity()
    body.append("")
    body.append(
        "Source of the published figures: NVIDIA DeepLearningExamples, "
        "TensorFlow/Classification/ConvNets/resnet50v1.5 README, training performance "
        "(20.06-tf1-py3): V100 16GB FP32+XLA batch 128, A100 40GB TF32+XLA batch 256. "
        "Bar: within 2x. Bar for the CPU: median ratio in [0.5, 2]."
    )
    for model, figures in summary.items():
        print(model, {k: round(v, 3) for k, v in figures.items()})
    write_section(
        "calibration",
        "Cost model calibration",
        "python -m bench.calibrate_cost",
        "\n".join(body),
    )
    print("\n".join(body))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
