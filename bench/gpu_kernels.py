"""Fidelity of the op cost model against kernels timed on a real GPU.

Two steps around ``bench/gpu_measure.py``, which runs where the GPU is:

    python -m bench.gpu_kernels export --out kernels.json
    python -m bench.gpu_measure --kernels kernels.json --out measured.json   # on the GPU
    python -m bench.gpu_kernels compare bench/profiles/kernels_h100.json.gz

``export`` lists every convolution (forward, backward-data, backward-filter) and matrix
product of five zoo graphs at their zoo batch, deduplicated by shape. ``compare`` prices
the same ops with the analytic cost model (no profile) for the measured GPU's catalog
type, TF32 mode as catalogued and strict FP32 as the same type without its TF32 peak,
and prints predicted over measured:

* per model and kernel class, the sum over the graph's ops (what the simulated step adds
  up), with the GPU type's tile rounding (:mod:`tagplan.planner.cost.gemm_shape`) and
  without it, and the spread of the per-op ratios;
* the whole SGD training step of the torchvision network against the simulated
  ``single`` step of the zoo graph (same architecture, another framework's runtime: a
  looser comparison than the kernels, which run the graph's exact shapes).

The efficiencies of the cost model were not fitted on these measurements. One choice
was made on them: the catalog's ``gemm_tile`` of 128 for the Hopper types, taken on the
H200's kernels (``bench/profiles/kernels_h200.json.gz``); the H100's
(``kernels_h100.json.gz``), timed afterwards, are the check.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from bench.report import write_section
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.cost.work import _ints, attrs_from_cost_key
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.topology import GpuTypeSpec, builtin_catalog, load_cluster

MODELS = ("vgg19", "resnet101", "inception_v3", "bert_large", "transformer")
MEMORY_MODELS = ("vgg19", "resnet101", "inception_v3")
CONV_DIRECTIONS = {
    "Conv2D": "forward",
    "Conv2DBackpropInput": "backward_data",
    "Conv2DBackpropFilter": "backward_filter",
}
MATMULS = {"MatMul": ("transpose_a", "transpose_b"), "BatchMatMulV2": ("adj_x", "adj_y")}
MATMULS["BatchMatMul"] = MATMULS["BatchMatMulV3"] = MATMULS["BatchMatMulV2"]
DTYPES = {1: "float32", 19: "float16"}
# The catalog type of each device name torch reports (the GPUs measured so far).
DEVICE_TYPES = {"H100": "H100", "H200": "H200"}


def kernel_class(op_type: str) -> str:
    return CONV_DIRECTIONS.get(op_type) or ("matmul" if op_type == "MatMul" else "batch_matmul")


def load_ir(model: str) -> GraphIR:
    source = load_graph_source(f"zoo:{model}")
    return analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)


def kernel_spec(ir: GraphIR, op: int) -> dict | None:
    """The op's kernel as ``gpu_measure`` runs it; None for shapes not fully known."""
    op_type = ir.op_types[op]
    ins, outs = ir.inputs(op), ir.outputs(op)
    if op_type not in CONV_DIRECTIONS and op_type not in MATMULS:
        return None
    attrs = attrs_from_cost_key(ir.cost_keys[op])
    dtype = DTYPES.get(int(ir.tensor_dtype[outs[0]]))
    if op_type in CONV_DIRECTIONS:
        if attrs.get("data_format", "NHWC") != "NHWC":
            return None
        x = ins[0] if op_type != "Conv2DBackpropInput" else outs[0]
        w = ins[1] if op_type != "Conv2DBackpropFilter" else outs[0]
        strides = _ints(attrs.get("strides")) or [1, 1, 1, 1]
        dilations = _ints(attrs.get("dilations")) or [1, 1, 1, 1]
        pads = _ints(attrs.get("explicit_paddings")) or [0] * 8
        spec = {
            "kind": "conv",
            "direction": CONV_DIRECTIONS[op_type],
            "input_nhwc": ir.tensor_shapes[x],
            "filter_hwio": ir.tensor_shapes[w],
            "strides": strides[1:3],
            "dilations": dilations[1:3],
            "padding": attrs.get("padding", "VALID"),
            "pads": [pads[2], pads[4]],
        }
        shapes = [spec["input_nhwc"], spec["filter_hwio"]]
    else:
        first, second = MATMULS[op_type]
        spec = {
            "kind": "matmul",
            "a": ir.tensor_shapes[ins[0]],
            "b": ir.tensor_shapes[ins[1]],
            "transpose_a": attrs.get(first) == "True",
            "transpose_b": attrs.get(second) == "True",
        }
        shapes = [spec["a"], spec["b"]]
    if dtype is None or any(s is None or min(s, default=0) < 0 for s in shapes):
        return None
    spec["dtype"] = dtype
    spec["key"] = json.dumps(spec, sort_keys=True)
    return spec


# Memory-bound op types gpu_measure runs (the bulk of the CNNs' other time), and the
# attributes it needs.
MEMORY_OPS = frozenset(
    {
        "FusedBatchNormV3",
        "FusedBatchNormGradV3",
        "Relu",
        "ReluGrad",
        "BiasAdd",
        "BiasAddGrad",
        "AddV2",
        "AddN",
        "Sub",
        "Mul",
        "MaxPool",
        "MaxPoolGrad",
        "ConcatV2",
        "ResourceApplyAdam",
    }
)
# input positions that carry data (ConcatV2's last input is its axis; ResourceApplyAdam's
# gradient is its tenth; batch norms: x, and dy with x)
_DATA_INPUTS = {
    "ConcatV2": slice(0, -1),
    "ResourceApplyAdam": slice(9, 10),
    "FusedBatchNormV3": slice(0, 1),
    "FusedBatchNormGradV3": slice(0, 2),
}


def memory_spec(ir: GraphIR, op: int) -> dict | None:
    """A memory-bound op as ``gpu_measure`` runs it; None for unknown shapes."""
    op_type = ir.op_types[op]
    if op_type not in MEMORY_OPS:
        return None
    ins = ir.inputs(op)[_DATA_INPUTS.get(op_type, slice(None))]
    shapes = [ir.tensor_shapes[t] for t in ins]
    if not shapes or any(s is None or min(s, default=0) < 0 for s in shapes):
        return None
    if any(int(ir.tensor_dtype[t]) != 1 for t in ins):
        return None
    attrs = attrs_from_cost_key(ir.cost_keys[op])
    spec = {
        "kind": "memory",
        "op": op_type,
        "inputs": shapes,
        "ksize": (_ints(attrs.get("ksize")) or [1, 1, 1, 1])[1:3],
        "strides": (_ints(attrs.get("strides")) or [1, 1, 1, 1])[1:3],
        "padding": attrs.get("padding", "VALID"),
        "dtype": "float32",
    }
    spec["key"] = json.dumps(spec, sort_keys=True)
    return spec


def export(out: Path) -> None:
    kernels: dict[str, dict] = {}
    ops: dict[str, dict[str, str]] = {}
    for model in MODELS:
        ir = load_ir(model)
        ops[model] = {}
        for op in range(ir.num_ops):
            spec = kernel_spec(ir, op) or memory_spec(ir, op)
            if spec is not None:
                kernels.setdefault(spec["key"], spec)
                ops[model][ir.op_names[op]] = spec["key"]
    out.write_text(json.dumps({"kernels": list(kernels.values()), "ops": ops}))
    print(f"{len(kernels)} kernels of {sum(map(len, ops.values()))} ops -> {out}")


MODES = ("tf32", "fp32")


def type_spec(type_name: str, mode: str, tiled: bool) -> GpuTypeSpec:
    """The catalog type in a math mode (strict FP32: without its TF32 peak), with its
    tile rounding or without it (``gemm_tile=None``)."""
    spec = builtin_catalog()[type_name]
    update: dict = {} if tiled else {"gemm_tile": None}
    if mode == "fp32":
        update["tf32_tflops"] = None
    return spec.model_copy(update=update)


def spread(ratios: list[float]) -> str:
    quartiles = np.percentile(ratios, [25, 50, 75])
    return f"{quartiles[1]:.2f} ({quartiles[0]:.2f}-{quartiles[2]:.2f})"


def simulated_step_s(ir: GraphIR, spec: GpuTypeSpec) -> float:
    cluster = load_cluster(
        {
            "gpu_types": [spec.model_dump()],
            "machines": [
                {
                    "name": "host",
                    "gpus": {"type": spec.name, "count": 1},
                    "intra_bandwidth_gbps": 96,
                }
            ],
        }
    )
    evaluator = Evaluator(ir, cluster)
    return evaluator.evaluate(baseline_strategy("single", ir, cluster, evaluator.costs)).step_time_s


Predictions = dict[tuple[str, bool], np.ndarray]


def predictions(ir: GraphIR, type_name: str) -> Predictions:
    """Estimated seconds per op in each math mode, with the tile rounding and without."""
    return {
        (mode, tiled): OpCostModel.for_gpu_types(ir, [type_spec(type_name, mode, tiled)])
        .op_times(0, ir.batch_size)
        .seconds
        for mode in MODES
        for tiled in (True, False)
    }


def kernel_rows(
    ir: GraphIR, model: str, op_keys: dict[str, str], measured: dict, predicted: Predictions
):
    """Table rows per kernel class: measured ms, sum ratio with and without tiles, and the
    per-op ratios, for each math mode."""
    by_class: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for name, key in op_keys.items():
        op = ir.op_index(name)
        if ir.op_types[op] not in MEMORY_OPS:
            by_class[kernel_class(ir.op_types[op])].append((op, key))
    for cls, members in by_class.items():
        cells = []
        for mode in MODES:
            times = measured["kernel_s"][mode]
            pairs = [(op, times[key]) for op, key in members]
            total_measured = sum(m for _, m in pairs)
            tiled, untiled = predicted[mode, True], predicted[mode, False]
            cells += [
                f"{total_measured * 1e3:,.1f}",
                f"{sum(tiled[op] for op, _ in pairs) / total_measured:.2f}",
                f"{sum(untiled[op] for op, _ in pairs) / total_measured:.2f}",
                spread([tiled[op] / m for op, m in pairs]),
            ]
        yield f"| {model} | {ir.batch_size} | {cls} | {len(members)} | " + " | ".join(cells) + " |"


def memory_rows(
    ir: GraphIR, model: str, op_keys: dict[str, str], measured: dict, predicted: Predictions
):
    """Table rows per memory-bound op type: measured ms summed, predicted / measured."""
    seconds = predicted[MODES[0], True]  # no math mode or tile touches these ops
    times = measured["kernel_s"][MODES[0]]
    by_type: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for name, key in op_keys.items():
        op = ir.op_index(name)
        if ir.op_types[op] in MEMORY_OPS and key in times:
            by_type[ir.op_types[op]].append((op, times[key]))
    for op_type, pairs in sorted(by_type.items(), key=lambda item: -sum(m for _, m in item[1])):
        total = sum(m for _, m in pairs)
        yield (
            f"| {model} | {op_type} | {len(pairs)} | {total * 1e3:,.2f} | "
            f"{sum(seconds[op] for op, _ in pairs) / total:.2f} | "
            f"{spread([seconds[op] / m for op, m in pairs])} |"
        )


def read_measured(path: Path) -> tuple[dict, str]:
    """A measurement written on a GPU (gzipped or not) and the catalog type of its GPU."""
    raw = path.read_bytes()
    measured = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)
    device = measured["device"]
    type_name = next((t for prefix, t in DEVICE_TYPES.items() if prefix in device), None)
    if type_name is None:
        raise SystemExit(f"no catalog type for {device!r}: add it to bench.gpu_kernels")
    return measured, type_name


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e3:,.1f}"


def _ratio(predicted_s: float, measured_s: float | None) -> str:
    return "–" if measured_s is None else f"{predicted_s / measured_s:.2f}"


def compare(measured_path: Path) -> None:
    measured, type_name = read_measured(measured_path)
    device = measured["device"]
    peaks = measured["peaks"]
    catalog = builtin_catalog()[type_name]
    lines = [
        f"Kernels timed with PyTorch {measured['torch']} (cuDNN {measured['cudnn']}, "
        f"autotuned; cuBLAS) on {device}, priced for the catalog's `{type_name}` "
        f"(`gemm_tile: {catalog.gemm_tile}`). Achieved peaks there: float32 product "
        f"{peaks['fp32_matmul_tflops']:.1f} TFLOP/s (catalog {catalog.fp32_tflops:g}), TF32 "
        f"{peaks['tf32_matmul_tflops']:.0f} (catalog {catalog.tf32_tflops:g}), copy "
        f"{peaks['copy_gb_per_s']:,.0f} GB/s (catalog {catalog.memory_bandwidth_gb_per_s:,.0f}).",
        "",
        "Per model and kernel class, in each math mode: the measured time of the graph's "
        "ops summed, predicted / measured of that sum with the tile rounding "
        "(`tiled`) and without it (`flat`, the roofline of the ops' own flops), and the "
        "median (quartiles) of the per-op ratios, tiled:",
        "",
        "| model | batch | kernel class | ops | TF32 ms | tiled | flat | per op | "
        "FP32 ms | tiled | flat | per op |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    step_rows = []
    memory = []
    for model, op_keys in measured["kernels"]["ops"].items():
        ir = load_ir(model)
        predicted = predictions(ir, type_name)
        lines += kernel_rows(ir, model, op_keys, measured, predicted)
        if model in MEMORY_MODELS:
            memory += memory_rows(ir, model, op_keys, measured, predicted)
        for mode in MODES:
            if model in measured["model_step_s"].get(mode, {}):
                simulated = [
                    simulated_step_s(ir, type_spec(type_name, mode, tiled))
                    for tiled in (True, False)
                ]
                step = measured["model_step_s"][mode][model]
                graph = measured.get("model_graph_step_s", {}).get(mode, {}).get(model)
                step_rows.append((model, ir.batch_size, mode, *simulated, step, graph))
    if memory:
        lines += [
            "",
            "Memory-bound ops of the CNNs (batch norms and pools in NCHW, elementwise ops, "
            "Adam as one fused kernel), timed once: predicted / measured of the summed "
            "time, and the per-op median (quartiles):",
            "",
            "| model | op type | ops | measured ms | sum ratio | per op |",
            "| --- | --- | ---: | ---: | ---: | --- |",
            *memory,
        ]
    lines += [
        "",
        "Whole SGD training step: the zoo graph's simulated `single` step against the "
        "torchvision network of the same architecture timed on the GPU, run eagerly "
        "(PyTorch launches every kernel from Python; TensorFlow's executor does not) and, "
        "where the measurement has it, replayed from a CUDA graph (the same kernels, none "
        "waiting for a launch):",
        "",
        "| model | batch | mode | eager ms | CUDA graph ms | predicted ms, tiled | "
        "tiled / eager | tiled / graph | flat / graph |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {model} | {batch} | {mode} | {eager * 1e3:,.1f} | {_ms(graph)} | "
        f"{tiled * 1e3:,.1f} | {tiled / eager:.2f} | {_ratio(tiled, graph)} | "
        f"{_ratio(flat, graph)} |"
        for model, batch, mode, tiled, flat, eager, graph in step_rows
    ]
    body = "\n".join(lines)
    print(body)
    write_section(
        f"gpu_kernels_{type_name}",
        f"Fidelity against kernels timed on an {type_name}",
        f"python -m bench.gpu_kernels compare {measured_path}",
        body,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("export").add_argument("--out", type=Path, required=True)
    commands.add_parser("compare").add_argument("measured", type=Path)
    args = parser.parse_args()
    if args.command == "export":
        export(args.out)
    else:
        compare(args.measured)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
