"""Reductions over segments of rows (the nodes of each graph of a batch, the edges into
each node): sum, mean, max and softmax, in plain torch.

These are what the network needs of ``torch_geometric.utils``' ``scatter`` and
``softmax``; importing PyTorch Geometric costs about 2.5 s per process (it imports
``torch._dynamo``), more than a short plan can give, so the prior's runtime does without
it. ``segment_softmax`` computes what PyG's ``softmax`` does (the maximum taken without
its gradient, a ``1e-16`` guard on the sum); ``tests/gnn/test_segments.py`` compares every
function here with PyG's, values and gradients.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["segment_max", "segment_mean", "segment_softmax", "segment_sum"]


def segment_sum(src: Tensor, index: Tensor, size: int) -> Tensor:
    """Row ``i`` of the result: the sum of the rows of ``src`` whose ``index`` is ``i``."""
    return src.new_zeros((size, *src.shape[1:])).index_add(0, index, src)


def segment_mean(src: Tensor, index: Tensor, size: int) -> Tensor:
    """The mean of each segment's rows (zeros for an empty segment)."""
    counts = torch.bincount(index, minlength=size).clamp_(min=1).to(src.dtype)
    return segment_sum(src, index, size) / counts.view(-1, *([1] * (src.dim() - 1)))


def segment_max(src: Tensor, index: Tensor, size: int) -> Tensor:
    """The elementwise maximum of each segment's rows (zeros for an empty segment)."""
    expanded = index.view(-1, *([1] * (src.dim() - 1))).expand_as(src)
    out = src.new_zeros((size, *src.shape[1:]))
    return out.scatter_reduce(0, expanded, src, reduce="amax", include_self=False)


def segment_softmax(src: Tensor, index: Tensor, size: int) -> Tensor:
    """A softmax over the rows of each segment, column by column."""
    top = segment_max(src.detach(), index, size).index_select(0, index)
    exp = (src - top).exp()
    total = segment_sum(exp, index, size) + 1e-16
    return exp / total.index_select(0, index)
