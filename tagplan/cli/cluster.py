"""``tagplan cluster``: a GPU allocation as the planner sees it (docs/design.md §2)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from tagplan.cli.common import console, print_json, user_errors
from tagplan.planner.topology import describe, list_named_clusters, load_cluster


def cluster_command(
    cluster: Annotated[
        str | None,
        typer.Argument(help="A cluster file (YAML/JSON) or a named cluster; omit to list names."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Show a cluster: machines, GPUs, device groups, bandwidths and its fingerprint."""
    if cluster is None:
        named = list_named_clusters()
        if as_json:
            print_json(
                {"named_clusters": [{"name": n.name, "description": n.description} for n in named]}
            )
            return
        for entry in named:
            console.print(f"[bold]{entry.name}[/]  {entry.description}")
        return
    with user_errors():
        resolved = load_cluster(cluster)
    summary = describe(resolved)
    if as_json:
        print_json(summary)
        return
    table = Table(title=f"{cluster}: {summary['gpus']} GPUs on {summary['machines']} machines")
    for column in ("device group", "GPUs", "intra Gbps", "peak FP32 TFLOPs", "memory GiB"):
        table.add_column(column, justify="left" if column == "device group" else "right")
    for group in range(resolved.num_groups):
        devices = resolved.group_devices(group)
        first = int(devices[0])
        table.add_row(
            resolved.group_names[group],
            str(len(devices)),
            f"{resolved.group_intra_bandwidth_bytes_per_s[group] * 8 / 1e9:,.0f}",
            f"{resolved.device_peak_fp32_flops[first] / 1e12:,.1f}",
            f"{resolved.device_memory_bytes[first] / 2**30:,.0f}",
        )
    console.print(table)
    console.print(
        f"total {summary['total_peak_fp32_tflops']:,.1f} TFLOPs FP32, "
        f"{summary['total_memory_gib']:,.0f} GiB; fingerprint {summary['fingerprint'][:16]}"
    )
