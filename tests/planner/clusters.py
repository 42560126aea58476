"""Small clusters the planner tests build."""

from __future__ import annotations

from tagplan.planner.topology import Cluster, load_cluster


def gpus(
    kind: str,
    machines: int,
    per_machine: int,
    *,
    memory_gib: float | None = None,
    network_gbps: float = 25,
) -> Cluster:
    """``machines`` machines of ``per_machine`` GPUs of ``kind`` joined by ``network_gbps``;
    with ``memory_gib``, a made-up GPU type of that memory."""
    spec: dict = {
        "machines": [
            {
                "name": f"m{i}",
                "gpus": {"type": kind, "count": per_machine},
                "intra_bandwidth_gbps": 96,
            }
            for i in range(machines)
        ],
        "network": {"bandwidth_gbps": network_gbps},
    }
    if memory_gib is not None:
        spec["gpu_types"] = [
            {
                "name": kind,
                "fp32_tflops": 10,
                "memory_bandwidth_gb_per_s": 500,
                "memory_gib": memory_gib,
            }
        ]
    return load_cluster(spec)
