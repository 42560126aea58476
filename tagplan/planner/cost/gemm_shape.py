"""The matrix-product shape of each dense kernel, and the work its output tiles round up to.

cuBLAS runs a matrix product, and cuDNN a convolution as an implicit matrix product, by
handing ``T x T`` tiles of the ``M x N`` output to the GPU's multiprocessors; a tile that
hangs over the edge of the matrix costs as much as a full one. NVIDIA's "Matrix
Multiplication Background User's Guide" (Deep Learning Performance documentation) calls
this tile quantization. The work a kernel does is therefore

    flops * (ceil(M / T) * T) * (ceil(N / T) * T) / (M * N)

with ``T`` the GPU type's ``gemm_tile``. A convolution with 32 or 64 output channels
(Inception's branches, ResNet's bottleneck entries, VGG's first layers) fills a quarter or
a half of a 128-wide tile; a large product loses nothing. The catalog sets ``T = 128``
for the Hopper types only, where kernels timed on an H200 and an H100 show it; other
types keep their flops (the evidence for both: docs/cost-formulas.md, "Tile rounding of
matrix products").

The implicit matrix product of each direction of a 2-D convolution (filter
``[Kh, Kw, Cin, Cout]``, ``y`` the forward output):

* forward: ``M = N*Ho*Wo`` (the rows of ``y``), ``N = Cout``;
* backward-data: ``M = N*Ho*Wo``, ``N = Cin`` (the work is counted on ``dy``);
* backward-filter: ``M = Kh*Kw*Cin``, ``N = Cout`` (the filter gradient is the output,
  the batch is the reduction).

A matrix product's ``M x N`` is its output's. Batched products keep their flops: cuBLAS's
batched kernels take tiles the size of small matrices (an attention head's 64 columns),
which the H200's timings of the attention products bear out. Depthwise convolutions are
not matrix products either.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tagplan.planner.cost.work import GraphWork, _dim
from tagplan.planner.graph.ir import GraphIR

__all__ = ["GemmShapes", "gemm_shapes"]

_CONV_FORMULAS = frozenset({"conv2d", "conv2d_backprop_input", "conv2d_backprop_filter"})


@dataclass(frozen=True, eq=False)
class GemmShapes:
    """``M`` and ``N`` per op at ``ir.batch_size`` (0 where the op is no matrix product).

    ``rows_per_sample`` marks the ops whose ``M`` counts the batch's samples, so a replica
    with fewer of them has fewer rows to tile.
    """

    rows: np.ndarray  # float64
    cols: np.ndarray  # float64
    rows_per_sample: np.ndarray  # bool

    def padding_at(self, local_batch: int, batch_size: int, tile: int) -> np.ndarray:
        """Work with whole tiles over work without them, per op (1 for other ops)."""
        rows = np.where(
            self.rows_per_sample, np.maximum(self.rows * (local_batch / batch_size), 1.0), self.rows
        )
        matrix = rows > 0
        rows = np.where(matrix, rows, 1.0)
        cols = np.where(matrix, self.cols, 1.0)
        padded = np.ceil(rows / tile) * np.ceil(cols / tile) * tile * tile
        return np.where(matrix, padded / (rows * cols), 1.0)


def _conv_shape(ir: GraphIR, op: int, formula: str, flops: float) -> tuple[float, float, bool]:
    ins, outs = ir.inputs(op), ir.outputs(op)
    backprop_filter = formula == "conv2d_backprop_filter"
    f = outs[0] if backprop_filter else ins[1]
    kh, kw, cin, cout = (_dim(ir, f, axis) for axis in range(4))
    if backprop_filter:
        return float(kh * kw * cin), float(cout), False
    forward = formula == "conv2d"
    cols, reduction = (cout, kh * kw * cin) if forward else (cin, kh * kw * cout)
    return flops / (2.0 * cols * reduction), float(cols), True


def _product_shape(ir: GraphIR, op: int) -> tuple[float, float, bool]:
    out = ir.outputs(op)[0]
    if len(ir.tensor_shapes[out] or ()) != 2:
        return 0.0, 0.0, False
    return float(_dim(ir, out, 0)), float(_dim(ir, out, 1)), int(ir.tensor_batch_axis[out]) == 0


def gemm_shapes(ir: GraphIR, work: GraphWork) -> GemmShapes:
    rows = np.zeros(ir.num_ops)
    cols = np.zeros(ir.num_ops)
    per_sample = np.zeros(ir.num_ops, dtype=bool)
    for op, formula in enumerate(work.formula):
        if formula in _CONV_FORMULAS and work.flops[op] > 0:
            rows[op], cols[op], per_sample[op] = _conv_shape(ir, op, formula, work.flops[op])
        elif formula == "matmul":
            rows[op], cols[op], per_sample[op] = _product_shape(ir, op)
    return GemmShapes(rows=rows, cols=cols, rows_per_sample=per_sample)
