"""The segment reductions against PyG's ``scatter`` and ``softmax``, which they replace at
run time: the same values and gradients, an empty segment included."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.utils import scatter, softmax

from tagplan.gnn.segments import segment_max, segment_mean, segment_softmax, segment_sum

SIZE = 6  # segment 4 is left empty


def _inputs(columns: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(13)
    index = torch.tensor([0, 0, 1, 2, 2, 2, 3, 5, 5, 1, 0])
    shape = (len(index),) if columns is None else (len(index), columns)
    return torch.randn(shape, generator=generator, dtype=torch.float64), index


@pytest.mark.parametrize("columns", [None, 3])
@pytest.mark.parametrize(
    ("mine", "reduce"), [(segment_sum, "sum"), (segment_mean, "mean"), (segment_max, "max")]
)
def test_reductions_equal_pyg_scatter(mine, reduce: str, columns: int | None) -> None:
    src, index = _inputs(columns)
    theirs_src = src.clone().requires_grad_()
    src.requires_grad_()
    ours = mine(src, index, SIZE)
    expected = scatter(theirs_src, index, dim=0, dim_size=SIZE, reduce=reduce)
    assert torch.allclose(ours, expected, atol=1e-12)
    assert torch.equal(ours[4], torch.zeros_like(ours[4]))  # the empty segment
    weights = torch.randn_like(ours)
    (ours * weights).sum().backward()
    (expected * weights).sum().backward()
    assert torch.allclose(src.grad, theirs_src.grad, atol=1e-12)


@pytest.mark.parametrize("columns", [None, 4])
def test_softmax_equals_pyg_softmax(columns: int | None) -> None:
    src, index = _inputs(columns)
    src = 30 * src  # large logits: the maximum must be taken out first
    theirs_src = src.clone().requires_grad_()
    src.requires_grad_()
    ours = segment_softmax(src, index, SIZE)
    expected = softmax(theirs_src, index, num_nodes=SIZE)
    assert torch.allclose(ours, expected, atol=1e-12)
    assert torch.allclose(
        segment_sum(ours.detach(), index, SIZE)[[0, 1, 2, 3, 5]], torch.ones(1, dtype=torch.float64)
    )
    weights = torch.randn_like(ours)
    (ours * weights).sum().backward()
    (expected * weights).sum().backward()
    assert torch.allclose(src.grad, theirs_src.grad, atol=1e-12)
