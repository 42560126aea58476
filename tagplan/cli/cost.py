"""``tagplan cost``: what one training step of a graph costs on one GPU type."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.table import Table

from tagplan.cli.common import (
    BatchInputOption,
    BatchSizeOption,
    GraphArgument,
    LossOption,
    analyze_source,
    console,
    print_json,
    user_errors,
)
from tagplan.planner.cost.memory import (
    FRAMEWORK_RESERVE_BYTES,
    op_memory,
    single_device_peak_bytes,
)
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.cost.profile import InMemoryProfileSource, load_profile

MIB = 2**20


def cost_command(
    graph: GraphArgument,
    gpu: Annotated[str, typer.Option("--gpu", help="GPU type from the catalog, e.g. V100-32GB.")],
    batch_size: BatchSizeOption = None,
    loss: LossOption = None,
    batch_input: BatchInputOption = None,
    profile: Annotated[
        list[Path] | None,
        typer.Option("--profile", help="Profile file from `tagplan profile` (repeatable)."),
    ] = None,
    top: Annotated[int, typer.Option(help="How many of the most expensive ops to list.")] = 15,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compute time, the most expensive ops and memory of one step on a single GPU."""
    with user_errors():
        source, ir = analyze_source(graph, batch_size, loss=loss, batch_inputs=batch_input)
        loaded = [load_profile(path) for path in profile or []]
        model = OpCostModel.for_gpu_types(
            ir, profiles=InMemoryProfileSource(loaded) if loaded else None
        )
        for entry in loaded:  # a profile must be of a GPU type the planner knows
            model.type_of(entry.device.gpu_type)
        gpu_type = model.type_of(gpu)
        times = model.op_times(gpu_type, ir.batch_size)
    gpu_name = model.cluster.type_names[gpu_type]
    memory = op_memory(ir)
    peak = single_device_peak_bytes(ir, memory)
    params = ir.param_bytes
    slots = int(ir.parameters.slot_bytes.sum())
    state = int(memory.persistent_bytes.sum()) - params - slots
    capacity = int(model.cluster.type_memory_bytes[gpu_type])
    flops, bytes_moved = model.work.flops, model.work.bytes_moved
    order = np.argsort(-times.seconds)[:top]
    by_type: dict[str, float] = defaultdict(float)
    for op, seconds in enumerate(times.seconds):
        by_type[ir.op_types[op]] += float(seconds)
    summary = {
        "graph": source.label,
        "gpu_type": gpu_name,
        "batch_size": ir.batch_size,
        "compute_time_s": times.total_s,
        "flops": float(flops.sum()),
        "bytes_moved": float(bytes_moved.sum()),
        "param_bytes": params,
        "optimizer_bytes": slots,
        "state_bytes": state,
        "activation_bytes": peak - int(memory.persistent_bytes.sum()),
        "peak_memory_bytes": peak + FRAMEWORK_RESERVE_BYTES,
        "gpu_memory_bytes": capacity,
        "fits": peak + FRAMEWORK_RESERVE_BYTES <= capacity,
        "estimated_fraction": times.estimated_fraction,
        "measured_ops": int(times.measured.sum()),
        "fallback_ops": sum(1 for f in model.work.formula if f == "fallback"),
        "top_ops": [
            {
                "name": ir.op_names[op],
                "type": ir.op_types[op],
                "time_s": float(times.seconds[op]),
                "flops": float(flops[op]),
                "bytes_moved": float(bytes_moved[op]),
                "measured": bool(times.measured[op]),
            }
            for op in order
        ],
        "time_by_op_type_s": dict(sorted(by_type.items(), key=lambda kv: -kv[1])),
    }
    if as_json:
        print_json(summary)
        return
    console.print(
        f"[bold]{source.label}[/] on {gpu_name} at batch size {ir.batch_size}: "
        f"{times.total_s * 1e3:,.1f} ms of compute per step "
        f"({flops.sum() / 1e12:,.2f} TFLOP, {bytes_moved.sum() / 1e9:,.1f} GB moved); "
        f"{100 * times.estimated_fraction:.0f}% of it estimated, "
        f"{times.measured.sum():,} of {ir.num_ops:,} ops measured"
    )
    if summary["fallback_ops"]:
        console.print(
            f"[yellow]{summary['fallback_ops']} ops have no formula (op types the table does "
            "not know): estimated from the bytes they move[/]"
        )
    table = Table(title=f"top {len(order)} ops by time")
    for column in ("op", "type", "ms", "GFLOP", "MB moved", "source"):
        table.add_column(column, justify="left" if column in ("op", "type", "source") else "right")
    for op in order:
        table.add_row(
            ir.op_names[op],
            ir.op_types[op],
            f"{times.seconds[op] * 1e3:,.3f}",
            f"{flops[op] / 1e9:,.2f}",
            f"{bytes_moved[op] / 1e6:,.1f}",
            "measured" if times.measured[op] else "estimated",
        )
    console.print(table)
    console.print(
        f"memory: parameters {params / MIB:,.0f} MiB, optimizer slots {slots / MIB:,.0f} MiB, "
        f"other state {state / MIB:,.1f} MiB, peak activations "
        f"{summary['activation_bytes'] / MIB:,.0f} MiB, framework reserve "
        f"{FRAMEWORK_RESERVE_BYTES / MIB:,.0f} MiB -> "
        f"{summary['peak_memory_bytes'] / 2**30:,.1f} of {capacity / 2**30:g} GiB"
        + ("" if summary["fits"] else " [bold red](does not fit)[/]")
    )
