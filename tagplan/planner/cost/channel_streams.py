"""Training batch norms stream one channel per multiprocessor: a bound on their bandwidth.

A training batch norm reduces every channel over the batch and the spatial positions
(the mean and variance forward; the sums of ``dy`` and ``dy * x_hat`` backward) before
it can write its output. TensorFlow runs float32 batch norms on a GPU in NCHW (its
layout optimizer moves float32 convolutional graphs there) with cuDNN's spatial batch
normalization, whose kernels, timed, behave as if each channel ran on one multiprocessor
at a fixed rate: each channel streams its ``N*H*W`` elements at ``FORWARD_CHANNEL_GB_PER_S``
(forward: one reading pass for the statistics, one to normalize) or
``BACKWARD_CHANNEL_GB_PER_S`` (the gradient: two reductions, then ``dx``), and a layer with
few channels leaves the rest of the GPU idle. The op's memory time is then at least

    bytes / (C * rate)

with ``C`` the channels. The rate is the multiprocessor's, not a share of the GPU's
bandwidth: timed over the same grid of shapes on an H100 and an H200 (132
multiprocessors at the same clock each, 1.41x apart in bandwidth), one channel streamed
22.4 and 22.3 GB/s forward, 13.8 and 13.5 GB/s backward (``bench/gpu_batch_norm.py``;
docs/cost-formulas.md, "Batch norms: one channel per multiprocessor"). The rates were
fitted on the H100 and hold on the H200; no GPU of another architecture was timed.
Layers with many channels, inference batch norms (an elementwise ``x * a + b``),
half-precision ones (NHWC, where cuDNN's timed kernels show no such limit) and device
types without multiprocessors (the CPU) keep the roofline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tagplan.planner.cost.work import GraphWork, _attrs, _known, _numel
from tagplan.planner.graph.ir import GraphIR

__all__ = [
    "BACKWARD_CHANNEL_GB_PER_S",
    "FORWARD_CHANNEL_GB_PER_S",
    "STREAMED_DTYPES",
    "ChannelStreams",
]

FORWARD_CHANNEL_GB_PER_S = 23.0
"""GB/s one channel of a forward training batch norm streams (1 GB = 1e9 bytes)."""
BACKWARD_CHANNEL_GB_PER_S = 14.0
"""The same for the gradient (``FusedBatchNormGrad``)."""
STREAMED_DTYPES = frozenset({1, 2})
"""TensorFlow DataType values TensorFlow runs in NCHW on a GPU: DT_FLOAT, DT_DOUBLE."""
_RATE_BYTES_PER_S = {
    "batch_norm": FORWARD_CHANNEL_GB_PER_S * 1e9,
    "batch_norm_grad": BACKWARD_CHANNEL_GB_PER_S * 1e9,
}


@dataclass(frozen=True, eq=False)
class ChannelStreams:
    """Per op: the channels streamed one per multiprocessor (0 for other ops) and the
    bytes per second each streams."""

    channels: np.ndarray  # float64
    channel_bytes_per_s: np.ndarray  # float64

    @classmethod
    def of(cls, ir: GraphIR, work: GraphWork) -> ChannelStreams:
        channels = np.zeros(ir.num_ops)
        rates = np.ones(ir.num_ops)
        for op, formula in enumerate(work.formula):
            rate = _RATE_BYTES_PER_S.get(formula)
            if rate is None or _attrs(ir, op).get("is_training", "True") != "True":
                continue
            if int(ir.tensor_dtype[ir.inputs(op)[0]]) not in STREAMED_DTYPES:
                continue
            # output 1 is per channel: the batch mean forward, the scale's gradient backward
            outputs = ir.outputs(op)
            if len(outputs) < 2 or not _known(ir, outputs[1]):
                continue  # channels unknown: the roofline alone
            channels[op] = _numel(ir, outputs[1])
            rates[op] = rate
        return cls(channels=channels, channel_bytes_per_s=rates)

    def bound_s(self, bytes_moved: np.ndarray, multiprocessors: int) -> np.ndarray:
        """The least seconds of each op's traffic at its channels' rate (0 for other ops,
        or on a device type without ``multiprocessors``)."""
        streamed = self.channels > 0
        if not multiprocessors or not streamed.any():
            return np.zeros(len(self.channels))
        rate = np.where(streamed, self.channels, 1.0) * self.channel_bytes_per_s
        return np.where(streamed, bytes_moved / rate, 0.0)
