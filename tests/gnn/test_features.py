"""The search state as a graph (TAG Table 1): shapes, flags, decisions and feedback read
back from the arrays, and features that do not depend on absolute sizes."""

from __future__ import annotations

import dataclasses

import numpy as np

from tagplan.gnn.features import (
    ACT_FEATURES,
    DEV_FEATURES,
    EDGE_FEATURES,
    OP_FEATURES,
    OPTIONS,
    state_graph,
    static_graph,
)
from tagplan.planner.search.prior import SearchContext


def _deepest(search):
    return max((q for q, _ in search.visit_targets(1)), key=lambda q: q.level)


def test_shapes_and_finite_values(searched) -> None:
    g, m = searched.grouping.num_groups, searched.space.cluster.num_groups
    static = static_graph(searched.context)
    graph = state_graph(static, _deepest(searched))
    assert graph.op_x.shape == (g, len(OP_FEATURES))
    assert graph.dev_x.shape == (m, len(DEV_FEATURES))
    assert graph.act_x.shape == (len(searched.space), len(ACT_FEATURES))
    assert set(graph.edges) == set(EDGE_FEATURES)
    for edge_type, (index, attr) in graph.edges.items():
        assert attr.shape == (index.shape[1], len(EDGE_FEATURES[edge_type]))
        assert np.isfinite(attr).all()
    for x in (graph.op_x, graph.dev_x, graph.act_x):
        assert np.isfinite(x).all() and np.abs(x).max() <= 10


def test_decisions_and_the_current_group_are_read_back(searched) -> None:
    query = _deepest(searched)
    assert query.level >= 1
    graph = state_graph(static_graph(searched.context), query)
    decided = graph.op_x[:, OP_FEATURES.index("decided")]
    current = graph.op_x[:, OP_FEATURES.index("current")]
    assert set(np.flatnonzero(decided)) == set(query.order[: query.level].tolist())
    assert np.flatnonzero(current).tolist() == [int(query.order[query.level])]
    index, attr = graph.edges[("op", "on", "dev")]
    placed = attr[:, 1] > 0
    for group, action_index in zip(query.order[: query.level], query.decided, strict=True):
        action = searched.space.actions[action_index]
        on = index[1][placed & (index[0] == group)]
        assert sorted(on.tolist()) == list(action.device_groups)
        option_column = 2 + OPTIONS.index(action.option)
        assert (attr[placed & (index[0] == group), option_column] == 1).all()
    # undecided groups are placed nowhere
    undecided = [g for g in range(len(decided)) if not decided[g]]
    assert not placed[np.isin(index[0], undecided)].any()


def test_feedback_is_zero_at_the_root_and_the_simulation_after(searched) -> None:
    static = static_graph(searched.context)
    root = next(q for q, _ in searched.visit_targets(1) if q.level == 0)
    at_root = state_graph(static, root)
    assert (at_root.op_x[:, OP_FEATURES.index("has_feedback")] == 0).all()
    assert (at_root.op_x[:, OP_FEATURES.index("makespan_vs_step")] == 0).all()
    query = _deepest(searched)
    graph = state_graph(static, query)
    step = query.feedback.step_time_s
    makespan = graph.op_x[:, OP_FEATURES.index("makespan_vs_step")]
    expected = query.feedback.group_makespan_s[: len(makespan)] / step
    assert np.allclose(makespan[: len(expected)], expected, rtol=1e-6)
    peak = graph.dev_x[:, DEV_FEATURES.index("peak_memory_vs_capacity")]
    cluster = searched.space.cluster
    for d in range(cluster.num_groups):
        devices = cluster.group_devices(d)
        ratio = query.feedback.peak_memory_bytes[devices] / cluster.device_memory_bytes[devices]
        assert peak[d] == np.float32(min(ratio.max(), 4.0))


def test_features_do_not_change_when_every_size_scales(searched) -> None:
    """Times x3, parameter and edge bytes x5: every feature is a ratio, so nothing moves
    (a network trained on one model's scale reads another's)."""
    grouping = searched.grouping
    scaled = dataclasses.replace(
        grouping,
        group_time_s=grouping.group_time_s * 3.0,
        group_param_bytes=grouping.group_param_bytes * 5,
        edge_bytes=grouping.edge_bytes * 5,
    )
    base = static_graph(searched.context)
    other = static_graph(SearchContext(scaled, searched.space, searched.reference_step_s))
    # compute-vs-communication ratios move by the time/bytes factor, as they should
    moving = {"log_params_vs_memory", "log_sync_vs_compute_slow", "log_sync_vs_compute_fast"}
    for i, name in enumerate(OP_FEATURES):
        if name not in moving:
            assert np.allclose(base.op_x[:, i], other.op_x[:, i], atol=1e-5), name
    assert np.allclose(base.dev_x[:, :3], other.dev_x[:, :3])
    assert np.allclose(base.act_x, other.act_x)
    # edge bytes are read as (bytes + 1) / mean: exact for any edge carrying a tensor
    carrying = grouping.edge_bytes >= 1024
    assert carrying.any()
    assert np.allclose(base.op_edge_attr[carrying, 0], other.op_edge_attr[carrying, 0], atol=1e-3)
