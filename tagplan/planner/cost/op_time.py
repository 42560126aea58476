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
memory bandwidth, and a fixed per-kernel launch overhead. A 3x3 stride-1 convolution on
a GPU whose library offers Winograd algorithms takes the time of the fastest algorithm,
direct or Winograd, as TensorFlow's cuDNN autotuning does (:mod:`.conv_algo`). Ops that
do no work (constants, variable handles, reshapes) cost nothing. Every time says whether
it was measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from tagplan.planner.cost.conv_algo import ConvAlgorithms, conv_algorithms
from tagplan.planner.cost.profile import ProfileSource
from tagplan.planner.cost.work import GraphWork, graph_work
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.topology import GpuTypeSpec, gpu_type_table

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
    """Op times of one analyzed graph on any GPU type, from profiles or the estimate.

    Results are cached per ``(gpu_type, local_batch)``: the search asks for the same few
    combinations many times.
    """

    def __init__(
        self,
        ir: GraphIR,
        *,
        profiles: ProfileSource | None = None,
        gpu_types: Mapping[str, GpuTypeSpec] | None = None,
        efficiency: Efficiency = DEFAULT_EFFICIENCY,
    ) -> None:
        self.ir = ir
        self.work: GraphWork = graph_work(ir)
        self.conv: ConvAlgorithms = conv_algorithms(ir, self.work)
        self.profiles = profiles
        self.gpu_types = dict(gpu_types) if gpu_types is not None else gpu_type_table()
        self.efficiency = efficiency
        self._dense = np.array([f in _DENSE_FORMULAS for f in self.work.formula], dtype=bool)
        self._compute_efficiency = np.where(
            self._dense, efficiency.dense_compute, efficiency.other_compute
        )
        self._free = np.array([f in efficiency.free_formulas for f in self.work.formula])
        self._cache: dict[tuple[str, int], OpTimes] = {}

    def gpu(self, gpu_type: str) -> GpuTypeSpec:
        for name, spec in self.gpu_types.items():
            if name.lower() == gpu_type.lower():
                return spec
        known = ", ".join(sorted(self.gpu_types))
        raise InvalidInput(f"unknown GPU type {gpu_type!r}; known types: {known}")

    def estimate(self, gpu_type: str, local_batch: int) -> np.ndarray:
        """The analytic roofline time of every op, ignoring profiles."""
        spec = self.gpu(gpu_type)
        flops, bytes_moved = self.work.at_batch(local_batch, self.ir.batch_size)
        dense_peak = (spec.tf32_tflops or spec.fp32_tflops) * 1e12
        peak_flops = np.where(self._dense, dense_peak, spec.fp32_tflops * 1e12)
        bandwidth = spec.memory_bandwidth_gb_per_s * 1e9
        memory_rate = bandwidth * self.efficiency.memory
        seconds = np.maximum(
            flops / (peak_flops * self._compute_efficiency), bytes_moved / memory_rate
        )
        seconds = np.minimum(seconds, self._winograd_s(spec, flops, bytes_moved, local_batch))
        seconds = seconds + self.efficiency.launch_s
        seconds[self._free] = 0.0
        return seconds

    def _winograd_s(
        self, spec: GpuTypeSpec, flops: np.ndarray, bytes_moved: np.ndarray, local_batch: int
    ) -> np.ndarray:
        """The faster Winograd algorithm's time per op (inf where cuDNN offers none).

        Its products run on the FP32 pipeline at the dense efficiency: fused in one
        kernel over the compulsory traffic, non-fused as a product plus transform kernels
        that write and read every transformed tensor (:mod:`.conv_algo`).
        """
        conv = self.conv
        if not spec.winograd:
            return np.full(self.ir.num_ops, np.inf)
        rate = spec.fp32_tflops * 1e12 * self.efficiency.dense_compute
        memory_rate = spec.memory_bandwidth_gb_per_s * 1e9 * self.efficiency.memory
        fused = np.maximum(flops * conv.fused_factor / rate, bytes_moved / memory_rate)
        transforms = conv.transform_bytes_at(local_batch, self.ir.batch_size)
        nonfused = flops * conv.nonfused_factor / rate + (bytes_moved + transforms) / memory_rate
        return np.where(
            conv.eligible,
            np.where(conv.fused_factor > 0, np.minimum(fused, nonfused), nonfused),
            np.inf,
        )

    def op_times(self, gpu_type: str, local_batch: int) -> OpTimes:
        """Seconds per op on ``gpu_type`` with ``local_batch`` examples on this replica."""
        if local_batch <= 0:
            raise InvalidInput(f"local batch size must be positive, got {local_batch}")
        key = (gpu_type.lower(), local_batch)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        seconds = self.estimate(gpu_type, local_batch)
        measured = np.zeros(self.ir.num_ops, dtype=bool)
        if self.profiles is not None:
            name = self.gpu(gpu_type).name
            for op, cost_key in enumerate(self.ir.cost_keys):
                found = self.profiles.lookup(cost_key, name, local_batch)
                if found is not None:
                    seconds[op] = found
                    measured[op] = True
        result = OpTimes(seconds=seconds, measured=measured)
        self._cache[key] = result
        return result
