"""Simulator throughput: tasks scheduled per second on a synthetic ~2M-task step.

The step is ``layers`` layers on 16 devices: in each layer every device runs ``width``
compute tasks, each after the same task of the previous layer, and sends the output of its
last one to the next device (ring order) over its uplink and that device's downlink, where
it feeds the first task of the next layer. Every task produces one buffer read by its
successors. Reported: the median over the timed runs of ``num_tasks / wall time`` for
:func:`simulate` (schedule, memory, feedback) in FIFO and in priority mode, and for the
compiled scheduling loop alone. The JIT warms up on a small graph first.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from bench.report import write_section
from tagplan.planner.sim import engine
from tagplan.planner.sim.simulate import simulate, upward_rank
from tagplan.planner.sim.taskgraph import COMPUTE, TRANSFER, TaskGraph


def _csr(src: np.ndarray, dst: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(src, kind="stable")
    ptr = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(np.bincount(src, minlength=rows), out=ptr[1:])
    return ptr, dst[order].astype(np.int32)


def synthetic_step(layers: int, *, devices: int = 16, width: int = 4, seed: int = 0) -> TaskGraph:
    """Layers of compute tasks on ``devices`` devices with ring transfers between them."""
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
    nxt = (d + 1) % devices
    # Links: 0..devices-1 uplinks, devices..2*devices-1 downlinks.
    link_ptr = np.zeros(n + 1, dtype=np.int32)
    link_ptr[1:] = np.cumsum(np.where(kind == TRANSFER, 2, 0))
    link_index = np.zeros(link_ptr[-1], dtype=np.int32)
    starts = link_ptr[xfer.ravel()]
    link_index[starts] = np.broadcast_to(d, xfer.shape).ravel()
    link_index[starts + 1] = np.broadcast_to(devices + nxt, xfer.shape).ravel()
    src = [comp[:-1].ravel(), comp[:, :, -1].ravel(), xfer[:-1].ravel()]
    dst = [comp[1:].ravel(), xfer.ravel(), comp[1:, nxt, 0].ravel()]
    src_all, dst_all = np.concatenate(src), np.concatenate(dst)
    succ_ptr, succ_index = _csr(src_all, dst_all, n)
    buffer_device = device.copy()
    buffer_device[xfer] = nxt[None, :]
    return TaskGraph(
        num_devices=devices,
        num_links=2 * devices,
        task_kind=kind,
        task_device=device,
        task_duration_s=duration,
        task_priority=np.zeros(n),
        task_group=(np.arange(n) // per_layer).astype(np.int32),
        task_bytes=np.where(kind == TRANSFER, 1 << 20, 0).astype(np.int64),
        link_ptr=link_ptr,
        link_index=link_index,
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=25_000, help="80 tasks per layer")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()

    small = synthetic_step(10)
    simulate(small)
    simulate(small, use_priority=True)
    t0 = time.perf_counter()
    tg = synthetic_step(args.layers)
    build_s = time.perf_counter() - t0
    n = tg.num_tasks
    print(f"tasks: {n:,}  edges: {len(tg.succ_index):,}  buffers: {tg.num_buffers:,}")
    print(f"graph built in {build_s:.2f} s")
    arrays = (
        tg.task_kind,
        tg.task_device,
        tg.task_duration_s,
        tg.task_priority,
        tg.link_ptr,
        tg.link_index,
        tg.succ_ptr,
        tg.succ_index,
        tg.num_devices,
        tg.num_links,
    )
    fifo_loop = _median_rate(n, lambda: engine.schedule(*arrays, False), args.runs)
    fifo = _median_rate(n, lambda: simulate(tg), args.runs)
    t0 = time.perf_counter()
    tg.task_priority[:] = upward_rank(tg)
    rank_s = time.perf_counter() - t0
    prio_loop = _median_rate(n, lambda: engine.schedule(*arrays, True), args.runs)
    prio = _median_rate(n, lambda: simulate(tg, use_priority=True), args.runs)
    result = simulate(tg)
    print(f"step time: {result.step_time_s:.3f} s (FIFO)")
    print(f"simulate, FIFO:          {fifo / 1e6:6.2f} M tasks/s (median of {args.runs})")
    print(f"simulate, priority:      {prio / 1e6:6.2f} M tasks/s")
    print(f"scheduling loop, FIFO:     {fifo_loop / 1e6:6.2f} M tasks/s")
    print(f"scheduling loop, priority: {prio_loop / 1e6:6.2f} M tasks/s")
    print(f"upward rank: {rank_s:.3f} s")
    body = "\n".join(
        [
            f"Synthetic step: {n:,} tasks ({args.layers:,} layers of compute tasks on 16 devices "
            f"with ring transfers holding two links each), {len(tg.succ_index):,} edges, "
            f"{tg.num_buffers:,} buffers. Median of {args.runs} runs after the JIT warm-up, "
            "one core.",
            "",
            "| what | M tasks/s |",
            "| --- | ---: |",
            f"| `simulate`, FIFO (schedule + memory + group feedback) | {fifo / 1e6:.2f} |",
            f"| `simulate`, upward-rank priority | {prio / 1e6:.2f} |",
            f"| scheduling loop only, FIFO | {fifo_loop / 1e6:.2f} |",
            f"| scheduling loop only, priority | {prio_loop / 1e6:.2f} |",
            "",
            f"Upward rank of the whole graph: {rank_s:.3f} s. Bar: >= 1 M tasks/s.",
        ]
    )
    write_section(
        "sim-throughput",
        "Simulator throughput",
        f"python -m bench.sim_throughput --layers {args.layers} --runs {args.runs}",
        body,
    )


if __name__ == "__main__":
    main()
