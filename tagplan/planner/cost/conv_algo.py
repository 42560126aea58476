"""Which algorithm cuDNN runs a convolution with, and the work that algorithm does.

The roofline of :mod:`.op_time` prices a convolution by its direct multiply-adds. cuDNN
also offers Winograd algorithms (Lavin & Gray 2016, "Fast Algorithms for Convolutional
Neural Networks") that compute an ``m x m`` output tile of an ``r x r`` filter from an
``a x a`` input tile, ``a = m + r - 1``, with ``a^2`` multiplications instead of
``m^2 r^2``: F(2x2,3x3) does 2.25x fewer, F(4x4,3x3) 4x fewer. TensorFlow times every
algorithm cuDNN offers for a shape on its first run and keeps the fastest (cuDNN
autotuning, on by default), so the estimate is the fastest of the candidates:

* **direct** (implicit GEMM): the roofline of the direct flops, for every convolution;
* **fused Winograd F(2x2,3x3)** (``CUDNN_CONVOLUTION_*_ALGO_WINOGRAD``): forward and
  backward-data only (cuDNN documents the backward-filter variant as not implemented);
  one kernel, so its traffic is the compulsory traffic of the direct algorithm;
* **non-fused Winograd F(4x4,3x3)** (``*_ALGO_WINOGRAD_NONFUSED``, cuDNN 5.1 and later,
  all three directions): separate kernels transform the two activation tensors into
  ``a^2`` tiles (``a^2 / m^2 = 2.25x`` their size), transform the filter (or, for the
  filter gradient, accumulate it) in the ``a x a`` domain, run one batched matrix product
  per tile position, and transform back. Its time is the product at the compute
  roofline plus every transformed tensor written once and read once at the memory
  roofline.

cuDNN offers both only for 2-D convolutions with a 3x3 filter, stride 1 and dilation 1 in
float32 or float16. Channel counts need no threshold: a layer with few input channels
(an RGB stem) or a small feature map with many channels (ResNet's last stage at a small
batch) has transforms that cost more than the multiplications saved, and the direct
algorithm wins the comparison. 5x5 filters (cuDNN's non-fused Winograd takes them too,
with an undocumented tile) and FFT algorithms are not candidates: they stay on the
direct roofline. The Winograd products run on the FP32 pipeline; a GPU whose tensor
cores make the direct algorithm faster (TF32 on Ampere and later) keeps the direct time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tagplan.planner.cost.work import GraphWork, _dim, _ints, attrs_from_cost_key
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.protos import DTYPE_BYTES

__all__ = [
    "FILTER_SIZE",
    "FUSED_TILE",
    "NONFUSED_TILE",
    "WINOGRAD_DTYPES",
    "ConvAlgorithms",
    "conv_algorithms",
]

FILTER_SIZE = 3
"""r: the filter size cuDNN's Winograd algorithms take (3x3)."""
FUSED_TILE = 2
"""m of the fused algorithm, F(2x2,3x3): 16 multiplications per 4 outputs instead of 36."""
NONFUSED_TILE = 4
"""m of the non-fused algorithm, F(4x4,3x3): 36 multiplications per 16 outputs, not 144."""
WINOGRAD_DTYPES = frozenset({1, 19})
"""TensorFlow DataType values cuDNN's Winograd algorithms take: DT_FLOAT, DT_HALF."""

# op type -> (index of the "y"-side tensor the direct flops count on, or None for the
# op's output; filter input index, or None when the filter is the output; whether the
# fused algorithm exists for this direction).
_DIRECTIONS: dict[str, tuple[int | None, int | None, bool]] = {
    "Conv2D": (None, 1, True),
    "Conv2DBackpropInput": (2, 1, True),
    "Conv2DBackpropFilter": (2, None, False),
}


@dataclass(frozen=True, eq=False)
class ConvAlgorithms:
    """Per-op work of the Winograd candidates at ``ir.batch_size`` (arrays indexed by op).

    A factor is the candidate's multiplications over the direct algorithm's (tile
    rounding included), 0 where cuDNN does not offer it. Transform bytes are the
    non-fused algorithm's traffic on top of the direct algorithm's compulsory traffic:
    the activation-sized part scales with the batch, the filter-sized part does not.
    """

    fused_factor: np.ndarray  # float64
    nonfused_factor: np.ndarray  # float64
    transform_batch_bytes: np.ndarray  # float64
    transform_fixed_bytes: np.ndarray  # float64

    @property
    def eligible(self) -> np.ndarray:
        return self.nonfused_factor > 0

    def transform_bytes_at(self, local_batch: int, batch_size: int) -> np.ndarray:
        """Transform traffic of a replica running ``local_batch`` of ``batch_size``."""
        return self.transform_batch_bytes * (local_batch / batch_size) + self.transform_fixed_bytes


def _tiles(height: int, width: int, m: int) -> int:
    return math.ceil(height / m) * math.ceil(width / m)


def _winograd(ir: GraphIR, op: int) -> tuple[float, float, float, float] | None:
    """(fused factor, non-fused factor, batch bytes, fixed bytes) or None if not offered."""
    direction = _DIRECTIONS.get(ir.op_types[op])
    if direction is None:
        return None
    y_input, filter_input, has_fused = direction
    ins, outs = ir.inputs(op), ir.outputs(op)
    y = outs[0] if y_input is None else ins[y_input]
    f = outs[0] if filter_input is None else ins[filter_input]
    if int(ir.tensor_dtype[y]) not in WINOGRAD_DTYPES:
        return None
    attrs = attrs_from_cost_key(ir.cost_keys[op])
    nchw = attrs.get("data_format", "NHWC") == "NCHW"
    spatial = (2, 3) if nchw else (1, 2)
    strides = _ints(attrs.get("strides")) or [1, 1, 1, 1]
    dilations = _ints(attrs.get("dilations")) or [1, 1, 1, 1]
    r = FILTER_SIZE
    if (_dim(ir, f, 0), _dim(ir, f, 1)) != (r, r):
        return None
    if any(strides[a] != 1 or dilations[a] != 1 for a in spatial):
        return None
    height, width = (_dim(ir, y, a) for a in spatial)
    direct = height * width * r * r  # multiplications per (sample, Cin, Cout)

    def factor(m: int) -> float:
        return _tiles(height, width, m) * (m + r - 1) ** 2 / direct

    m = NONFUSED_TILE
    alpha2 = (m + r - 1) ** 2
    channel_axis = 1 if nchw else 3
    # The two activation tensors the op transforms: x and y, dy and dx, or x and dy.
    activations = [t for t in (*ins, *outs) if ir.tensor_batch_axis[t] >= 0]
    element_bytes = DTYPE_BYTES.get(int(ir.tensor_dtype[y]), 4)
    tiles = _tiles(height, width, m)
    batch_bytes = sum(
        _dim(ir, t, 0) * _dim(ir, t, channel_axis) * tiles * alpha2 * element_bytes
        for t in activations
    )
    filter_domain = _dim(ir, f, 2) * _dim(ir, f, 3) * alpha2 * element_bytes
    # Every transformed tensor is written by one kernel and read by the next.
    return (
        factor(FUSED_TILE) if has_fused else 0.0,
        factor(m),
        2.0 * batch_bytes,
        2.0 * filter_domain,
    )


def conv_algorithms(ir: GraphIR, work: GraphWork) -> ConvAlgorithms:
    """The Winograd candidates of every convolution of ``ir`` that cuDNN offers them for.

    Ops whose formula fell back (a malformed convolution) get none.
    """
    rows = np.zeros((ir.num_ops, 4))
    for op in range(ir.num_ops):
        if work.formula[op] == "fallback":
            continue
        found = _winograd(ir, op)
        if found is not None:
            rows[op] = found
    return ConvAlgorithms(
        fused_factor=rows[:, 0],
        nonfused_factor=rows[:, 1],
        transform_batch_bytes=rows[:, 2],
        transform_fixed_bytes=rows[:, 3],
    )
