"""Training batch norms stream one channel per multiprocessor: a bound on their bandwidth.

A training batch norm reduces every channel over the batch and the spatial positions
(the mean and variance forward; the sums of ``dy`` and ``dy * x_hat`` backward) before
it can write its output. TensorFlow runs float32 batch norms on a GPU in NCHW (its
layout optimizer moves float32 convolutional graphs there) with cuDNN's spatial batch
normalization, whose kernels, timed, behave as if each channel ran on one multiprocessor:
each channel streams its ``N*H*W`` elements at about the bandwidth one multiprocessor
draws, and a layer with fewer channels than the GPU has multiprocessors leaves the others
idle. The op's memory time is then at least

    bytes / (C * peak bandwidth / (SMs * s))

with ``C`` the channels, ``SMs`` the GPU type's multiprocessors and ``s`` the
multiprocessor shares one channel costs: ``FORWARD_SHARES`` for the forward op (one
reading pass for the statistics, one to normalize), ``BACKWARD_SHARES`` for the gradient
(two reductions, then ``dx``). Both were fitted on cuDNN's kernels timed on an H100 over
a grid of shapes (``bench/gpu_batch_norm.py``; docs/cost-formulas.md, "Batch norms: one
channel per multiprocessor"). Layers with many channels, inference batch norms (an
elementwise ``x * a + b``) and half-precision ones (NHWC, where cuDNN's timed kernels
show no such limit) keep the roofline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tagplan.planner.cost.work import GraphWork, _attrs, _known, _numel
from tagplan.planner.graph.ir import GraphIR

__all__ = ["BACKWARD_SHARES", "FORWARD_SHARES", "STREAMED_DTYPES", "ChannelStreams"]

FORWARD_SHARES = 1.1
"""Multiprocessor shares of memory bandwidth one channel of a forward batch norm draws."""
BACKWARD_SHARES = 1.8
"""The same for the gradient (``FusedBatchNormGrad``)."""
STREAMED_DTYPES = frozenset({1, 2})
"""TensorFlow DataType values TensorFlow runs in NCHW on a GPU: DT_FLOAT, DT_DOUBLE."""
_SHARES = {"batch_norm": FORWARD_SHARES, "batch_norm_grad": BACKWARD_SHARES}


@dataclass(frozen=True, eq=False)
class ChannelStreams:
    """Per op: the channels streamed one per multiprocessor (0 for other ops) and the
    multiprocessor shares each costs."""

    channels: np.ndarray  # float64
    shares: np.ndarray  # float64

    @classmethod
    def of(cls, ir: GraphIR, work: GraphWork) -> ChannelStreams:
        channels = np.zeros(ir.num_ops)
        shares = np.ones(ir.num_ops)
        for op, formula in enumerate(work.formula):
            if formula not in _SHARES or _attrs(ir, op).get("is_training", "True") != "True":
                continue
            if int(ir.tensor_dtype[ir.inputs(op)[0]]) not in STREAMED_DTYPES:
                continue
            # output 1 is per channel: the batch mean forward, the scale's gradient backward
            outputs = ir.outputs(op)
            if len(outputs) < 2 or not _known(ir, outputs[1]):
                continue  # channels unknown: the roofline alone
            channels[op] = _numel(ir, outputs[1])
            shares[op] = _SHARES[formula]
        return cls(channels=channels, shares=shares)

    def bound_s(
        self, bytes_moved: np.ndarray, bandwidth_bytes_per_s: float, multiprocessors: int
    ) -> np.ndarray:
        """The least seconds of each op's traffic at one multiprocessor's share of the peak
        ``bandwidth_bytes_per_s`` per channel (0 for other ops, or without a count)."""
        streamed = self.channels > 0
        if not multiprocessors or not streamed.any():
            return np.zeros(len(self.channels))
        rate = np.where(streamed, self.channels, 1.0) * (
            bandwidth_bytes_per_s / (multiprocessors * self.shares)
        )
        return np.where(streamed, bytes_moved / rate, 0.0)
