"""A search state's graph as tensors, and batches of them, for the network.

:class:`GraphTensors` holds what the network reads of a :class:`~.features.StateGraph`:
each node type's features (and, in a batch, the graph of each node), each edge type's
edges and their features, and the actions' training target. It is indexed as PyTorch
Geometric's ``HeteroData`` is (``data["op"].x``, ``data["op", "on", "dev"].edge_index``);
the prior's runtime does not import PyG (:mod:`.segments` says why).
:func:`batch_tensors` stacks graphs as PyG's ``Batch`` does: nodes of each type in graph
order, edges renumbered by the nodes before them, a ``batch`` vector per node type.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tagplan.gnn.features import StateGraph

__all__ = ["EdgeTensors", "GraphTensors", "NodeTensors", "batch_tensors", "to_tensors"]

EdgeType = tuple[str, str, str]


@dataclass
class NodeTensors:
    """One node type: features ``x``; ``batch``: each node's graph (None for one graph);
    ``y``: the training target (actions only)."""

    x: Tensor
    batch: Tensor | None = None
    y: Tensor | None = None

    @property
    def num_nodes(self) -> int:
        return self.x.shape[0]


@dataclass
class EdgeTensors:
    """One edge type: ``edge_index`` (2 x edges: source and destination rows) and the
    edges' features."""

    edge_index: Tensor
    edge_attr: Tensor


@dataclass
class GraphTensors:
    """A graph, or a batch of ``num_graphs`` graphs (module docstring)."""

    nodes: dict[str, NodeTensors]
    edges: dict[EdgeType, EdgeTensors] = field(default_factory=dict)
    num_graphs: int = 1

    def __getitem__(self, key: str | EdgeType) -> Any:
        return self.nodes[key] if isinstance(key, str) else self.edges[key]


def to_tensors(graph: StateGraph, target: np.ndarray | None = None) -> GraphTensors:
    """A :class:`StateGraph` as tensors; ``target`` (the visit distribution over the
    actions) is stored as ``data["act"].y`` for training."""
    nodes = {
        "op": NodeTensors(torch.from_numpy(graph.op_x)),
        "dev": NodeTensors(torch.from_numpy(graph.dev_x)),
        "act": NodeTensors(torch.from_numpy(graph.act_x)),
    }
    if target is not None:
        nodes["act"].y = torch.from_numpy(np.asarray(target, dtype=np.float32))
    edges = {
        edge_type: EdgeTensors(
            torch.from_numpy(index), torch.from_numpy(np.asarray(attr, dtype=np.float32))
        )
        for edge_type, (index, attr) in graph.edges.items()
    }
    return GraphTensors(nodes, edges)


def batch_tensors(graphs: Sequence[GraphTensors]) -> GraphTensors:
    """The graphs as one batch (module docstring)."""
    counts = {t: [g[t].num_nodes for g in graphs] for t in graphs[0].nodes}
    nodes = {}
    for node_type, sizes in counts.items():
        targets = [g[node_type].y for g in graphs]
        nodes[node_type] = NodeTensors(
            torch.cat([g[node_type].x for g in graphs]),
            torch.repeat_interleave(torch.arange(len(graphs)), torch.tensor(sizes)),
            None if any(y is None for y in targets) else torch.cat(targets),
        )
    offsets = {t: np.concatenate([[0], np.cumsum(sizes)[:-1]]) for t, sizes in counts.items()}
    edges = {}
    for edge_type in graphs[0].edges:
        source, _, destination = edge_type
        index = [
            g[edge_type].edge_index
            + torch.tensor([[offsets[source][i]], [offsets[destination][i]]])
            for i, g in enumerate(graphs)
        ]
        edges[edge_type] = EdgeTensors(
            torch.cat(index, dim=1), torch.cat([g[edge_type].edge_attr for g in graphs])
        )
    return GraphTensors(nodes, edges, num_graphs=len(graphs))
