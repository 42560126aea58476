"""Op execution time ``t(op, gpu_type, local_batch)`` (docs/design.md §3, TAG §4.1.2).

A measured profile wins when it has the op's cost key for the GPU type (interpolated
between profiled batch sizes, linear beyond them, TAG §4.1.2). Otherwise the time is the
roofline estimate

    t = max(FLOPs / (peak FLOP/s · e_c), bytes moved / (memory bandwidth · e_m)) + launch

with FLOPs and bytes from :mod:`.work` at the replica's local batch size (convolutions
and matrix products at the GPU's TF32 tensor-core peak where it has one, as TensorFlow
runs float32 math there by default; everything else at the FP32 peak), e_c the
compute efficiency of the op's formula class (dense convolutions and matrix products
reach a good fraction of peak; other kernels much less), e_m the achieved share of
memory bandwidth, and a fixed per-kernel launch overhead. A matrix product's or
convolution's FLOPs are rounded up to whole output tiles where the GPU type names the
tile its libraries compute in (:mod:`.gemm_shape`). A 3x3 stride-1 convolution on
a GPU whose library offers Winograd algorithms takes the time of the fastest algorithm,
direct or Winograd, as TensorFlow's cuDNN autotuning does (:mod:`.conv_algo`). A float32
training batch norm moves its bytes no faster than its channels, each on one
multiprocessor at a fixed rate, can stream them (:mod:`.channel_streams`). Ops that
do no work (constants, variable handles, reshapes) cost nothing. Every time says whether
it was measured.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from tagplan.planner.cost.channel_streams import ChannelStreams
from tagplan.planner.cost.conv_algo import ConvAlgorithms, conv_algorithms
from tagplan.planner.cost.gemm_shape import GemmShapes, gemm_shapes
from tagplan.planner.cost.profile import ProfileSource
from tagplan.planner.cost.work import GraphWork, graph_work
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.topology import (
    Cluster,
    ClusterSpec,
    GpuSlot,
    GpuTypeSpec,
    MachineSpec,
    builtin_catalog,
)

__all__ = ["DEFAULT_EFFICIENCY", "Efficiency", "OpCostModel", "OpTimes"]

_DENSE_FORMULAS = frozenset(
    {
        "conv2d",
        "conv2d_backprop_input",
        "conv2d_backprop_filter",
        "depthwise_conv2d",
        "depthwise_backprop_input",
        "depthwise_backprop_filter",
        "matmul",
        "batch_matmul",
    }
)


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of peak and the per-kernel overhead of the analytic estimate.

    The defaults are the calibration of BENCHMARKS.md ("Cost model calibration"): dense
    kernels at about two thirds of peak FLOP/s, other kernels bandwidth-bound at about 70%
    of peak bandwidth, which is what cuDNN/cuBLAS and Eigen kernels typically achieve; the
    same figures put the CPU's measured op times and published V100/A100 ResNet-50
    throughput within the bars there.
    """

    dense_compute: float = 0.65
    other_compute: float = 0.15
    memory: float = 0.7
    launch_s: float = 5e-6
    # Formula classes whose kernels do no device work at all.
    free_formulas: frozenset[str] = field(
        default_factory=lambda: frozenset({"none", "reference", "metadata"})
    )


DEFAULT_EFFICIENCY = Efficiency()


@dataclass(frozen=True)
class OpTimes:
    """Per-op seconds on one GPU type at one local batch size, and which were measured."""

    seconds: np.ndarray  # float64 per op
    measured: np.ndarray  # bool per op

    @property
    def total_s(self) -> float:
        return float(self.seconds.sum())

    @property
    def estimated_fraction(self) -> float:
        """Share of the total time that comes from the analytic estimate."""
        total = self.seconds.sum()
        return float(self.seconds[~self.measured].sum() / total) if total > 0 else 0.0


class OpCostModel:
    """Op times of one analyzed graph on the GPU types of one :class:`Cluster`.

    GPU types are the cluster's integer type indices (``cluster.device_type`` holds them
    per device) and peaks come from the cluster's converted arrays, so nothing in here
    matches names or converts units. Names meet the model in two places only: a profile
    is looked up by ``cluster.type_names[t]`` (profiles are files keyed by type name), and
    :meth:`type_of` turns a user-given name into an index. Results are cached per
    ``(gpu_type, local_batch)``: the search asks for the same few combinations many times.
    """

    def __init__(
        self,
        ir: GraphIR,
        cluster: Cluster,
        *,
        profiles: ProfileSource | None = None,
        efficiency: Efficiency = DEFAULT_EFFICIENCY,
    ) -> None:
        self.ir = ir
        self.cluster = cluster
        self.work: GraphWork = graph_work(ir)
        self.conv: ConvAlgorithms = conv_algorithms(ir, self.work)
        self.streams = ChannelStreams.of(ir, self.work)
        self.profiles = profiles
        self.efficiency = efficiency
        self._dense = np.array([f in _DENSE_FORMULAS for f in self.work.formula], dtype=bool)
        self._compute_efficiency = np.where(
            self._dense, efficiency.dense_compute, efficiency.other_compute
        )
        self._free = np.array([f in efficiency.free_formulas for f in self.work.formula])
        self._cache: dict[tuple[int, int], OpTimes] = {}

    @cached_property
    def gemm(self) -> GemmShapes:
        """The dense ops' matrix shapes, derived the first time a type with a tile asks."""
        return gemm_shapes(self.ir, self.work)

    @classmethod
    def for_gpu_types(
        cls,
        ir: GraphIR,
        gpu_types: Iterable[GpuTypeSpec] | None = None,
        *,
        profiles: ProfileSource | None = None,
        efficiency: Efficiency = DEFAULT_EFFICIENCY,
    ) -> OpCostModel:
        """A model of GPU types outside any allocation (``tagplan cost``, calibration).

        Its cluster is one machine with one GPU of each type (``None``: every catalog
        type); a type named like a catalog one replaces it.
        """
        specs = list(builtin_catalog().values() if gpu_types is None else gpu_types)
        if not specs:
            raise InvalidInput("no GPU types to price ops on")
        machine = MachineSpec(
            name="gpu-types",
            gpus=[GpuSlot(index=i, type=spec.name) for i, spec in enumerate(specs)],
            intra_bandwidth_gbps=1,
        )
        cluster = Cluster.from_spec(ClusterSpec(gpu_types=specs, machines=[machine]))
        return cls(ir, cluster, profiles=profiles, efficiency=efficiency)

    def type_of(self, name: str) -> int:
        """The cluster's index of GPU type ``name`` (any case), for names given by users."""
        folded = name.casefold()
        for t, type_name in enumerate(self.cluster.type_names):
            if type_name.casefold() == folded:
                return t
        known = ", ".join(sorted(self.cluster.type_names))
        raise InvalidInput(f"unknown GPU type {name!r}; known types: {known}")

    def check_cluster(self, cluster: Cluster) -> None:
        """Fail unless ``cluster`` numbers GPU types as this model does."""
        if cluster is not self.cluster and cluster.type_names != self.cluster.type_names:
            raise InvalidInput(
                f"the cost model prices GPU types {list(self.cluster.type_names)}, "
                f"the cluster has {list(cluster.type_names)}"
            )

    def _check_type(self, gpu_type: int) -> int:
        if not 0 <= gpu_type < self.cluster.num_types:
            raise InvalidInput(
                f"GPU type index {gpu_type} out of range; the cluster has "
                f"{self.cluster.num_types} types: {', '.join(self.cluster.type_names)}"
            )
        return int(gpu_type)

    def estimate(self, gpu_type: int, local_batch: int) -> np.ndarray:
        """The analytic roofline time of every op on type index ``gpu_type``, no profiles."""
        t = self._check_type(gpu_type)
        cluster = self.cluster
        flops, bytes_moved = self.work.at_batch(local_batch, self.ir.batch_size)
        fp32_flops_per_s = float(cluster.type_peak_fp32_flops[t])
        peak_flops_per_s = np.where(
            self._dense, float(cluster.type_peak_tf32_flops[t]), fp32_flops_per_s
        )
        memory_bytes_per_s = (
            float(cluster.type_memory_bandwidth_bytes_per_s[t]) * self.efficiency.memory
        )
        tile = int(cluster.type_gemm_tile[t])
        if tile:
            flops = flops * self.gemm.padding_at(local_batch, self.ir.batch_size, tile)
        seconds = np.maximum(
            flops / (peak_flops_per_s * self._compute_efficiency),
            bytes_moved / memory_bytes_per_s,
        )
        seconds = np.maximum(
            seconds,
            self.streams.bound_s(bytes_moved, int(cluster.type_multiprocessors[t])),
        )
        if cluster.type_winograd[t]:
            winograd_s = self._winograd_s(
                fp32_flops_per_s, memory_bytes_per_s, flops, bytes_moved, local_batch
            )
            seconds = np.minimum(seconds, winograd_s)
        seconds = seconds + self.efficiency.launch_s
        seconds[self._free] = 0.0
        return seconds

    def _winograd_s(
        self,
        fp32_flops_per_s: float,
        memory_bytes_per_s: float,
        flops: np.ndarray,
        bytes_moved: np.ndarray,
        local_batch: int,
    ) -> np.ndarray:
        """The faster Winograd algorithm's time per op (inf where cuDNN offers none).

        Its products run on the FP32 pipeline at the dense efficiency: fused in one
        kernel over the compulsory traffic, non-fused as a product plus transform kernels
        that write and read every transformed tensor (:mod:`.conv_algo`).
        ``memory_bytes_per_s`` is the achieved bandwidth (efficiency applied).
        """
        conv = self.conv
        rate = fp32_flops_per_s * self.efficiency.dense_compute
        fused = np.maximum(flops * conv.fused_factor / rate, bytes_moved / memory_bytes_per_s)
        transforms = conv.transform_bytes_at(local_batch, self.ir.batch_size)
        nonfused = (
            flops * conv.nonfused_factor / rate + (bytes_moved + transforms) / memory_bytes_per_s
        )
        return np.where(
            conv.eligible,
            np.where(conv.fused_factor > 0, np.minimum(fused, nonfused), nonfused),
            np.inf,
        )

    def instance_times(
        self, op: np.ndarray, gpu_type: np.ndarray, local_batch: np.ndarray
    ) -> OpTimes:
        """:meth:`op_times` of many op instances at once: entry ``i`` is op ``op[i]`` on
        type ``gpu_type[i]`` with ``local_batch[i]`` examples. Looks each (type, batch)
        pair present up once, finding the pairs without sorting, and gathers every
        instance's figures from the pairs' rows at once."""
        span = int(local_batch.max(initial=0)) + 1
        code = gpu_type.astype(np.int64) * span + local_batch
        present = np.zeros(self.cluster.num_types * span, dtype=bool)
        present[code] = True
        pairs = np.flatnonzero(present)
        if not len(pairs):
            return OpTimes(seconds=np.zeros(len(op)), measured=np.zeros(len(op), dtype=bool))
        row_of = np.cumsum(present) - 1  # a present pair's row in the tables below
        found = [self.op_times(*divmod(int(pair), span)) for pair in pairs]
        rows = row_of[code]
        seconds = np.stack([times.seconds for times in found])[rows, op]
        measured = np.stack([times.measured for times in found])[rows, op]
        return OpTimes(seconds=seconds, measured=measured)

    def op_times(self, gpu_type: int, local_batch: int) -> OpTimes:
        """Seconds per op on type index ``gpu_type`` with ``local_batch`` examples on this
        replica; a profile of the type's name wins over the estimate."""
        key = (int(gpu_type), local_batch)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        if local_batch <= 0:
            raise InvalidInput(f"local batch size must be positive, got {local_batch}")
        seconds = self.estimate(gpu_type, local_batch)
        measured = np.zeros(self.ir.num_ops, dtype=bool)
        if self.profiles is not None:
            name = self.cluster.type_names[key[0]]  # profiles are keyed by type name
            for op, cost_key in enumerate(self.ir.cost_keys):
                found = self.profiles.lookup(cost_key, name, local_batch)
                if found is not None:
                    seconds[op] = found
                    measured[op] = True
        result = OpTimes(seconds=seconds, measured=measured)
        self._cache[key] = result
        return result
