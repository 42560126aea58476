"""``tagplan profile`` and ``tagplan profile-comm``: measurements the cost model prefers
over its estimates (TAG §4.1.2). Both run TensorFlow on whatever devices it sees."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tagplan.cli.common import GraphArgument, console, user_errors
from tagplan.planner.errors import InvalidInput


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InvalidInput(
            f"batch sizes must be integers separated by commas, got {text!r}"
        ) from None
    if not sizes:
        raise InvalidInput("give at least one batch size")
    return sizes


def profile_command(
    graph: GraphArgument,
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile file to write (JSON).")],
    gpu_type: Annotated[
        str, typer.Option("--gpu-type", help="Catalog name the times are recorded under.")
    ] = "CPU",
    device: Annotated[str, typer.Option(help="TensorFlow device to run on.")] = "/CPU:0",
    batch_sizes: Annotated[
        str, typer.Option("--batch-sizes", help="Comma-separated batch sizes.")
    ] = "8,16,32",
    runs: Annotated[int, typer.Option(help="Traced runs per batch size (median).")] = 5,
    warmup: Annotated[int, typer.Option(help="Untraced runs first.")] = 2,
) -> None:
    """Run a training graph with TensorFlow tracing and record every op's time."""
    with user_errors():
        from tagplan.planner.cost.profile import dumps_profile
        from tagplan.planner.cost.profiler import profile_graph

        with console.status(f"profiling {graph} on {device}"):
            profile = profile_graph(
                graph,
                device=device,
                gpu_type=gpu_type,
                batch_sizes=_sizes(batch_sizes),
                runs=runs,
                warmup=warmup,
            )
        out.write_text(dumps_profile(profile))
    steps = ", ".join(f"batch {b}: {s * 1e3:,.1f} ms" for b, s in profile.step_time_s.items())
    console.print(f"{len(profile.ops):,} cost keys profiled ({steps}) -> {out}")


def profile_comm_command(
    out: Annotated[Path, typer.Option("--out", "-o", help="Comm profile file to write (JSON).")],
    devices: Annotated[int, typer.Option(help="Devices to measure among.")] = 4,
    min_bytes: Annotated[int, typer.Option(help="Smallest transfer.")] = 1024,
    max_bytes: Annotated[int, typer.Option(help="Largest transfer.")] = 256 << 20,
    repeats: Annotated[int, typer.Option(help="Timed runs per size (median).")] = 5,
) -> None:
    """Measure point-to-point and AllReduce transfers and fit segmented-linear models."""
    with user_errors():
        from tagplan.planner.cost.comm_profile import dump_comm_profile
        from tagplan.planner.cost.comm_profiler import profile_comm

        with console.status(f"measuring transfers among {devices} devices"):
            profile = profile_comm(
                devices=devices, min_bytes=min_bytes, max_bytes=max_bytes, repeats=repeats
            )
        dump_comm_profile(profile, out)
    console.print(
        f"{len(profile.measurements):,} measurements, models for "
        f"p2p and AllReduce over {', '.join(sorted(profile.allreduce))} devices -> {out}"
    )
