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

A second table schedules task graphs the compiler makes of parameter-server strategies,
compiled per GPU, where thousands of routes carry flows at once (every worker pushes to
and pulls from every server): seconds of the loop alone, median of ``--runs``, and how
many routes carry flows at once at most. ``--json`` and ``--before`` set another code's
seconds beside these.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from bench.ps_traffic import cluster_spec, dp_ps_graph
from bench.report import (
    add_comparison_arguments,
    before_cells,
    before_note,
    kept_for_later,
    rows_before,
    write_section,
)
from tagplan.planner.sim import engine
from tagplan.planner.sim.simulate import LINK_MODELS, LinkModel, simulate, upward_rank
from tagplan.planner.sim.taskgraph import COMPUTE, TRANSFER, TaskGraph

# (model, batch or None for the zoo's, cluster name, cluster) of the compiled rows
COMPILED = [
    ("resnet101", None, "scale:64", "scale:64"),
    ("bert_large", None, "scale:64", "scale:64"),
    ("inception_v3", 4096, "8 x 8 P100, 10 Gbit/s", cluster_spec(8, 8)),
]


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


def _median_s(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _median_rate(n: int, fn: Callable[[], object], runs: int) -> float:
    return n / _median_s(fn, runs)


def _loop_arrays(tg: TaskGraph) -> tuple:
    """The arguments of :func:`engine.schedule` before its two modes."""
    return (
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


def _routes_at_once(tg: TaskGraph, start_s: np.ndarray, finish_s: np.ndarray) -> int:
    """The most distinct routes (links with shares) carrying transfers at one moment."""
    comm = np.flatnonzero((tg.task_kind != COMPUTE) & (np.diff(tg.link_ptr) > 0))
    keys = [
        (tuple(tg.link_index[a:b]), tuple(tg.link_share[a:b]))
        for a, b in zip(tg.link_ptr[comm], tg.link_ptr[comm + 1], strict=True)
    ]
    route = np.unique(np.array([hash(k) for k in keys]), return_inverse=True)[1]
    # finishes before starts at one time; a route is busy while it has a flow
    events = sorted(
        [(float(start_s[x]), 1, int(r)) for x, r in zip(comm, route, strict=True)]
        + [(float(finish_s[x]), -1, int(r)) for x, r in zip(comm, route, strict=True)]
    )
    flows = np.zeros(len(route) and route.max() + 1, dtype=np.int64)
    busy = most = 0
    for _, change, r in events:
        was = flows[r]
        flows[r] += change
        busy += int(flows[r] > 0) - int(was > 0)
        most = max(most, busy)
    return most


def compiled_rows(runs: int) -> list[dict]:
    """DP-PS of each :data:`COMPILED` case compiled per GPU, its loop timed."""
    rows = []
    for model, batch, name, cluster_source in COMPILED:
        tg = dp_ps_graph(model, batch, cluster_source)[3]
        arrays = _loop_arrays(tg)
        start_s, finish_s, _, _ = engine.schedule(*arrays, False, True)
        rows.append(
            {
                "case": f"{model} {name}",
                "tasks": tg.num_tasks,
                "transfers": int((tg.task_kind != COMPUTE).sum()),
                "routes": _routes_at_once(tg, start_s, finish_s),
                "seconds": _median_s(lambda a=arrays: engine.schedule(*a, False, True), runs),
                "step_s": float(np.nanmax(finish_s)),
            }
        )
        print(rows[-1], flush=True)
    return rows


def _rates(tg: TaskGraph, runs: int, link_model: LinkModel) -> dict[str, float]:
    """M tasks/s of ``simulate`` and of the loop alone, FIFO and by upward rank."""
    n = tg.num_tasks
    shared = link_model == "shared"
    arrays = _loop_arrays(tg)
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
    add_comparison_arguments(parser)
    args = parser.parse_args()

    for model in LINK_MODELS:
        for incast in (False, True):
            small = synthetic_step(10, incast=incast)
            simulate(small, link_model=model)
            simulate(small, use_priority=True, link_model=model)
    upward_rank(small)
    compiled = compiled_rows(args.runs)
    if kept_for_later(args, compiled):
        return
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
    before = rows_before(args)
    label = f" {args.before_label} (s) | over {args.before_label} |" if before else ""
    lines += [
        "",
        "Compiled steps: DP-PS (every parameter on a server, the servers spread over every "
        "GPU) compiled per GPU at the zoo's batch (Inception-v3 at 4,096), the shared-link "
        f"loop alone in FIFO mode, median of {args.runs}. *routes at once*: the most "
        "distinct routes carrying flows at one moment." + before_note(args, before),
        "",
        "| case | tasks | transfers | routes at once | step (s) | loop (s) |" + label,
        "| --- | ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if before else ""),
    ]
    for row in compiled:
        lines.append(
            f"| {row['case']} | {row['tasks']:,} | {row['transfers']:,} | {row['routes']:,} "
            f"| {row['step_s']:.3f} | {row['seconds']:.3f} |"
            + before_cells(before.get(row["case"]), "seconds", row["seconds"], 3)
        )
    write_section(
        "sim-throughput",
        "Simulator throughput",
        f"python -m bench.sim_throughput --layers {args.layers} --runs {args.runs}",
        "\n".join(lines),
    )


if __name__ == "__main__":
    main()
