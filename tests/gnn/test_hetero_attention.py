"""The fused message-passing round against PyG's own HeteroConv of GATv2Conv modules: the
same outputs and the same gradients, on real search states and on batches, with edge
types left empty (an ablation) or not; the network's parameters named and drawn as PyG's
modules name and draw them, and its batches built as PyG's ``Batch`` builds them."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, HeteroData
from torch_geometric.nn import GATv2Conv, HeteroConv

from tagplan.gnn.features import EDGE_FEATURES, ablate, state_graph, static_graph
from tagplan.gnn.hetero_attention import Grid, edge_layout, hetero_gatv2, pyg_reference
from tagplan.gnn.model import _MESSAGE_EDGES, PriorNet
from tagplan.gnn.tensors import GraphTensors, batch_tensors, to_tensors


def _inputs(data, net: PriorNet) -> tuple[dict, dict, dict]:
    h = {t: torch.relu(net.embed[t](data[t].x)) for t in ("op", "dev")}
    edge_index = {e: data[e].edge_index for e in _MESSAGE_EDGES}
    edge_attr = {e: data[e].edge_attr for e in _MESSAGE_EDGES}
    return h, edge_index, edge_attr


def _states(searched, ablation: str) -> list:
    static = static_graph(searched.context)
    queries = sorted((q for q, _ in searched.visit_targets(1)), key=lambda q: q.level)
    return [to_tensors(ablate(state_graph(static, q), ablation)) for q in queries[:3]]


def _hetero_data(data: GraphTensors) -> HeteroData:
    hetero = HeteroData()
    for node_type, nodes in data.nodes.items():
        hetero[node_type].x = nodes.x
    for edge_type, edges in data.edges.items():
        hetero[edge_type].edge_index = edges.edge_index
        hetero[edge_type].edge_attr = edges.edge_attr
    return hetero


def test_a_batch_is_pyg_batch(searched) -> None:
    graphs = _states(searched, "none")
    mine = batch_tensors(graphs)
    theirs = Batch.from_data_list([_hetero_data(g) for g in graphs])
    assert mine.num_graphs == theirs.num_graphs == 3
    for node_type in ("op", "dev", "act"):
        assert torch.equal(mine[node_type].x, theirs[node_type].x)
        assert torch.equal(mine[node_type].batch, theirs[node_type].batch)
    assert set(mine.edges) == set(theirs.edge_types)
    for edge_type in mine.edges:
        assert torch.equal(mine[edge_type].edge_index, theirs[edge_type].edge_index)
        assert torch.equal(mine[edge_type].edge_attr, theirs[edge_type].edge_attr)


def test_parameters_are_named_and_drawn_as_pyg_draws_them() -> None:
    """For one seed, PyG's modules built in the network's order hold the same weights
    under the same names (a checkpoint's keys; a training run's start)."""
    torch.manual_seed(21)
    net = PriorNet(hidden=24, heads=3, layers=2)
    torch.manual_seed(21)
    torch.nn.Linear(len(net.embed["op"].weight[0]), 24)
    torch.nn.Linear(len(net.embed["dev"].weight[0]), 24)
    theirs = [
        HeteroConv(
            {
                e: GATv2Conv(24, 8, heads=3, edge_dim=len(EDGE_FEATURES[e]), add_self_loops=False)
                for e in _MESSAGE_EDGES
            },
            aggr="sum",
        )
        for _ in range(2)
    ]
    for mine, reference in zip(net.convs, theirs, strict=True):
        expected = reference.state_dict()
        assert list(mine.state_dict()) == list(expected)
        for name, value in mine.state_dict().items():
            assert torch.equal(value, expected[name]), name


@pytest.mark.parametrize("ablation", ["none", "no-device-graph"])
def test_equals_pyg_heteroconv_on_states_and_batches(searched, ablation: str) -> None:
    torch.manual_seed(3)
    net = PriorNet(hidden=24, heads=3, layers=1)
    for bias in (p for name, p in net.named_parameters() if name.endswith("bias")):
        torch.nn.init.normal_(bias)  # PyG starts biases at zero; a summed bias must show
    conv = net.convs[0]
    reference = pyg_reference(conv)
    graphs = _states(searched, ablation)
    for data in [*graphs, batch_tensors(graphs)]:
        h, edge_index, edge_attr = _inputs(data, net)
        expected = reference(h, edge_index, edge_attr_dict=edge_attr)
        layout = edge_layout(_MESSAGE_EDGES, edge_index, {t: len(h[t]) for t in h})
        fused = hetero_gatv2(conv, h, layout, edge_attr)
        assert set(fused) == set(expected)
        for node_type in expected:
            assert fused[node_type].shape == expected[node_type].shape
            assert torch.allclose(fused[node_type], expected[node_type], atol=1e-5)


def test_every_pair_is_a_grid_in_one_state_and_none_in_a_batch(searched) -> None:
    graphs = _states(searched, "none")
    for data in graphs:
        counts = {t: data[t].num_nodes for t in ("op", "dev")}
        layout = edge_layout(
            _MESSAGE_EDGES, {e: data[e].edge_index for e in _MESSAGE_EDGES}, counts
        )
        assert layout.grids == {
            ("op", "on", "dev"): Grid(source_major=True),
            ("dev", "hosts", "op"): Grid(source_major=False),
            ("dev", "link", "dev"): Grid(source_major=True, self_edges=False),
        }
        assert set(layout.types) == set(_MESSAGE_EDGES) - set(layout.grids)
    batch = batch_tensors(graphs)
    counts = {t: batch[t].num_nodes for t in ("op", "dev")}
    layout = edge_layout(_MESSAGE_EDGES, {e: batch[e].edge_index for e in _MESSAGE_EDGES}, counts)
    assert layout.grids == {} and layout.types == _MESSAGE_EDGES


@pytest.mark.parametrize("self_edges", [True, False])
@pytest.mark.parametrize("source_major", [True, False])
def test_a_grid_in_either_order_equals_pyg(source_major: bool, self_edges: bool) -> None:
    """A square edge type computed densely, by source or by destination, with or without
    each node's edge to itself, against GATv2Conv on the same edges."""
    torch.manual_seed(11)
    net = PriorNet(hidden=24, heads=3, layers=1)
    for bias in (p for name, p in net.named_parameters() if name.endswith("bias")):
        torch.nn.init.normal_(bias)
    conv, edge_type, n = net.convs[0], ("dev", "link", "dev"), 5
    src = torch.arange(n).repeat_interleave(n)
    dst = torch.arange(n).repeat(n)
    keep = torch.ones(n * n, dtype=torch.bool) if self_edges else src != dst
    pairs = (src[keep], dst[keep]) if source_major else (dst[keep], src[keep])
    index = torch.stack(pairs)
    attr = torch.randn(index.shape[1], 3)  # the dev -> dev edges' three features
    h = {"dev": torch.randn(n, 24)}
    layout = edge_layout((edge_type,), {edge_type: index}, {"dev": n})
    assert layout.grids == {edge_type: Grid(source_major, self_edges)} and not layout.types
    fused = hetero_gatv2(conv, h, layout, {edge_type: attr})["dev"]
    expected = pyg_reference(conv).convs[edge_type](h["dev"], index, attr)
    assert torch.allclose(fused, expected, atol=1e-5)


@pytest.mark.parametrize("batched", [False, True])
def test_gradients_equal_pyg_heteroconv(searched, batched: bool) -> None:
    torch.manual_seed(5)
    net = PriorNet(hidden=16, heads=2, layers=1)
    conv = net.convs[0]
    states = _states(searched, "none")
    data = batch_tensors(states) if batched else states[-1]
    weights = torch.randn(sum(data[t].num_nodes for t in ("op", "dev")), 16)
    reference = pyg_reference(conv)

    def gradients(run) -> list[torch.Tensor]:
        net.zero_grad()
        h, edge_index, edge_attr = _inputs(data, net)
        out = run(h, edge_index, edge_attr)
        loss = (torch.cat([out["op"], out["dev"]]) * weights).sum()
        loss.backward()
        return [p.grad.clone() for p in conv.parameters()]

    expected = gradients(lambda h, i, a: reference(h, i, edge_attr_dict=a))
    fused = gradients(
        lambda h, i, a: hetero_gatv2(
            conv, h, edge_layout(_MESSAGE_EDGES, i, {t: len(h[t]) for t in h}), a
        )
    )
    assert len(fused) == len(expected)
    for mine, theirs in zip(fused, expected, strict=True):
        assert torch.allclose(mine, theirs, atol=1e-4)


@pytest.mark.parametrize("batched", [False, True])
def test_the_network_trains_the_same_either_way(searched, batched: bool) -> None:
    """Every parameter's gradient through three layers, the decoder included, equals the
    one the PyG modules give."""
    torch.manual_seed(11)
    net = PriorNet(hidden=16, heads=2, layers=3)
    states = _states(searched, "none")
    data = batch_tensors(states) if batched else states[-1]
    weights = torch.randn(data["act"].num_nodes)

    def gradients(fused: bool) -> list[torch.Tensor]:
        net.zero_grad()
        net.run_pyg_reference(not fused)
        (net.logits(data) * weights).sum().backward()
        return [p.grad.clone() for p in net.parameters()]

    for mine, theirs in zip(gradients(True), gradients(False), strict=True):
        assert torch.allclose(mine, theirs, atol=1e-4)


def test_the_network_scores_a_batch_the_same_either_way(searched) -> None:
    torch.manual_seed(9)
    net = PriorNet(hidden=32, heads=4, layers=2).eval()
    batch = batch_tensors(_states(searched, "none"))
    fused = net(batch).detach()
    net.run_pyg_reference()
    assert torch.allclose(fused, net(batch).detach(), atol=1e-6)


def test_inference_follows_weight_changes(searched) -> None:
    """The per-head attention matrix kept between expansions is rebuilt when the weights
    change in place (an optimizer step, a checkpoint load)."""
    torch.manual_seed(11)
    net = PriorNet(hidden=16, heads=2, layers=1).eval()
    data = _states(searched, "none")[-1]
    with torch.inference_mode():
        before = net.logits(data)
    with torch.no_grad():
        for conv in net.convs[0].convs.values():
            conv.att.copy_(5.0 * torch.randn_like(conv.att))
    with torch.inference_mode():
        fused = net.logits(data)
    net.run_pyg_reference()
    with torch.inference_mode():
        reference = net.logits(data)
    assert not torch.allclose(before, reference, atol=1e-4)
    assert torch.allclose(fused, reference, atol=1e-5)
