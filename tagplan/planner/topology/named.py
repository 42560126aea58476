"""Named clusters: TAG's testbed and cloud (§5.2), its random topology generator, and
allocations of the size a cloud scheduler hands out (``scale:N``).

Interconnect figures used below:

- NVLink-class machines: 1200 Gbps, the aggregate NVLink 2 bandwidth of one V100 SXM2
  (6 links x 25 GB/s per direction). Per-pair rates in a 4-GPU mesh are lower; give
  them in a spec file when they matter.
- PCIe-class machines: 96 Gbps, a measured PCIe 3.0 x16 peer copy (about 12 GB/s of
  the 15.75 GB/s theoretical).

The random generator follows TAG §5.2: 1–6 machines, 1–8 GPUs per machine, all GPUs of
a machine of one type drawn from :data:`RANDOM_GPU_TYPES`, intra-machine bandwidth in
[64, 160] Gbps ("to simulate the absence or presence of NVLink") and inter-machine
bandwidth in [20, 50] Gbps ("to reflect different machine locations"). TAG does not
say how the inter-machine figure varies; here each machine draws an uplink rate to the
switch and a pair of machines talks at the slower of their two uplinks, which is the
bottleneck of the path through one switch. ``random:SEED:M`` draws the same way with
exactly ``M`` machines, up to :data:`RANDOM_MAX_MACHINES` (larger than TAG's).

``scale:N`` (``N`` a multiple of 8, 16 to 1024) is ``N / 8`` machines of 8 GPUs cycling
through three kinds, as a large shared pool mixes generations: V100-32GB and A100-40GB
over NVLink (4800 Gbps for the A100's NVLink 3), T4 over PCIe. Machines talk at 200 Gbps,
at 100 Gbps where a T4 machine (a PCIe host with one slower NIC) is one end.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInput
from .schema import ClusterSpec

__all__ = [
    "CLOUD_INTER_GBPS",
    "NVLINK_GBPS",
    "PCIE_GBPS",
    "RANDOM_GPU_TYPES",
    "TESTBED_INTER_GBPS",
    "NamedCluster",
    "list_named_clusters",
    "named_cluster_spec",
    "random_cluster_spec",
    "scale_cluster_spec",
    "tag_cloud_spec",
    "tag_testbed_spec",
]

NVLINK_GBPS: float = 1200.0
"""Intra-machine bandwidth of an NVLink-class machine (V100 SXM2 aggregate NVLink 2)."""
PCIE_GBPS: float = 96.0
"""Intra-machine bandwidth of a PCIe-class machine (measured PCIe 3.0 x16 peer copy)."""
TESTBED_INTER_GBPS: float = 100.0
"""The testbed's switch (TAG §5.2)."""
CLOUD_INTER_GBPS: float = 10.0
"""Bandwidth between the cloud cluster's machines (TAG §5.2)."""

RANDOM_GPU_TYPES: tuple[str, ...] = ("V100-16GB", "GTX-1080Ti", "P100", "T4")
"""GPU types of random clusters: TAG's testbed types plus the cloud's T4."""
RANDOM_MACHINES = (1, 6)
RANDOM_GPUS_PER_MACHINE = (1, 8)
RANDOM_INTRA_GBPS = (64.0, 160.0)
RANDOM_INTER_GBPS = (20.0, 50.0)
RANDOM_MAX_MACHINES = 32
NVLINK3_GBPS: float = 4800.0
"""Intra-machine bandwidth of an A100 NVLink 3 machine (12 links x 50 GB/s per direction)."""
SCALE_MACHINE_KINDS: tuple[tuple[str, float], ...] = (
    ("V100-32GB", NVLINK_GBPS),
    ("A100-40GB", NVLINK3_GBPS),
    ("T4", PCIE_GBPS),
)
SCALE_INTER_GBPS = (200.0, 100.0)  # between NVLink machines; with a T4 machine at one end


@dataclass(frozen=True)
class NamedCluster:
    """A built-in cluster name, what it is, and a name that resolves (for listings)."""

    name: str
    description: str
    example: str


def tag_testbed_spec() -> ClusterSpec:
    """TAG §5.2 testbed: 7 machines, 16 GPUs on a 100 Gbps switch.

    One machine with 4 V100-32GB over NVLink, four with 2 GTX-1080Ti over PCIe and two
    with 2 P100 over PCIe.
    """
    machines = [_machine("v100-0", "V100-32GB", 4, NVLINK_GBPS)]
    machines += [_machine(f"gtx1080ti-{i}", "GTX-1080Ti", 2, PCIE_GBPS) for i in range(4)]
    machines += [_machine(f"p100-{i}", "P100", 2, PCIE_GBPS) for i in range(2)]
    return ClusterSpec.model_validate(
        {"machines": machines, "network": {"bandwidth_gbps": TESTBED_INTER_GBPS}}
    )


def tag_cloud_spec() -> ClusterSpec:
    """TAG §5.2 cloud: 2 machines with 8 V100-16GB and 4 with 4 T4, 32 GPUs, 10 Gbps.

    V100 machines are NVLink-class (8-GPU SXM2 cloud instances); T4 machines PCIe-class.
    """
    machines = [_machine(f"v100-{i}", "V100-16GB", 8, NVLINK_GBPS) for i in range(2)]
    machines += [_machine(f"t4-{i}", "T4", 4, PCIE_GBPS) for i in range(4)]
    return ClusterSpec.model_validate(
        {"machines": machines, "network": {"bandwidth_gbps": CLOUD_INTER_GBPS}}
    )


def random_cluster_spec(seed: int, machines: int | None = None) -> ClusterSpec:
    """A random topology as TAG §5.2 generates them; the same ``seed`` gives the same spec.
    ``machines`` fixes the number of machines (1 to :data:`RANDOM_MAX_MACHINES`) instead
    of drawing 1–6.

    Bandwidths are rounded to 0.1 Gbps so the spec reads well; they stay in range.
    """
    if machines is not None and not 1 <= machines <= RANDOM_MAX_MACHINES:
        raise InvalidInput(
            f"a random cluster has 1 to {RANDOM_MAX_MACHINES} machines, not {machines}"
        )
    rng = np.random.default_rng(seed)
    drawn = int(rng.integers(RANDOM_MACHINES[0], RANDOM_MACHINES[1] + 1))
    num_machines = drawn if machines is None else machines
    return ClusterSpec.model_validate(
        {
            "machines": _random_machines(rng, num_machines),
            "network": _pair_network(
                np.round(rng.uniform(*RANDOM_INTER_GBPS, size=num_machines), 1)
            ),
        }
    )


def _random_machines(rng: np.random.Generator, num_machines: int) -> list[dict[str, object]]:
    machines = []
    for m in range(num_machines):
        gpu_type = RANDOM_GPU_TYPES[int(rng.integers(len(RANDOM_GPU_TYPES)))]
        count = int(rng.integers(RANDOM_GPUS_PER_MACHINE[0], RANDOM_GPUS_PER_MACHINE[1] + 1))
        intra = round(float(rng.uniform(*RANDOM_INTRA_GBPS)), 1)
        machines.append(_machine(f"m{m}", gpu_type, count, intra))
    return machines


def _pair_network(uplink: np.ndarray) -> dict[str, object]:
    """Machines ``m0, m1, ...`` whose pairs talk at the slower of their two uplinks; the
    most common pair rate is the default, the others are listed."""
    num_machines = len(uplink)
    pairs = {
        (a, b): float(min(uplink[a], uplink[b]))
        for a in range(num_machines)
        for b in range(a + 1, num_machines)
    }
    network: dict[str, object] = {"bandwidth_gbps": float(uplink.max())}
    if pairs:
        # The most common pair rate becomes the default (the faster one on a tie).
        counts = collections.Counter(pairs.values())
        default = max(counts, key=lambda rate: (counts[rate], rate))
        network["bandwidth_gbps"] = default
        network["links"] = [
            {"between": [f"m{a}", f"m{b}"], "bandwidth_gbps": rate}
            for (a, b), rate in pairs.items()
            if rate != default
        ]
    return network


def scale_cluster_spec(num_gpus: int) -> ClusterSpec:
    """``scale:N``: ``N / 8`` machines of 8 GPUs (module docstring)."""
    if num_gpus % 8 or not 16 <= num_gpus <= 1024:
        raise InvalidInput(f"scale:N needs N a multiple of 8 from 16 to 1024, not {num_gpus}")
    kinds = [SCALE_MACHINE_KINDS[m % len(SCALE_MACHINE_KINDS)] for m in range(num_gpus // 8)]
    machines = [_machine(f"m{m}", kind, 8, intra) for m, (kind, intra) in enumerate(kinds)]
    fast, slow = SCALE_INTER_GBPS
    uplink = np.array([slow if kind == "T4" else fast for kind, _ in kinds])
    return ClusterSpec.model_validate({"machines": machines, "network": _pair_network(uplink)})


def list_named_clusters() -> list[NamedCluster]:
    """The built-in cluster names, for a CLI listing."""
    return [
        NamedCluster(
            "testbed",
            "TAG §5.2 testbed: 1x4 V100-32GB NVLink, 4x2 GTX-1080Ti, "
            "2x2 P100 (PCIe), 100 Gbps switch; 16 GPUs",
            "testbed",
        ),
        NamedCluster("cloud", "TAG §5.2 cloud: 2x8 V100-16GB + 4x4 T4, 10 Gbps; 32 GPUs", "cloud"),
        NamedCluster(
            "random:SEED",
            "TAG §5.2 random topology: 1-6 machines, 1-8 GPUs each "
            "of one type, intra 64-160 Gbps, inter 20-50 Gbps",
            "random:0",
        ),
        NamedCluster(
            "random:SEED:M",
            f"the same with exactly M machines (1-{RANDOM_MAX_MACHINES})",
            "random:0:4",
        ),
        NamedCluster(
            "scale:N",
            "N/8 machines of 8 GPUs (V100-32GB, A100-40GB NVLink, T4 PCIe in turn), "
            "200 Gbps, 100 Gbps to T4 machines; N a multiple of 8, 16-1024",
            "scale:64",
        ),
    ]


def named_cluster_spec(name: str) -> ClusterSpec:
    """The spec of a built-in cluster: ``testbed``, ``cloud``, ``random:SEED``,
    ``random:SEED:M`` or ``scale:N``."""
    key = name.strip()
    if key.lower() == "testbed":
        return tag_testbed_spec()
    if key.lower() == "cloud":
        return tag_cloud_spec()
    if key.lower().startswith("random:"):
        numbers = [part.strip() for part in key.split(":")[1:]]
        if len(numbers) > 2 or not all(n.isascii() and n.isdigit() for n in numbers):
            raise InvalidInput(
                f"malformed random cluster {name!r}: expected random:SEED or random:SEED:M "
                "with non-negative integers, e.g. random:7 or random:7:24"
            )
        machines = int(numbers[1]) if len(numbers) == 2 else None
        return random_cluster_spec(int(numbers[0]), machines)
    if key.lower().startswith("scale:"):
        count = key.split(":", 1)[1].strip()
        if not (count.isascii() and count.isdigit()):
            raise InvalidInput(f"malformed scale cluster {name!r}: expected scale:N, e.g. scale:64")
        return scale_cluster_spec(int(count))
    known = ", ".join(c.name for c in list_named_clusters())
    raise InvalidInput(f"unknown named cluster {name!r}; known names: {known}")


def _machine(name: str, gpu_type: str, count: int, intra_gbps: float) -> dict[str, object]:
    return {
        "name": name,
        "gpus": {"type": gpu_type, "count": count},
        "intra_bandwidth_gbps": intra_gbps,
    }
