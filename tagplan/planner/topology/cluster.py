"""The resolved cluster: numpy arrays in bytes, seconds and FLOP/s.

:meth:`Cluster.from_spec` turns a validated :class:`ClusterSpec` into arrays the cost
model, simulator and search index millions of times, converting units once
(:mod:`.units`). Numbering:

- **machines** in spec order;
- **devices** (GPUs) by machine, then by GPU index on the machine; device ``d`` is
  named ``"<machine>/GPU:<index>"``;
- **GPU types**: only the types in use, sorted by name;
- **device groups** (TAG §4.2: "a group of homogeneous GPUs, i.e., a set of GPUs of the
  same type with the same bandwidth between each pair"): the GPUs of one type on one
  machine, ordered by machine, then type name; group ``g`` is named
  ``"<machine>/<type>"``.

Link model: machines hang off one switch. Two GPUs of one machine talk at the
machine's ``intra_bandwidth_gbps``; GPUs on different machines at the pair's
``network.links`` override when there is one, else at ``network.bandwidth_gbps``.
That one number is the bottleneck of the path (the cost model prices a transfer as
latency + bytes / bandwidth, docs/design.md §3). A device's bandwidth to itself is ``inf`` and its
latency ``0``: a tensor that stays on its GPU costs no transfer.

Shapes: ``M`` machines, ``D`` devices, ``T`` GPU types, ``G`` device groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np

from ..errors import InvalidInput
from .schema import ClusterSpec
from .units import BYTES_PER_GB, FLOPS_PER_TFLOPS, gbps_to_bytes_per_s, gib_to_bytes, us_to_s

__all__ = ["Cluster", "PathInfo"]


class PathInfo(NamedTuple):
    """The path between two devices: where it runs and its bottleneck figures."""

    kind: Literal["device", "intra", "inter"]
    """``device`` (same GPU), ``intra`` (same machine) or ``inter`` (two machines)."""
    bandwidth_bytes_per_s: float
    latency_s: float


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@dataclass(frozen=True, eq=False, repr=False, kw_only=True)
class Cluster:
    """A GPU allocation resolved to arrays (see the module docstring for numbering).

    Build it with :meth:`from_spec` (or ``load_cluster``); every array is read-only.
    """

    spec: ClusterSpec
    """The validated input this cluster was built from; :meth:`to_spec` returns a copy."""

    machine_names: tuple[str, ...]
    machine_intra_bandwidth_bytes_per_s: np.ndarray
    """(M,) float64: bandwidth between two GPUs of each machine."""
    machine_intra_latency_s: np.ndarray
    """(M,) float64: latency between two GPUs of each machine."""
    machine_bandwidth_bytes_per_s: np.ndarray
    """(M, M) float64: network bandwidth between machines; the diagonal is the intra figure."""
    machine_latency_s: np.ndarray
    """(M, M) float64: network latency between machines; the diagonal is the intra figure."""

    type_names: tuple[str, ...]
    type_peak_fp32_flops: np.ndarray
    """(T,) float64: peak FP32 FLOP/s."""
    type_peak_fp16_flops: np.ndarray
    """(T,) float64: peak FP16 FLOP/s (dense tensor-core rate; FP32 rate when unknown)."""
    type_peak_tf32_flops: np.ndarray
    """(T,) float64: peak FLOP/s of float32 convolutions and matrix products (the dense
    TF32 tensor-core rate TensorFlow uses by default; FP32 rate when the GPU has none)."""
    type_winograd: np.ndarray
    """(T,) bool: the GPU's convolution library offers Winograd algorithms for 3x3
    convolutions (:mod:`tagplan.planner.cost.conv_algo`)."""
    type_gemm_tile: np.ndarray
    """(T,) int64: side of the output tile the GPU's libraries compute matrix products in;
    0 where they do not tile them (:mod:`tagplan.planner.cost.gemm_shape`)."""
    type_multiprocessors: np.ndarray
    """(T,) int64: streaming multiprocessors; 0 where unknown
    (:mod:`tagplan.planner.cost.channel_streams`)."""
    type_memory_bytes: np.ndarray
    """(T,) int64: device memory."""
    type_memory_bandwidth_bytes_per_s: np.ndarray
    """(T,) float64: peak device-memory bandwidth."""

    device_names: tuple[str, ...]
    device_machine: np.ndarray
    """(D,) int32: machine of each device."""
    device_local_index: np.ndarray
    """(D,) int32: GPU index of each device on its machine."""
    device_type: np.ndarray
    """(D,) int32: index into ``type_names``."""
    device_peak_fp32_flops: np.ndarray
    """(D,) float64: ``type_peak_fp32_flops[device_type]``."""
    device_memory_bytes: np.ndarray
    """(D,) int64: ``type_memory_bytes[device_type]``."""
    device_memory_bandwidth_bytes_per_s: np.ndarray
    """(D,) float64: ``type_memory_bandwidth_bytes_per_s[device_type]``."""
    bandwidth_bytes_per_s: np.ndarray
    """(D, D) float64: path bottleneck bandwidth; ``inf`` on the diagonal."""
    latency_s: np.ndarray
    """(D, D) float64: path latency; ``0`` on the diagonal."""

    group_names: tuple[str, ...]
    group_of_device: np.ndarray
    """(D,) int32: device group of each device."""
    group_machine: np.ndarray
    """(G,) int32: machine of each group."""
    group_type: np.ndarray
    """(G,) int32: GPU type of each group."""
    group_size: np.ndarray
    """(G,) int32: number of GPUs in each group."""
    group_ptr: np.ndarray
    """(G + 1,) int32: CSR offsets into ``group_members``."""
    group_members: np.ndarray
    """(D,) int32: devices of group ``g`` are ``group_members[group_ptr[g]:group_ptr[g+1]]``."""
    group_intra_bandwidth_bytes_per_s: np.ndarray
    """(G,) float64: bandwidth between any two GPUs of a group (its machine's intra
    figure, also for one-GPU groups, so GNN features stay finite)."""
    group_bandwidth_bytes_per_s: np.ndarray
    """(G, G) float64: bandwidth between groups; the diagonal is the intra-group figure."""
    group_latency_s: np.ndarray
    """(G, G) float64: latency between groups; the diagonal is the intra-group figure."""

    @classmethod
    def from_spec(cls, spec: ClusterSpec) -> Cluster:
        """Resolve a validated spec: look up GPU types, convert units, build groups."""
        spec = spec.model_copy(deep=True)
        table = spec.type_table()
        machines = spec.machines
        num_machines = len(machines)

        dev_machine: list[int] = []
        dev_index: list[int] = []
        dev_type_name: list[str] = []
        for m, machine in enumerate(machines):
            for index, type_name in machine.gpu_slots():
                dev_machine.append(m)
                dev_index.append(index)
                dev_type_name.append(type_name)

        type_names = tuple(sorted(set(dev_type_name)))
        type_of = {name: t for t, name in enumerate(type_names)}
        types = [table[name] for name in type_names]
        type_fp32 = np.array([t.fp32_tflops for t in types], dtype=np.float64) * FLOPS_PER_TFLOPS
        type_fp16 = (
            np.array([t.fp16_tflops or t.fp32_tflops for t in types], dtype=np.float64)
            * FLOPS_PER_TFLOPS
        )
        type_tf32 = (
            np.array([t.tf32_tflops or t.fp32_tflops for t in types], dtype=np.float64)
            * FLOPS_PER_TFLOPS
        )
        type_winograd = np.array([t.winograd for t in types], dtype=bool)
        type_gemm_tile = np.array([t.gemm_tile or 0 for t in types], dtype=np.int64)
        type_multiprocessors = np.array([t.multiprocessors or 0 for t in types], dtype=np.int64)
        type_mem = np.array([gib_to_bytes(t.memory_gib) for t in types], dtype=np.int64)
        type_mem_bw = (
            np.array([t.memory_bandwidth_gb_per_s for t in types], dtype=np.float64) * BYTES_PER_GB
        )

        intra_bw = np.array([gbps_to_bytes_per_s(m.intra_bandwidth_gbps) for m in machines])
        intra_lat = np.array([us_to_s(m.intra_latency_us) for m in machines])
        machine_bw = np.zeros((num_machines, num_machines), dtype=np.float64)
        machine_lat = np.zeros((num_machines, num_machines), dtype=np.float64)
        if spec.network is not None:
            machine_bw[:] = gbps_to_bytes_per_s(spec.network.bandwidth_gbps)
            machine_lat[:] = us_to_s(spec.network.latency_us)
            index_of = {m.name: i for i, m in enumerate(machines)}
            for link in spec.network.links:
                a, b = (index_of[end] for end in link.between)
                machine_bw[a, b] = machine_bw[b, a] = gbps_to_bytes_per_s(link.bandwidth_gbps)
                if link.latency_us is not None:
                    machine_lat[a, b] = machine_lat[b, a] = us_to_s(link.latency_us)
        np.fill_diagonal(machine_bw, intra_bw)
        np.fill_diagonal(machine_lat, intra_lat)

        d_machine = np.array(dev_machine, dtype=np.int32)
        d_type = np.array([type_of[name] for name in dev_type_name], dtype=np.int32)
        bandwidth = machine_bw[np.ix_(d_machine, d_machine)]
        latency = machine_lat[np.ix_(d_machine, d_machine)]
        np.fill_diagonal(bandwidth, np.inf)
        np.fill_diagonal(latency, 0.0)

        # Groups sorted by (machine, type name): type indices already follow name order.
        keys = d_machine.astype(np.int64) * len(type_names) + d_type
        group_keys, group_of_device = np.unique(keys, return_inverse=True)
        g_machine = (group_keys // len(type_names)).astype(np.int32)
        g_type = (group_keys % len(type_names)).astype(np.int32)
        g_size = np.bincount(group_of_device, minlength=len(group_keys)).astype(np.int32)
        g_ptr = np.concatenate([[0], np.cumsum(g_size)]).astype(np.int32)
        g_members = np.argsort(group_of_device, kind="stable").astype(np.int32)
        names = [m.name for m in machines]

        return cls(
            spec=spec,
            machine_names=tuple(names),
            machine_intra_bandwidth_bytes_per_s=_frozen(intra_bw),
            machine_intra_latency_s=_frozen(intra_lat),
            machine_bandwidth_bytes_per_s=_frozen(machine_bw),
            machine_latency_s=_frozen(machine_lat),
            type_names=type_names,
            type_peak_fp32_flops=_frozen(type_fp32),
            type_peak_fp16_flops=_frozen(type_fp16),
            type_peak_tf32_flops=_frozen(type_tf32),
            type_winograd=_frozen(type_winograd),
            type_gemm_tile=_frozen(type_gemm_tile),
            type_multiprocessors=_frozen(type_multiprocessors),
            type_memory_bytes=_frozen(type_mem),
            type_memory_bandwidth_bytes_per_s=_frozen(type_mem_bw),
            device_names=tuple(
                f"{names[m]}/GPU:{i}" for m, i in zip(dev_machine, dev_index, strict=True)
            ),
            device_machine=_frozen(d_machine),
            device_local_index=_frozen(np.array(dev_index, dtype=np.int32)),
            device_type=_frozen(d_type),
            device_peak_fp32_flops=_frozen(type_fp32[d_type]),
            device_memory_bytes=_frozen(type_mem[d_type]),
            device_memory_bandwidth_bytes_per_s=_frozen(type_mem_bw[d_type]),
            bandwidth_bytes_per_s=_frozen(bandwidth),
            latency_s=_frozen(latency),
            group_names=tuple(
                f"{names[m]}/{type_names[t]}" for m, t in zip(g_machine, g_type, strict=True)
            ),
            group_of_device=_frozen(group_of_device.astype(np.int32)),
            group_machine=_frozen(g_machine),
            group_type=_frozen(g_type),
            group_size=_frozen(g_size),
            group_ptr=_frozen(g_ptr),
            group_members=_frozen(g_members),
            group_intra_bandwidth_bytes_per_s=_frozen(intra_bw[g_machine]),
            group_bandwidth_bytes_per_s=_frozen(machine_bw[np.ix_(g_machine, g_machine)]),
            group_latency_s=_frozen(machine_lat[np.ix_(g_machine, g_machine)]),
        )

    @property
    def num_machines(self) -> int:
        """Number of machines ``M``."""
        return len(self.machine_names)

    @property
    def num_devices(self) -> int:
        """Number of GPUs ``D``."""
        return len(self.device_names)

    @property
    def num_types(self) -> int:
        """Number of GPU types in use ``T``."""
        return len(self.type_names)

    @property
    def num_groups(self) -> int:
        """Number of device groups ``G``."""
        return len(self.group_names)

    def to_spec(self) -> ClusterSpec:
        """The input form of this cluster (a copy, safe to edit)."""
        return self.spec.model_copy(deep=True)

    def device_index(self, name: str) -> int:
        """The device named ``"<machine>/GPU:<index>"``."""
        try:
            return self.device_names.index(name)
        except ValueError:
            raise InvalidInput(
                f"unknown device {name!r}; devices are named like {self.device_names[0]!r}"
            ) from None

    def machine_devices(self, machine: int) -> np.ndarray:
        """Devices of ``machine``, in device order."""
        return np.flatnonzero(self.device_machine == machine)

    def group_type_name(self, group: int) -> str:
        """GPU type name of device group ``group``."""
        return self.type_names[int(self.group_type[group])]

    def group_devices(self, group: int) -> np.ndarray:
        """Devices of device group ``group``, in device order."""
        return self.group_members[self.group_ptr[group] : self.group_ptr[group + 1]]

    def path(self, a: int, b: int) -> PathInfo:
        """Bottleneck bandwidth and latency of the path from device ``a`` to ``b``.

        Same machine: the machine's intra figures. Different machines: the pair's link
        override, else the network default (one switch, so no multi-hop minimum).
        """
        if a == b:
            kind: Literal["device", "intra", "inter"] = "device"
        elif self.device_machine[a] == self.device_machine[b]:
            kind = "intra"
        else:
            kind = "inter"
        return PathInfo(kind, float(self.bandwidth_bytes_per_s[a, b]), float(self.latency_s[a, b]))

    def min_bandwidth_bytes_per_s(self, devices: np.ndarray | list[int]) -> float:
        """The slowest pairwise path among ``devices`` (B_min of a ring AllReduce).

        ``inf`` for a single device, which needs no communication.
        """
        idx = np.asarray(devices, dtype=np.int64)
        if idx.size < 2:
            return float("inf")
        return float(self.bandwidth_bytes_per_s[np.ix_(idx, idx)].min())

    def __repr__(self) -> str:
        return (
            f"Cluster({self.num_machines} machines, {self.num_devices} GPUs, "
            f"{self.num_groups} device groups: {', '.join(self.group_names)})"
        )
