"""Simulator throughput: tasks scheduled per second on a synthetic ~2M-task step.

The step is ``layers`` layers on 16 devices: in each layer every device runs ``width``
compute tasks, each after the same task of the previous layer, and sends the output of its
last one to the next device (ring order) over its uplink and that device's downlink, where
it feeds the first task of the next layer. Every task produces one buffer read by its
successors. Reported: the median over the timed runs of ``num_tasks / wall time`` for
:func:`simulate` (schedule, memory, feedback) in FIFO and in priority mode, and for the
compiled scheduling loop alone, with links shared (the default) and held exclusively;
and the shared loop on the *incast* variant, where in each layer every device sends to
one device (``layer mod 16``), so 16 flows share its downlink. The JIT warms up on a
small graph first.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from bench.report import write_section
from tagplan.planner.sim import engine
from tagplan.planner.sim.simulate import LINK_MODELS, LinkModel, simulate, upward_rank
from tagplan.planner.sim.taskgraph import COMPUTE, TRANSFER, TaskGraph


def _csr(src: np.ndarray, dst: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(src, kind="stable")
    ptr = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(np.bincount(src, minlength=rows), out=ptr[1:])
    return ptr, dst[order].astype(np.int32)


def synthetic_step(
    layers: int, *, devices: int = 16, width: int = 4, seed: int = 0, incast: bool = False
) -> TaskGraph:
    """Layers of compute tasks on ``devices`` devices with ring transfers between them (or,
    with ``incast``, transfers from every device to device ``layer mod devices``)."""
    rng = np.random.default_rng(seed)
    per_layer = devices * width + devices
    n = layers * per_layer
    layer = np.arange(layers)[:, None]
    d = np.arange(devices)
    comp = (layer[:, :, None] * per_layer + d[None, :, None] * width + np.arange(width)).reshape(
        layers, devices, width
    )
    xfer = layer * per_layer + devices * width + d[None, :]
    kind = np.full(n, TRANSFER, dtype=np.int8)
    kind[comp.ravel()] = COMPUTE
    device = np.full(n, -1, dtype=np.int32)
    device[comp] = d[None, :, None]
    duration = np.where(kind == COMPUTE, rng.uniform(1e-4, 1e-3, n), rng.uniform(1e-4, 2e-3, n))
    nxt = np.broadcast_to((d + 1) % devices, (layers, devices))
    if incast:
        nxt = np.broadcast_to((np.arange(layers) % devices)[:, None], (layers, devices))
    # Links: 0..devices-1 uplinks, devices..2*devices-1 downlinks.
    link_ptr = np.zeros(n + 1, dtype=np.int32)
    link_ptr[1:] = np.cumsum(np.where(kind == TRANSFER, 2, 0))
    link_index = np.zeros(link_ptr[-1], dtype=np.int32)
    starts = link_ptr[xfer.ravel()]
    link_index[starts] = np.broadcast_to(d, xfer.shape).ravel()
    link_index[starts + 1] = (devices + nxt).ravel()
    src = [comp[:-1].ravel(), comp[:, :, -1].ravel(), xfer[:-1].ravel()]
    dst = [
        comp[1:].ravel(),
        xfer.ravel(),
        comp[1:, :, 0][np.arange(layers - 1)[:, None], nxt[:-1]].ravel(),
    ]
    src_all, dst_all = np.concatenate(src), np.concatenate(dst)
    succ_ptr, succ_index = _csr(src_all, dst_all, n)
    buffer_device = device.copy()
    buffer_device[xfer] = nxt
    return TaskGraph(
        num_devices=devices,
        num_links=2 * devices,
        task_kind=kind,
        task_device=device,
        task_duration_s=duration,
        task_priority=np.zeros(n),
        task_group=(np.arange(n) // per_layer).astype(np.int32),
        task_bytes=np.where(kind == TRANSFER, 1 << 20, 0).astype(np.int64),
        task_latency_s=np.where(kind == TRANSFER, 1e-5, 0.0),
        link_ptr=link_ptr,
        link_index=link_index,
        link_share=np.ones(len(link_index)),
        succ_ptr=succ_ptr,
        succ_index=succ_index,
        buffer_device=buffer_device,
        buffer_bytes=rng.integers(1 << 10, 1 << 24, n).astype(np.int64),
        buffer_producer=np.arange(n, dtype=np.int32),
        consumer_ptr=succ_ptr,
        consumer_task=succ_index,
        persistent_bytes=np.full(devices, 1 << 30, dtype=np.int64),
    )


def _median_rate(n: int, fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return n / statistics.median(times)


def _rates(tg: TaskGraph, runs: int, link_model: LinkModel) -> dict[str, float]:
    """M tasks/s of ``simulate`` and of the loop alone, FIFO and by upward rank."""
    n = tg.num_tasks
    shared = link_model == "shared"
    arrays = (
        tg.task_kind,
        tg.task_device,
        tg.task_duration_s,
        tg.task_latency_s,
        tg.task_priority,
        tg.link_ptr,
        tg.link_index,
        tg.link_share,
        tg.succ_ptr,
        tg.succ_index,
        tg.num_devices,
        tg.num_links,
    )
    tg.task_priority[:] = 0.0
    found = {
        "simulate, FIFO": _median_rate(n, lambda: simulate(tg, link_model=link_model), runs),
        "loop, FIFO": _median_rate(n, lambda: engine.schedule(*arrays, False, shared), runs),
    }
    tg.task_priority[:] = upward_rank(tg)
    found["simulate, priority"] = _median_rate(
        n, lambda: simulate(tg, use_priority=True, link_model=link_model), runs
    )
    found["loop, priority"] = _median_rate(n, lambda: engine.schedule(*arrays, True, shared), runs)
    return {k: v / 1e6 for k, v in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=25_000, help="80 tasks per layer")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    for model in LINK_MODELS:
        for incast in (False, True):
            small = synthetic_step(10, incast=incast)
            simulate(small, link_model=model)
            simulate(small, use_priority=True, link_model=model)
    upward_rank(small)
    t0 = time.perf_counter()
    tg = synthetic_step(args.layers)
    build_s = time.perf_counter() - t0
    n = tg.num_tasks
    print(f"tasks: {n:,}  edges: {len(tg.succ_index):,}  buffers: {tg.num_buffers:,}")
    print(f"graph built in {build_s:.2f} s")
    t0 = time.perf_counter()
    upward_rank(tg)
    rank_s = time.perf_counter() - t0
    rows = {
        "ring, shared links": _rates(tg, args.runs, "shared"),
        "ring, exclusive links": _rates(tg, args.runs, "exclusive"),
        "incast, shared links": _rates(
            synthetic_step(args.layers, incast=True), args.runs, "shared"
        ),
    }
    columns = ["simulate, FIFO", "simulate, priority", "loop, FIFO", "loop, priority"]
    lines = [
        f"Synthetic step: {n:,} tasks ({args.layers:,} layers of compute tasks on 16 devices "
        f"with a transfer over two links from each device per layer: to the next device "
        f"(ring) or all to one device (incast)), {len(tg.succ_index):,} edges, "
        f"{tg.num_buffers:,} buffers. M tasks/s, median of {args.runs} runs after the JIT "
        "warm-up, one core; `simulate` includes memory and group feedback.",
        "",
        "| graph, link model | " + " | ".join(columns) + " |",
        "| --- |" + " ---: |" * len(columns),
    ]
    for name, found in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{found[c]:.2f}" for c in columns) + " |")
        print(name, {c: round(found[c], 2) for c in columns})
    lines += ["", f"Upward rank of the whole graph: {rank_s:.3f} s. Bar: >= 1 M tasks/s."]
    write_section(
        "sim-throughput",
        "Simulator throughput",
        f"python -m bench.sim_throughput --layers {args.layers} --runs {args.runs}",
        "\n".join(lines),
    )


if __name__ == "__main__":
    main()
