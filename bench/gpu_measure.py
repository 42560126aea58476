"""Time real GPU kernels and training steps with PyTorch (cuDNN, cuBLAS) on the GPU at hand.

Runs on a machine with an NVIDIA GPU and PyTorch, nothing else of tagplan (it imports no
tagplan module, so the checkout needs no install there):

    python -m bench.gpu_measure --kernels kernels.json --out measured.json

``kernels.json`` (written by ``python -m bench.gpu_kernels export``) lists the unique
convolutions and matrix products of zoo graphs, each as its forward shape and direction,
and their memory-bound ops (batch norms, pools, elementwise ops, Adam updates), each as
its op type and input shapes. The memory-bound ops are timed once (PyTorch's kernel for
each; batch norms and pools in NCHW, as cuDNN runs TensorFlow's on a GPU). Convolutions
and products are timed in two math modes:

* ``tf32``: TensorFlow's default on Ampere and later, float32 tensors with TF32 tensor-core
  math for convolutions and matrix products;
* ``fp32``: strict float32 (no TF32), where cuDNN picks between direct and Winograd
  algorithms on the FP32 pipeline, as on the GPUs before Ampere.

cuDNN autotuning is on (``cudnn.benchmark``, TensorFlow's default), so each shape runs
with the fastest algorithm cuDNN offers. A kernel's time is the median of three timed
rounds of back-to-back calls (CUDA events, ~10 ms per round) after a warm-up call; for
kernels of a few microseconds that includes PyTorch's launch from Python.

The output also holds whole training steps of the torchvision networks that match the
zoo's CNNs (SGD, batch 96, both modes), run eagerly and replayed from a CUDA graph (the
same kernels with no launch from Python between them, as TensorFlow's executor launches
from C++), and the GPU's achieved peaks (a large matrix product per mode, a
device-to-device copy). It is written after every section, so a run stopped early keeps
what it measured.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

MODES = ("tf32", "fp32")
ROUND_S = 0.01
ROUNDS = 3
MODEL_BATCH = 96
MODEL_STEPS = 15
# torchvision builders of the zoo's CNNs and their input size.
MODELS = {
    "vgg19": ("vgg19", 224),
    "resnet101": ("resnet101", 224),
    "inception_v3": ("inception_v3", 299),
}


def set_mode(mode: str) -> None:
    """Math mode for float32 convolutions and matrix products; autotuning on."""
    tf32 = mode == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True


def median_call_s(fn: Callable[[], Any]) -> float:
    """Median over ``ROUNDS`` rounds of the mean time of one call, after a warm-up."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    reps = max(1, min(200, math.ceil(ROUND_S / max(start.elapsed_time(end) / 1e3, 1e-6))))
    rounds = []
    for _ in range(ROUNDS):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        rounds.append(start.elapsed_time(end) / 1e3 / reps)
    return statistics.median(rounds)


def same_padding(size: int, kernel: int, stride: int, dilation: int) -> int:
    """Symmetric padding giving TensorFlow's SAME output size ``ceil(size / stride)``.

    TensorFlow pads an odd total one more at the end; padding both sides by the larger
    half gives the same output size (one extra padded row the kernel does not use).
    """
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return -(-total // 2)


def conv_call(
    spec: dict, device: torch.device, dtype: torch.dtype = torch.float32
) -> Callable[[], Any]:
    """The cuDNN call of one convolution direction at its forward shape."""
    n, h, w, c = spec["input_nhwc"]
    kh, kw, ci, co = spec["filter_hwio"]
    stride, dilation = spec["strides"], spec["dilations"]
    if spec["padding"] == "SAME":
        padding = [
            same_padding(size, k, s, d)
            for size, k, s, d in zip((h, w), (kh, kw), stride, dilation, strict=True)
        ]
    else:
        padding = spec["pads"]
    x = torch.randn(n, c, h, w, device=device, dtype=dtype)
    weight = torch.randn(co, ci, kh, kw, device=device, dtype=dtype)
    if spec["direction"] == "forward":
        return lambda: F.conv2d(x, weight, None, stride, padding, dilation)
    grad_y = torch.randn_like(F.conv2d(x, weight, None, stride, padding, dilation))
    mask = [spec["direction"] == "backward_data", spec["direction"] == "backward_filter", False]
    return lambda: torch.ops.aten.convolution_backward(
        grad_y, x, weight, None, stride, padding, dilation, False, [0, 0], 1, mask
    )


def matmul_call(
    spec: dict, device: torch.device, dtype: torch.dtype = torch.float32
) -> Callable[[], Any]:
    """The cuBLAS call of a (batched) matrix product; transposes are views, as in cuBLAS."""
    a = torch.randn(*spec["a"], device=device, dtype=dtype)
    b = torch.randn(*spec["b"], device=device, dtype=dtype)
    a = a.transpose(-1, -2) if spec["transpose_a"] else a
    b = b.transpose(-1, -2) if spec["transpose_b"] else b
    return lambda: torch.matmul(a, b)


def _nchw(shape: list[int], device: torch.device) -> torch.Tensor:
    n, h, w, c = shape
    return torch.randn(n, c, h, w, device=device)


def _pool_padding(spec: dict, size: list[int]) -> list[int]:
    if spec["padding"] != "SAME":
        return [0, 0]
    return [
        same_padding(s, k, stride, 1)
        for s, k, stride in zip(size, spec["ksize"], spec["strides"], strict=True)
    ]


def memory_call(spec: dict, device: torch.device) -> Callable[[], Any]:
    """The CUDA kernels PyTorch runs for a memory-bound TensorFlow op: batch norms and
    pools in NCHW (as cuDNN runs TensorFlow's on a GPU), elementwise ops as they are."""
    op, shapes = spec["op"], spec["inputs"]
    eps = 1e-3
    if op == "FusedBatchNormV3":
        x = _nchw(shapes[0], device)
        weight, bias = torch.ones(x.shape[1], device=device), torch.zeros(x.shape[1], device=device)
        return lambda: F.batch_norm(x, None, None, weight, bias, True, 0.0, eps)
    if op == "FusedBatchNormGradV3":
        grad, x = _nchw(shapes[0], device), _nchw(shapes[1], device)
        weight = torch.ones(x.shape[1], device=device)
        _, mean, invstd = torch.ops.aten.native_batch_norm(
            x, weight, None, None, None, True, 0.0, eps
        )
        return lambda: torch.ops.aten.native_batch_norm_backward(
            grad, x, weight, None, None, mean, invstd, True, eps, [True, True, True]
        )
    if op in ("MaxPool", "MaxPoolGrad"):
        x = _nchw(shapes[0], device)
        padding = _pool_padding(spec, shapes[0][1:3])
        args = (spec["ksize"], spec["strides"], padding)
        if op == "MaxPool":
            return lambda: F.max_pool2d(x, *args)
        y, indices = F.max_pool2d(x, *args, return_indices=True)
        grad = torch.randn_like(y)
        return lambda: torch.ops.aten.max_pool2d_with_indices_backward(
            grad, x, *args, [1, 1], False, indices
        )
    tensors = [torch.randn(tuple(shape), device=device) for shape in shapes]
    first = tensors[0]
    calls: dict[str, Callable[[], Any]] = {
        "Relu": lambda: torch.relu(first),
        "ReluGrad": lambda: torch.ops.aten.threshold_backward(first, tensors[-1], 0.0),
        "BiasAdd": lambda: first + tensors[1],
        "BiasAddGrad": lambda: first.view(-1, first.shape[-1]).sum(0),
        "AddV2": lambda: first + tensors[1],
        "Sub": lambda: first - tensors[1],
        "Mul": lambda: first * tensors[1],
        "AddN": lambda: torch.stack(tensors).sum(0) if len(tensors) > 2 else first + tensors[1],
        "ConcatV2": lambda: torch.cat(tensors, dim=-1),
    }
    if op == "ResourceApplyAdam":
        variable, m, v = (torch.zeros_like(first) for _ in range(3))
        step = torch.ones((), device=device)
        return lambda: torch._fused_adam_(
            [variable],
            [first],
            [m],
            [v],
            [],
            [step],
            lr=1e-3,
            beta1=0.9,
            beta2=0.999,
            weight_decay=0.0,
            eps=1e-7,
            amsgrad=False,
            maximize=False,
        )
    return calls[op]


def measure_kernels(
    kernels: list[dict],
    device: torch.device,
    mode: str,
    times: dict[str, float],
    save: Callable[[], None],
) -> None:
    """Fill ``times`` (seconds by kernel key) in the current mode, saving every 25."""
    for index, spec in enumerate(kernels):
        dtype = torch.float16 if spec["dtype"] == "float16" else torch.float32
        if spec["kind"] == "memory":
            if mode != MODES[0]:
                continue  # no math mode to them: timed once
            build = memory_call
        else:
            build = partial(conv_call if spec["kind"] == "conv" else matmul_call, dtype=dtype)
        try:
            times[spec["key"]] = median_call_s(build(spec, device))
        except (RuntimeError, TypeError, ValueError) as error:  # one kernel, not the run
            print(f"{spec['key']}: {error}", flush=True)
        torch.cuda.empty_cache()
        if index % 25 == 24:
            save()


def _step_s(step: Callable[[], Any]) -> float:
    """Mean seconds of one call of ``step`` over ``MODEL_STEPS``, after three warm-ups."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(MODEL_STEPS):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / MODEL_STEPS


def _graphed(train: Callable[[], Any], optimizer: torch.optim.Optimizer) -> Callable[[], Any]:
    """``train`` captured once as a CUDA graph (PyTorch's whole-network capture recipe):
    a replay launches the step's kernels back to back with no Python between them."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            train()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        train()
    return graph.replay


def measure_models(device: torch.device, mode: str) -> dict[str, dict[str, float]]:
    """Seconds per SGD training step of each torchvision network at ``MODEL_BATCH``, run
    eagerly (``eager``) and replayed from a CUDA graph (``graph``; absent where the
    capture failed)."""
    import torchvision

    set_mode(mode)
    steps: dict[str, dict[str, float]] = {"eager": {}, "graph": {}}
    for name, (builder, size) in MODELS.items():
        options = {"aux_logits": False, "init_weights": False} if builder == "inception_v3" else {}
        model = getattr(torchvision.models, builder)(weights=None, **options).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        images = torch.randn(MODEL_BATCH, 3, size, size, device=device)
        labels = torch.randint(0, 1000, (MODEL_BATCH,), device=device)

        def train(model=model, optimizer=optimizer, images=images, labels=labels) -> None:
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()

        def step(train=train, optimizer=optimizer) -> None:
            optimizer.zero_grad(set_to_none=True)
            train()

        steps["eager"][name] = _step_s(step)
        try:
            steps["graph"][name] = _step_s(_graphed(train, optimizer))
        except (RuntimeError, AssertionError) as error:  # one capture, not the run
            print(f"{name} {mode} graph: {error}", flush=True)
        del model, optimizer
        torch.cuda.empty_cache()
    return steps


def measure_peaks(device: torch.device) -> dict[str, float]:
    """Achieved FLOP/s of an 8192^3 float32 product per mode, and copy bandwidth."""
    peaks: dict[str, float] = {}
    a = torch.randn(8192, 8192, device=device)
    b = torch.randn(8192, 8192, device=device)
    for mode in MODES:
        set_mode(mode)
        peaks[f"{mode}_matmul_tflops"] = 2 * 8192**3 / median_call_s(lambda: a @ b) / 1e12
    source = torch.empty(2**29, device=device)
    target = torch.empty_like(source)
    seconds = median_call_s(lambda: target.copy_(source))
    peaks["copy_gb_per_s"] = 2 * source.numel() * 4 / seconds / 1e9
    return peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernels", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--skip-models", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda")
    kernels = json.loads(args.kernels.read_text())
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "kernels": kernels,
        "peaks": measure_peaks(device),
        "kernel_s": {},
        "model_step_s": {},
        "model_graph_step_s": {},
    }

    def save() -> None:
        args.out.write_text(json.dumps(result, separators=(",", ":")))

    for mode in MODES:
        started = time.perf_counter()
        set_mode(mode)
        result["kernel_s"][mode] = {}
        measure_kernels(kernels["kernels"], device, mode, result["kernel_s"][mode], save)
        print(f"kernels {mode}: {time.perf_counter() - started:.0f} s", flush=True)
        save()
    for mode in () if args.skip_models else MODES:
        started = time.perf_counter()
        measured = measure_models(device, mode)
        result["model_step_s"][mode] = measured["eager"]
        result["model_graph_step_s"][mode] = measured["graph"]
        print(f"models {mode}: {time.perf_counter() - started:.0f} s", flush=True)
        save()


if __name__ == "__main__":
    main()
