"""A short, JSON-ready summary of a cluster for listings and the CLI."""

from __future__ import annotations

from typing import Any

import numpy as np

from .canonical import fingerprint
from .cluster import Cluster
from .units import BYTES_PER_GBPS, BYTES_PER_GIB, FLOPS_PER_TFLOPS

__all__ = ["describe"]


def describe(cluster: Cluster) -> dict[str, Any]:
    """Counts, per-type totals, per-machine lines and the fingerprint of ``cluster``.

    Figures are in the schema's units (TFLOP/s, GiB, Gbps) for people to read.
    """
    per_type = np.bincount(cluster.device_type, minlength=cluster.num_types)
    machines = []
    for m, name in enumerate(cluster.machine_names):
        groups = np.flatnonzero(cluster.group_machine == m)
        machines.append(
            {
                "name": name,
                "gpus": ", ".join(
                    f"{cluster.group_size[g]}x {cluster.type_names[cluster.group_type[g]]}"
                    for g in groups
                ),
                "intra_bandwidth_gbps": float(
                    cluster.machine_intra_bandwidth_bytes_per_s[m] / BYTES_PER_GBPS
                ),
            }
        )
    return {
        "machines": cluster.num_machines,
        "gpus": cluster.num_devices,
        "groups": cluster.num_groups,
        "gpu_types": {name: int(per_type[t]) for t, name in enumerate(cluster.type_names)},
        "total_peak_fp32_tflops": round(
            float(cluster.device_peak_fp32_flops.sum() / FLOPS_PER_TFLOPS), 3
        ),
        "total_memory_gib": round(float(cluster.device_memory_bytes.sum() / BYTES_PER_GIB), 3),
        "machine_list": machines,
        "fingerprint": fingerprint(cluster),
    }
