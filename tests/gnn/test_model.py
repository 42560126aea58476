"""The network: a distribution over exactly the candidate actions, the same whether a
state is scored alone or in a batch, and a stable log-softmax for training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tagplan.gnn.features import (
    DEV_FEATURES,
    OP_FEATURES,
    ablate,
    state_graph,
    static_graph,
)
from tagplan.gnn.model import PriorNet, _device_sets
from tagplan.gnn.prior import GnnPrior
from tagplan.gnn.tensors import batch_tensors, to_tensors
from tagplan.planner.search.prior import PriorQuery


@pytest.fixture(scope="module")
def net() -> PriorNet:
    torch.manual_seed(7)
    return PriorNet(hidden=32, heads=4, layers=2).eval()


def _queries(search) -> list[PriorQuery]:
    return [q for q, _ in search.visit_targets(1)]


def test_one_probability_per_candidate_action(searched, net) -> None:
    static = static_graph(searched.context)
    for query in _queries(searched)[:5]:
        p = net(to_tensors(state_graph(static, query))).detach().numpy()
        assert p.shape == (len(searched.space.actions),)
        assert (p > 0).all() and p.sum() == pytest.approx(1.0, abs=1e-5)


def test_a_batch_scores_each_state_as_alone(searched, net) -> None:
    static = static_graph(searched.context)
    graphs = [to_tensors(state_graph(static, q)) for q in _queries(searched)[:4]]
    alone = [net(g).detach() for g in graphs]
    batch = batch_tensors(graphs)
    together = net(batch).detach()
    act_batch = batch["act"].batch
    for i, p in enumerate(alone):
        assert torch.allclose(together[act_batch == i], p, atol=1e-5)
    log_p = net.log_probabilities(batch).detach()
    assert torch.allclose(log_p.exp(), together, atol=1e-5)


def test_the_decisions_change_the_prior(searched, net) -> None:
    """The state matters: two vertices of one search get different priors."""
    static = static_graph(searched.context)
    queries = sorted(_queries(searched), key=lambda q: q.level)
    first = net(to_tensors(state_graph(static, queries[0]))).detach()
    last = net(to_tensors(state_graph(static, queries[-1]))).detach()
    assert not torch.allclose(first, last)


def test_the_gnn_prior_in_the_search_mixes_in_uniform_and_is_deterministic(searched, net) -> None:
    prior = GnnPrior(net, name="test", uniform_mix=0.25)
    query = _queries(searched)[-1]
    p = prior.probabilities(query)
    n = len(query.actions)
    assert p.sum() == pytest.approx(1.0) and p.min() >= 0.25 / n - 1e-12
    assert np.array_equal(p, prior.probabilities(query))
    assert prior.calls == 2 and prior.seconds > 0
    with pytest.raises(ValueError):
        GnnPrior(net, name="bad", uniform_mix=1.5)


def test_the_shape_a_prior_keeps_scores_every_state_as_a_fresh_pass(searched, net) -> None:
    """The prior derives the graph's shape (edge list, grids, device sets, batch) at its
    first expansion and keeps it for the search; every later state scores as a pass
    that derives its own."""
    prior = GnnPrior(net, name="test", uniform_mix=0.0)
    static = static_graph(searched.context)
    queries = sorted(_queries(searched), key=lambda q: -q.level)
    for query in queries:
        fresh = net(to_tensors(state_graph(static, query))).detach().double().numpy()
        np.testing.assert_allclose(prior.probabilities(query), fresh / fresh.sum(), atol=1e-6)
    assert prior._shape is not None and prior._shape.num_sets < len(searched.space.actions)


def test_device_sets_are_shared_by_the_options_that_use_them() -> None:
    # actions 0 and 2 use device groups {0, 1}, action 1 uses {2}, action 3 none
    member = np.array([2, 0, 1, 1, 0])
    action = np.array([1, 0, 0, 2, 2])
    set_member, member_set, action_set = _device_sets(member, action, 4)
    assert action_set.tolist() == [0, 1, 0, 2]
    assert set_member.tolist() == [0, 1, 2] and member_set.tolist() == [0, 0, 1]


def test_ablations_remove_what_they_name(searched) -> None:
    query = max((q for q, _ in searched.visit_targets(1)), key=lambda q: q.level)
    graph = state_graph(static_graph(searched.context), query)
    assert ablate(graph, "none") is graph
    blind = ablate(graph, "no-feedback")
    assert graph.op_x[:, OP_FEATURES.index("makespan_vs_step")].any()
    assert not blind.op_x[:, OP_FEATURES.index("makespan_vs_step")].any()
    assert not blind.dev_x[:, DEV_FEATURES.index("peak_memory_vs_capacity")].any()
    assert np.array_equal(blind.op_x[:, 0], graph.op_x[:, 0])  # the rest is kept
    alone = ablate(graph, "no-device-graph")
    assert not alone.dev_x.any()
    for (src, _, dst), (index, _) in alone.edges.items():
        assert (index.shape[1] == 0) == ("dev" in (src, dst))
    torch.manual_seed(0)
    net = PriorNet(hidden=16, heads=2, layers=1, ablation="no-device-graph").eval()
    p = net(to_tensors(alone)).detach()
    assert p.shape == (len(searched.space),) and float(p.sum()) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(ValueError, match="unknown ablation"):
        ablate(graph, "no-ops")
