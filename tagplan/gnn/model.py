"""The prior network (TAG §4.2.1): graph attention over the search state's heterogeneous
graph, and a decoder that scores each candidate action of the op group being decided.

* Each node type is embedded by its own linear layer.
* ``layers`` rounds of message passing, each one multi-head GATv2 convolution per edge
  type (its own weights: TAG's per-edge-type γ) that reads the edge's features; messages
  of the edge types arriving at a node are summed, added to the node's state (a residual)
  and layer-normalized. The round is computed over all edge types at once
  (:mod:`.hetero_attention`: what PyG's ``HeteroConv`` of ``GATv2Conv`` modules computes,
  over parameters named as theirs, in a fraction of the per-expansion time).
* The decoder reads, for each action, its own features, the mean and the max of the
  embeddings of the device groups it uses, the embedding of the op group being decided
  and the mean op-group embedding of its graph, and gives one logit; a softmax over the
  actions of each graph gives the prior. The options share device sets (an allocation of
  32 device groups has 300 actions over 75 sets), so the mean and the max are taken once
  per distinct set.

What a pass derives from a graph's edges alone (:class:`GraphShape`: the message edges as
one list, the distinct device sets) does not change between the states of one search; the
prior derives it once per search (:meth:`PriorNet.shape_of`).

Graphs of several search states batch as PyG's ``Batch`` batches them
(:func:`~.tensors.batch_tensors`): actions, op and device groups carry the index of their
graph, so one forward pass scores many states.

A network with a **layout head** (``layout_head=True``) also scores the candidates of the
pipelined part of the tree (:mod:`.layout_features`): the same decoder shape over its
own embedding of each candidate's features, the mean and max of the embeddings of the
device groups it runs on, the op-group embeddings weighted by its focus and their mean.
Those vertices read the encoder's embeddings of the search's root state (the static graph,
no decisions, no feedback), so a search encodes once for all of them; the head is trained
on the encoder of a trained network, which it leaves as it is (:mod:`.train_layouts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from tagplan.gnn.features import (
    ABLATIONS,
    ACT_FEATURES,
    DEV_FEATURES,
    EDGE_FEATURES,
    OP_FEATURES,
)
from tagplan.gnn.hetero_attention import (
    EdgeLayout,
    HeteroGat,
    edge_layout,
    hetero_gatv2,
    pyg_reference,
)
from tagplan.gnn.layout_features import LAYOUT_FEATURES
from tagplan.gnn.segments import segment_max, segment_mean, segment_softmax, segment_sum
from tagplan.gnn.tensors import GraphTensors

__all__ = ["DEFAULT_HYPER", "GraphShape", "PriorNet"]

DEFAULT_HYPER = {"hidden": 64, "heads": 4, "layers": 3, "ablation": "none"}
_MESSAGE_EDGES = tuple(e for e in EDGE_FEATURES if e[2] != "act")


@dataclass(frozen=True)
class GraphShape:
    """What a forward pass derives from a graph's edges and node counts alone: the message
    edges as one list; each action's device groups as one of the graph's distinct sets
    (``set_member``: the device group of each membership of a set, ``member_set`` its
    set; ``action_set``: each action's set); the graph of each op group and action in a
    batch (all zeros for one graph) and the number of graphs."""

    layout: EdgeLayout
    set_member: torch.Tensor
    member_set: torch.Tensor
    num_sets: int
    action_set: torch.Tensor
    op_batch: torch.Tensor
    act_batch: torch.Tensor
    graphs: int


def _device_sets(
    member: np.ndarray, action: np.ndarray, actions: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct sets of device groups of ``actions`` actions (memberships ``member``
    -> ``action``): each set's members and set index, and each action's set."""
    order = np.argsort(action, kind="stable")
    bounds = np.searchsorted(action[order], np.arange(actions + 1))
    members_by_action = member[order]
    set_of: dict[tuple[int, ...], int] = {}
    action_set = np.empty(actions, dtype=np.int64)
    for a in range(actions):
        key = tuple(sorted(members_by_action[bounds[a] : bounds[a + 1]].tolist()))
        action_set[a] = set_of.setdefault(key, len(set_of))
    set_member = np.array([m for key in set_of for m in key], dtype=np.int64)
    member_set = np.repeat(np.arange(len(set_of)), [len(key) for key in set_of])
    return set_member, member_set, action_set


def _batch_of(data: GraphTensors, node_type: str) -> torch.Tensor:
    nodes = data[node_type]
    if nodes.batch is None:
        return torch.zeros(nodes.num_nodes, dtype=torch.long)
    return nodes.batch


class PriorNet(nn.Module):
    """GAT encoder and action decoder (module docstring). ``ablation`` names the part of
    the graph the network is trained and run without (:data:`~.features.ABLATIONS`);
    whoever builds its input applies it (:func:`~.features.ablate`)."""

    def __init__(
        self,
        hidden: int = 64,
        heads: int = 4,
        layers: int = 3,
        ablation: str = "none",
        layout_head: bool = False,
    ) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
        if ablation not in ABLATIONS:
            raise ValueError(f"unknown ablation {ablation!r}; expected one of {ABLATIONS}")
        self.hyper: dict = {
            "hidden": hidden,
            "heads": heads,
            "layers": layers,
            "ablation": ablation,
        }
        # PyG's modules over the same parameters, run instead of :func:`hetero_gatv2`
        # when set (:meth:`run_pyg_reference`); a plain list, so not a submodule
        self._reference: list[nn.Module] | None = None
        self.embed = nn.ModuleDict(
            {
                "op": nn.Linear(len(OP_FEATURES), hidden),
                "dev": nn.Linear(len(DEV_FEATURES), hidden),
            }
        )
        self.convs = nn.ModuleList(
            HeteroGat(hidden, heads, {e: len(EDGE_FEATURES[e]) for e in _MESSAGE_EDGES})
            for _ in range(layers)
        )
        self.norms = nn.ModuleList(
            nn.ModuleDict({t: nn.LayerNorm(hidden) for t in ("op", "dev")}) for _ in range(layers)
        )
        self.act_embed = nn.Linear(len(ACT_FEATURES), hidden)
        self.decoder = nn.Sequential(nn.Linear(5 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        if layout_head:  # recorded only where present: older checkpoints have no such key
            self.hyper["layout_head"] = True
            self.layout_embed = nn.Linear(len(LAYOUT_FEATURES), hidden)
            self.layout_decoder = nn.Sequential(
                nn.Linear(5 * hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1)
            )

    @property
    def has_layout_head(self) -> bool:
        return bool(self.hyper.get("layout_head", False))

    def run_pyg_reference(self, on: bool = True) -> None:
        """Pass messages with PyG's own ``HeteroConv`` of ``GATv2Conv`` modules over this
        network's parameters (imports PyG): the reference the tests and
        ``bench/gnn_latency.py`` compare the fused rounds with. ``on=False``: back to
        :func:`~.hetero_attention.hetero_gatv2`."""
        self._reference = [pyg_reference(conv) for conv in self.convs] if on else None

    def layout_parameters(self) -> list[nn.Parameter]:
        """The layout head's weights: what training it fits (module docstring)."""
        return [*self.layout_embed.parameters(), *self.layout_decoder.parameters()]

    @staticmethod
    def shape_of(data: GraphTensors) -> GraphShape:
        """The :class:`GraphShape` of ``data`` (a graph or a batch of graphs)."""
        edge_index = {e: data[e].edge_index for e in _MESSAGE_EDGES}
        num_nodes = {t: data[t].num_nodes for t in ("op", "dev")}
        member, action = data["dev", "in", "act"].edge_index.numpy()
        set_member, member_set, action_set = _device_sets(member, action, data["act"].num_nodes)
        act_batch = _batch_of(data, "act")
        return GraphShape(
            layout=edge_layout(_MESSAGE_EDGES, edge_index, num_nodes),
            set_member=torch.from_numpy(set_member),
            member_set=torch.from_numpy(member_set),
            num_sets=int(action_set.max()) + 1 if len(action_set) else 0,
            action_set=torch.from_numpy(action_set),
            op_batch=_batch_of(data, "op"),
            act_batch=act_batch,
            graphs=int(act_batch.max()) + 1 if act_batch.numel() else 1,
        )

    def encode(self, data: GraphTensors, shape: GraphShape) -> dict[str, torch.Tensor]:
        """The op and device groups' embeddings after the rounds of message passing."""
        layout = shape.layout
        h = {t: torch.relu(self.embed[t](data[t].x)) for t in ("op", "dev")}
        edge_attr = {e: data[e].edge_attr for e in _MESSAGE_EDGES}
        edge_index = layout.index
        for layer, (conv, norm) in enumerate(zip(self.convs, self.norms, strict=True)):
            if self._reference is None:
                out = hetero_gatv2(conv, h, layout, edge_attr)
            else:
                out = self._reference[layer](h, edge_index, edge_attr_dict=edge_attr)
            h = {t: norm[t](h[t] + torch.relu(out[t])) for t in h}
        return h

    def logits(self, data: GraphTensors, shape: GraphShape | None = None) -> torch.Tensor:
        """One logit per action node of ``data`` (a graph or a batch of graphs);
        ``shape``: its :meth:`shape_of`, when the caller keeps it."""
        shape = shape or self.shape_of(data)
        h = self.encode(data, shape)
        op_batch, act_batch, graphs = shape.op_batch, shape.act_batch, shape.graphs
        current = data["op"].x[:, OP_FEATURES.index("current")].unsqueeze(1)
        current_op = segment_sum(h["op"] * current, op_batch, graphs)
        mean_op = segment_mean(h["op"], op_batch, graphs)
        used = h["dev"].index_select(0, shape.set_member)
        sets, member_set = shape.num_sets, shape.member_set
        used_mean = segment_mean(used, member_set, sets)
        used_max = segment_max(used, member_set, sets)
        features = torch.cat(
            [
                torch.relu(self.act_embed(data["act"].x)),
                used_mean.index_select(0, shape.action_set),
                used_max.index_select(0, shape.action_set),
                current_op.index_select(0, act_batch),
                mean_op.index_select(0, act_batch),
            ],
            dim=1,
        )
        return self.decoder(features).squeeze(1)

    def forward(self, data: GraphTensors, shape: GraphShape | None = None) -> torch.Tensor:
        """The prior: a softmax over the actions of each graph."""
        shape = shape or self.shape_of(data)
        return segment_softmax(self.logits(data, shape), shape.act_batch, shape.graphs)

    def log_probabilities(self, data: GraphTensors) -> torch.Tensor:
        """``log`` of :meth:`forward`, computed stably (training's cross-entropy)."""
        shape = self.shape_of(data)
        logits = self.logits(data, shape)
        batch, graphs = shape.act_batch, shape.graphs
        top = segment_max(logits.detach(), batch, graphs)[batch]
        shifted = logits - top
        norm = segment_sum(shifted.exp(), batch, graphs)
        return shifted - norm.log()[batch]

    def layout_logits(
        self,
        h: dict[str, torch.Tensor],
        x: torch.Tensor,
        device_groups: Sequence[Sequence[int]],
        focus: torch.Tensor,
    ) -> torch.Tensor:
        """One logit per candidate of a layout level (:class:`~.layout_features.
        LayoutCandidates`: features ``x``, device groups, ``focus`` over the op groups),
        from the embeddings ``h`` of the search's root state (:meth:`encode`)."""
        if not self.has_layout_head:
            raise ValueError("this network has no layout head")
        used_mean = torch.stack([h["dev"][list(groups)].mean(0) for groups in device_groups])
        used_max = torch.stack([h["dev"][list(groups)].amax(0) for groups in device_groups])
        mean_op = h["op"].mean(0).expand(len(x), -1)
        features = torch.cat(
            [torch.relu(self.layout_embed(x)), used_mean, used_max, focus @ h["op"], mean_op],
            dim=1,
        )
        return self.layout_decoder(features).squeeze(1)
