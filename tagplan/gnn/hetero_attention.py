"""One round of heterogeneous GATv2 message passing over every edge type at once.

:class:`HeteroGat` holds one :class:`GatV2` per edge type: the parameters of PyTorch
Geometric's ``HeteroConv`` of ``GATv2Conv(add_self_loops=False)`` modules, under the same
names (so a checkpoint's keys are PyG's) and initialized as PyG initializes them (the
same weights for a seed), without importing PyG at run time (:mod:`.segments` says why);
:func:`pyg_reference` builds PyG's own modules over the same parameters, the reference
the tests and ``bench/gnn_latency.py`` compare with.

Run by PyG, five edge types and three layers are fifteen passes through its
message-passing machinery per expansion, whose Python overhead, not the arithmetic, made
the prior cost about 10 ms on 60 op groups x 32 device groups (several thousand edges).
:func:`hetero_gatv2` computes the same function with the same parameters: each edge
type's node and edge projections, then the attention logits, the softmax and the messages
of all edge types as one list of edges. An edge type with an edge from every source to
every destination (every op group to every device group, in one state's graph), or from
every node to every other of its type (every ordered pair of device groups), is computed
densely instead: the logits as a (destination x source) array, a softmax along its rows
(a missing self-edge masked out of it), the messages as one product per head, with no
per-edge gathers or message buffers (the largest edge types, and most of the time
otherwise).

Why it equals ``HeteroConv(..., aggr="sum")`` over ``GATv2Conv(add_self_loops=False,
concat=True, dropout=0, share_weights=False)`` (Brody et al., GATv2: for an edge ``j -> i``
of type ``r``, ``e = a_r . LeakyReLU(W_l x_j + W_r x_i + W_e f_ji)``, a softmax over the
edges of type ``r`` into ``i``, ``out_r(i) = sum_j alpha_ji W_l x_j + b_r``, and HeteroConv
sums ``out_r`` over the types into ``i``'s node type): the softmax groups are keyed by (edge
type, destination), so each type's attention is normalized over its own edges alone;
messages are then summed into the destination node, which adds the types' sums; every
type's bias is added to every node of its destination type, edges or not, as each
convolution adds it to its whole output. Only the order of floating-point additions
differs (tests compare with PyG's modules to 1e-5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tagplan.gnn.segments import segment_softmax

__all__ = [
    "EdgeLayout",
    "GatV2",
    "Grid",
    "HeteroGat",
    "edge_layout",
    "hetero_gatv2",
    "pyg_reference",
]

EdgeType = tuple[str, str, str]


def _glorot(value: Tensor) -> None:
    """PyG's ``glorot``: uniform within ``sqrt(6 / (rows + columns))`` of the last two
    dimensions."""
    bound = math.sqrt(6.0 / (value.size(-2) + value.size(-1)))
    with torch.no_grad():
        value.uniform_(-bound, bound)


class _Linear(nn.Module):
    """PyG's ``Linear(weight_initializer="glorot")``: a glorot weight, a bias uniform
    within ``1 / sqrt(inputs)``."""

    def __init__(self, inputs: int, outputs: int, bias: bool) -> None:
        super().__init__()
        self.inputs = inputs
        self.weight = nn.Parameter(torch.empty(outputs, inputs))
        self.bias = nn.Parameter(torch.empty(outputs)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _glorot(self.weight)
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.inputs)
            with torch.no_grad():
                self.bias.uniform_(-bound, bound)


class GatV2(nn.Module):
    """The parameters of ``GATv2Conv(channels, out_channels, heads=heads,
    edge_dim=edge_dim, add_self_loops=False)``, named as PyG names them and drawn from the
    random stream in PyG's order (each linear layer at its construction and again at the
    convolution's reset, then the attention vectors; the bias at zero)."""

    negative_slope = 0.2

    def __init__(self, channels: int, out_channels: int, heads: int, edge_dim: int) -> None:
        super().__init__()
        self.heads, self.out_channels = heads, out_channels
        width = heads * out_channels
        self.lin_l = _Linear(channels, width, bias=True)
        self.lin_r = _Linear(channels, width, bias=True)
        self.att = nn.Parameter(torch.empty(1, heads, out_channels))
        self.lin_edge = _Linear(edge_dim, width, bias=False)
        self.bias = nn.Parameter(torch.empty(width))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for layer in (self.lin_l, self.lin_r, self.lin_edge):
            layer.reset_parameters()
        _glorot(self.att)
        nn.init.zeros_(self.bias)


def _key(edge_type: EdgeType) -> str:
    """PyG's ``ModuleDict`` key of an edge type."""
    return "<" + "___".join(edge_type) + ">"


class HeteroGat(nn.Module):
    """One :class:`GatV2` per edge type, summed into each destination (PyG's
    ``HeteroConv(..., aggr="sum")``); indexed by edge type."""

    def __init__(self, channels: int, heads: int, edge_dims: dict[EdgeType, int]) -> None:
        super().__init__()
        self.edge_types = tuple(edge_dims)
        self.convs = nn.ModuleDict(
            {
                _key(edge_type): GatV2(channels, channels // heads, heads, dim)
                for edge_type, dim in edge_dims.items()
            }
        )

    def __getitem__(self, edge_type: EdgeType) -> GatV2:
        return self.convs[_key(edge_type)]


def pyg_reference(conv: HeteroGat) -> Any:
    """PyG's ``HeteroConv`` of ``GATv2Conv`` modules computing what ``conv`` computes,
    over ``conv``'s own parameters (gradients reach them): the reference the tests and the
    latency benchmark compare :func:`hetero_gatv2` with. Imports PyG."""
    from torch_geometric.nn import GATv2Conv, HeteroConv

    reference = HeteroConv(
        {
            edge_type: GATv2Conv(
                conv[edge_type].lin_l.inputs,
                conv[edge_type].out_channels,
                heads=conv[edge_type].heads,
                edge_dim=conv[edge_type].lin_edge.inputs,
                add_self_loops=False,
            )
            for edge_type in conv.edge_types
        },
        aggr="sum",
    )
    for edge_type in conv.edge_types:
        mine, theirs = conv[edge_type], reference.convs[edge_type]
        for layer in ("lin_l", "lin_r", "lin_edge"):
            getattr(theirs, layer).weight = getattr(mine, layer).weight
            getattr(theirs, layer).bias = getattr(mine, layer).bias
        theirs.att, theirs.bias = mine.att, mine.bias
    return reference


@dataclass(frozen=True)
class Grid:
    """An edge type with one edge per (source, destination) pair, in row-major order:
    ``source_major`` (by source, then destination) or by destination; ``self_edges``
    False when the pairs of a node with itself have none (source and destination counted
    alike)."""

    source_major: bool
    self_edges: bool = True


@dataclass(frozen=True)
class EdgeLayout:
    """The edges of every message type as one list, shared by all layers of a pass.

    Edges are in ``types`` order, ``counts`` of each; ``group``: each edge's softmax group,
    one per (type, destination); ``target``: its destination's row in the node types'
    stacked rows (``node_offset``). ``types`` leaves out the ``grids``: types with one
    edge per (source, destination) pair in row-major order (:class:`Grid`), computed
    densely."""

    types: tuple[EdgeType, ...]
    index: dict[EdgeType, Tensor]
    group: Tensor
    num_groups: int
    target: Tensor
    node_offset: dict[str, int]
    num_nodes: int
    counts: tuple[int, ...]  # edges of each type
    grids: dict[EdgeType, Grid]


def edge_layout(
    types: tuple[EdgeType, ...], edge_index: dict[EdgeType, Tensor], num_nodes: dict[str, int]
) -> EdgeLayout:
    """The combined edge list of ``types`` for nodes counted by ``num_nodes``."""
    node_offset, start = {}, 0
    for node_type, count in num_nodes.items():
        node_offset[node_type], start = start, start + count
    grids = {}
    for edge_type in types:
        grid = _grid(edge_index[edge_type], num_nodes[edge_type[0]], num_nodes[edge_type[2]])
        if grid is not None:
            grids[edge_type] = grid
    sparse = tuple(edge_type for edge_type in types if edge_type not in grids)
    groups, targets, num_groups = [], [], 0
    for edge_type in sparse:
        dst = edge_index[edge_type][1]
        groups.append(dst + num_groups)
        targets.append(dst + node_offset[edge_type[2]])
        num_groups += num_nodes[edge_type[2]]
    empty = torch.zeros(0, dtype=torch.long)
    return EdgeLayout(
        types=sparse,
        index=edge_index,
        group=torch.cat(groups) if groups else empty,
        num_groups=num_groups,
        target=torch.cat(targets) if targets else empty,
        node_offset=node_offset,
        num_nodes=start,
        counts=tuple(edge_index[edge_type].shape[1] for edge_type in sparse),
        grids=grids,
    )


def _grid(index: Tensor, sources: int, destinations: int) -> Grid | None:
    """The :class:`Grid` ``index`` is, or None when it is no such grid (a batch of graphs
    never is: its pairs across graphs have no edge)."""
    orders = {
        True: (  # by source, then destination
            torch.arange(sources).repeat_interleave(destinations),
            torch.arange(destinations).repeat(sources),
        ),
        False: (  # by destination, then source
            torch.arange(sources).repeat(destinations),
            torch.arange(destinations).repeat_interleave(sources),
        ),
    }
    for self_edges in (True, False):
        if not self_edges and sources != destinations:
            break
        pairs = sources * destinations - (0 if self_edges else sources)
        if index.shape[1] != pairs or pairs == 0:
            continue
        for source_major, (src, dst) in orders.items():
            keep = slice(None) if self_edges else src != dst
            if torch.equal(index[0], src[keep]) and torch.equal(index[1], dst[keep]):
                return Grid(source_major, self_edges)
    return None


def _per_head(module: GatV2) -> Tensor:
    """The (heads x channels) attention vectors as the block-diagonal (heads x heads *
    channels) matrix whose product with the edges' hidden vectors (as columns) gives each
    head's dot product per edge: one matrix product with a wide result instead of a
    broadcast product and a sum, or a product with as few columns as heads, which BLAS
    runs several times slower. Without autograd (the search's inference) it is kept on
    the module until ``att`` changes."""
    att = module.att
    key = (att.data_ptr(), att._version)
    cached = module.__dict__.get("_per_head")
    if not torch.is_grad_enabled() and cached is not None and cached[0] == key:
        return cached[1]
    heads, channels = att.shape[1:]
    eye = torch.eye(heads, dtype=att.dtype)
    matrix = (eye.unsqueeze(2) * att[0].unsqueeze(0)).reshape(heads, heads * channels)
    if not torch.is_grad_enabled():
        module.__dict__["_per_head"] = (key, matrix)
    return matrix


def _linear(layer: nn.Module, x: Tensor) -> Tensor:
    """``layer(x)`` for a linear layer, without the module call's hooks and dispatch
    (a few microseconds each, thirty times per expansion)."""
    return F.linear(x, layer.weight, layer.bias)


def hetero_gatv2(
    conv: HeteroGat, x: dict[str, Tensor], layout: EdgeLayout, edge_attr: dict[EdgeType, Tensor]
) -> dict[str, Tensor]:
    """``conv(x, edge_index, edge_attr_dict=edge_attr)`` for the edge types of ``layout``,
    computed as one edge list (module docstring)."""
    sources, logits = [], []
    bias = dict.fromkeys(x, 0.0)
    for edge_type in layout.types:
        module = conv[edge_type]
        src, dst = layout.index[edge_type]
        x_src = _linear(module.lin_l, x[edge_type[0]]).index_select(0, src)
        # in place where autograd allows it: each (edges x width) buffer costs a pass
        # over memory, which is most of the time on the large edge types
        hidden = _linear(module.lin_edge, edge_attr[edge_type])
        hidden += x_src
        hidden += _linear(module.lin_r, x[edge_type[2]]).index_select(0, dst)
        F.leaky_relu_(hidden, module.negative_slope)
        logits.append((_per_head(module) @ hidden.t()).t())
        sources.append(x_src.view(len(src), module.heads, module.out_channels))
        bias[edge_type[2]] = bias[edge_type[2]] + module.bias
    first = conv[conv.edge_types[0]]
    width = first.heads * first.out_channels
    summed = torch.zeros(layout.num_nodes, width)
    if logits:
        alpha = segment_softmax(torch.cat(logits), layout.group, layout.num_groups)
        for x_src, part, target in zip(
            sources, alpha.split(layout.counts), layout.target.split(layout.counts), strict=True
        ):
            summed = summed.index_add(0, target, (x_src * part.unsqueeze(-1)).view(-1, width))
    out = {
        node_type: summed[offset : offset + x[node_type].shape[0]] + bias[node_type]
        for node_type, offset in layout.node_offset.items()
    }
    for edge_type, grid in layout.grids.items():
        out[edge_type[2]] = out[edge_type[2]] + _dense_gatv2(
            conv[edge_type], x[edge_type[0]], x[edge_type[2]], edge_attr[edge_type], grid
        )
    return out


def _dense_gatv2(
    module: GatV2, x_src: Tensor, x_dst: Tensor, edge_attr: Tensor, grid: Grid
) -> Tensor:
    """One GATv2 convolution over an edge type with an edge from every source to every
    destination (:class:`Grid`): the sums and the softmax over a (head x destination x
    source) array, with no per-edge gathers, and the messages as one product per head.
    Without self-edges the diagonal's scores are left out of the softmax."""
    heads, channels = module.heads, module.out_channels
    sources, destinations = len(x_src), len(x_dst)
    missing = None if grid.self_edges else torch.eye(sources, dtype=torch.bool)
    if missing is not None:  # the diagonal's features: zeros, its scores masked below
        full = edge_attr.new_zeros(sources * destinations, edge_attr.shape[1])
        full[~missing.view(-1)] = edge_attr
        edge_attr = full
    if grid.source_major:  # the edges' features in destination-major order (a few columns)
        edge_attr = edge_attr.view(sources, destinations, -1).transpose(0, 1)
        edge_attr = edge_attr.reshape(sources * destinations, -1)
    left = _linear(module.lin_l, x_src)
    hidden = _linear(module.lin_edge, edge_attr).view(destinations, sources, -1)
    hidden += left.unsqueeze(0)
    hidden += _linear(module.lin_r, x_dst).unsqueeze(1)
    F.leaky_relu_(hidden, module.negative_slope)
    scores = (_per_head(module) @ hidden.view(destinations * sources, -1).t()).view(
        heads, destinations, sources
    )
    if missing is not None:
        scores = scores.masked_fill(missing, float("-inf"))
    alpha = torch.softmax(scores, dim=2)
    # one (destination x source) @ (source x channels) product per head
    per_head = left.view(sources, heads, channels).transpose(0, 1)
    messages = torch.bmm(alpha, per_head).transpose(0, 1)
    return messages.reshape(destinations, heads * channels) + module.bias
