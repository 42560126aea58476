"""Training batch norms timed on a real GPU over a grid of shapes, against the cost model.

TensorFlow runs ``FusedBatchNormV3`` and its gradient on a GPU with cuDNN; a roofline over
their bytes assumes the whole GPU streams them. Two steps, as for ``bench/gpu_kernels.py``:

    python -m bench.gpu_batch_norm measure --out batch_norm.json   # on the GPU, torch only
    python -m bench.gpu_batch_norm compare bench/profiles/batch_norm_h100.json.gz

``measure`` times, for every shape of a grid of batch x spatial size x channels, the
forward training batch norm and its gradient with cuDNN in NCHW (TensorFlow's layout on a
GPU in ``tf_cnn_benchmarks``) and in NHWC (Keras's default), and PyTorch's own kernels in
NCHW (what ``bench/gpu_measure.py`` timed). ``compare`` prices the same shapes with the
analytic cost model for the measured GPU's catalog type and prints predicted over measured
by channel count and by the bytes one channel streams.
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

EPS = 1e-3
CHANNELS = (16, 32, 64, 128, 256, 512, 1024, 2048)
SPATIAL = (7, 14, 28, 56, 112, 147)
BATCHES = (16, 64)
MAX_ELEMENTS = 2**28
IMPLEMENTATIONS = ("cudnn_nchw", "cudnn_nhwc", "native_nchw")
DIRECTIONS = ("forward", "backward")


def grid() -> list[tuple[int, int, int]]:
    """(batch, spatial size, channels) of every shape timed, at most ``MAX_ELEMENTS``."""
    return [
        (n, s, c)
        for n in BATCHES
        for s in SPATIAL
        for c in CHANNELS
        if n * s * s * c <= MAX_ELEMENTS
    ]


def _calls(implementation: str, n: int, s: int, c: int) -> dict[str, Any]:
    """The forward and backward calls of one implementation at one shape."""
    import torch

    device = torch.device("cuda")
    x = torch.randn(n, c, s, s, device=device)
    if implementation == "cudnn_nhwc":
        x = x.contiguous(memory_format=torch.channels_last)
    grad = torch.randn_like(x)
    weight, bias = torch.ones(c, device=device), torch.zeros(c, device=device)
    if implementation == "native_nchw":
        _, mean, invstd = torch.ops.aten.native_batch_norm(
            x, weight, bias, None, None, True, 0.0, EPS
        )
        return {
            "forward": lambda: torch.ops.aten.native_batch_norm(
                x, weight, bias, None, None, True, 0.0, EPS
            ),
            "backward": lambda: torch.ops.aten.native_batch_norm_backward(
                grad, x, weight, None, None, mean, invstd, True, EPS, [True, True, True]
            ),
        }
    running_mean, running_var = torch.zeros(c, device=device), torch.ones(c, device=device)
    _, save_mean, save_var, reserve = torch.ops.aten.cudnn_batch_norm(
        x, weight, bias, running_mean, running_var, True, 0.0, EPS
    )
    return {
        "forward": lambda: torch.ops.aten.cudnn_batch_norm(
            x, weight, bias, running_mean, running_var, True, 0.0, EPS
        ),
        "backward": lambda: torch.ops.aten.cudnn_batch_norm_backward(
            x, grad, weight, running_mean, running_var, save_mean, save_var, EPS, reserve
        ),
    }


def measure(out: Path) -> None:
    import torch

    from bench.gpu_measure import median_call_s

    device = torch.device("cuda")
    source = torch.empty(2**29, device=device)
    target = torch.empty_like(source)
    copy_s = median_call_s(partial(target.copy_, source))
    del source, target
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "multiprocessors": torch.cuda.get_device_properties(device).multi_processor_count,
        "copy_gb_per_s": 2 * 2**29 * 4 / copy_s / 1e9,
        "rows": [],
    }
    started = time.perf_counter()
    for n, s, c in grid():
        row: dict[str, Any] = {"batch": n, "spatial": s, "channels": c}
        for implementation in IMPLEMENTATIONS:
            for direction, call in _calls(implementation, n, s, c).items():
                row[f"{implementation}_{direction}_s"] = median_call_s(call)
            torch.cuda.empty_cache()
        result["rows"].append(row)
        out.write_text(json.dumps(result, separators=(",", ":")))
    print(f"{len(result['rows'])} shapes in {time.perf_counter() - started:.0f} s -> {out}")


def batch_norm_graph(batch: int, shapes: list[tuple[int, int]]) -> dict:
    """A graph in the JSON form holding the training batch norm and its gradient (NCHW,
    as TensorFlow runs them on a GPU) of every ``(spatial, channels)`` at ``batch``, and
    one parameter trained on the first gradient (the analyzer wants a training graph)."""
    from tests.planner.graph.builders import (
        const,
        document,
        node,
        placeholder,
        scalar,
        sgd,
        variable,
    )

    float32 = {"type": "float32"}
    attrs = {"T": float32, "U": float32, "data_format": "NCHW", "is_training": True}
    nodes = []
    for s, c in shapes:
        x, tag = [batch, c, s, s], f"{s}x{c}"
        per_channel, gamma = [("float32", [c])], [f"gamma{tag}"] * 4
        nodes += [
            placeholder(f"x{tag}", x),
            placeholder(f"dy{tag}", x),
            const(f"gamma{tag}", [1.0] * c, "float32"),
            node(
                f"forward{tag}",
                "FusedBatchNormV3",
                [f"x{tag}", *gamma],
                [("float32", x), *per_channel * 5],
                **attrs,
            ),
            node(
                f"backward{tag}",
                "FusedBatchNormGradV3",
                [f"dy{tag}", f"x{tag}", *gamma],
                [("float32", x), *per_channel * 4],
                **attrs,
            ),
        ]
    s, c = shapes[0]
    nodes += [*variable("w", [c]), scalar("lr", 0.1), sgd("update", "w", f"backward{s}x{c}:1")]
    nodes.append(node("sink", "NoOp", [f"^{n['name']}" for n in nodes]))
    return document(nodes)


def predicted_s(measured: dict, spec: Any) -> dict[tuple[int, int, int, str], float]:
    """The cost model's seconds of every measured shape's forward and backward on ``spec``."""
    from tagplan.planner.cost.op_time import OpCostModel
    from tagplan.planner.graph.analyzer import analyze
    from tagplan.planner.graph.neutral_json import graph_def_from_json

    seconds = {}
    for batch in sorted({row["batch"] for row in measured["rows"]}):
        shapes = [(r["spatial"], r["channels"]) for r in measured["rows"] if r["batch"] == batch]
        ir = analyze(graph_def_from_json(batch_norm_graph(batch, shapes)))
        times = OpCostModel.for_gpu_types(ir, [spec]).op_times(0, batch).seconds
        for s, c in shapes:
            for direction in DIRECTIONS:
                seconds[batch, s, c, direction] = float(times[ir.op_index(f"{direction}{s}x{c}")])
    return seconds


CHANNEL_BANDS = (32, 64, 128, 256, 2048)
WORK_BANDS = ("< 20k", "20k-100k", ">= 100k")


def _band(row: dict) -> tuple[int, int]:
    """The row's channel band (its upper bound) and elements-per-channel band (an index
    of ``WORK_BANDS``)."""
    per_channel = row["batch"] * row["spatial"] ** 2
    channels = next(b for b in CHANNEL_BANDS if row["channels"] <= b)
    return channels, int(per_channel >= 20_000) + int(per_channel >= 100_000)


def compare(measured_path: Path, write: bool) -> None:
    from bench.gpu_kernels import read_measured
    from bench.report import write_section
    from tagplan.planner.topology import builtin_catalog

    measured, type_name = read_measured(measured_path)
    device = measured["device"]
    spec = builtin_catalog()[type_name]
    bounded = predicted_s(measured, spec)
    roofline = predicted_s(measured, spec.model_copy(update={"multiprocessors": None}))
    bands: dict[tuple[int, int], list[dict]] = {}
    for row in measured["rows"]:
        bands.setdefault(_band(row), []).append(row)
    lines = [
        f"Training batch norms timed with PyTorch {measured['torch']} (cuDNN "
        f"{measured['cudnn']}) on {device} ({measured['multiprocessors']} multiprocessors, "
        f"copy {measured['copy_gb_per_s']:,.0f} GB/s), {len(measured['rows'])} shapes "
        f"(batch {', '.join(map(str, BATCHES))} x spatial {', '.join(map(str, SPATIAL))} x "
        f"channels {CHANNELS[0]}-{CHANNELS[-1]}), priced for the catalog's `{type_name}`. "
        "Median of predicted / measured per band of channels and of elements per channel "
        "(batch x height x width), with the channel bound (`bound`) and without it "
        "(`roofline`); cuDNN in NCHW is what TensorFlow runs for float32:",
        "",
        "| channels | elements per channel | shapes | implementation | forward, roofline | "
        "forward, bound | backward, roofline | backward, bound |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for band in sorted(bands):
        rows = bands[band]
        for implementation in IMPLEMENTATIONS:
            cells = []
            for direction in DIRECTIONS:
                for model in (roofline, bounded):
                    ratios = [
                        model[row["batch"], row["spatial"], row["channels"], direction]
                        / row[f"{implementation}_{direction}_s"]
                        for row in rows
                    ]
                    cells.append(f"{np.median(ratios):.2f}")
            lines.append(
                f"| <= {band[0]} | {WORK_BANDS[band[1]]} | {len(rows)} | {implementation} | "
                + " | ".join(cells)
                + " |"
            )
    body = "\n".join(lines)
    print(body)
    if write:
        write_section(
            f"gpu_batch_norm_{type_name}",
            f"Batch norms timed on an {type_name}",
            f"python -m bench.gpu_batch_norm compare {measured_path} --write",
            body,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("measure").add_argument("--out", type=Path, required=True)
    compared = commands.add_parser("compare")
    compared.add_argument("measured", type=Path)
    compared.add_argument("--write", action="store_true")
    args = parser.parse_args()
    if args.command == "measure":
        measure(args.out)
    else:
        compare(args.measured, args.write)


if __name__ == "__main__":
    main()
