"""METIS op grouping (TAG §4.1.1): group count, balance, parameters with their updates."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.grouping import group_ops


@cache
def zoo(name: str) -> tuple[GraphIR, np.ndarray]:
    source = load_graph_source(f"zoo:{name}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    costs = OpCostModel.for_gpu_types(ir)
    return ir, costs.op_times(costs.type_of("V100-32GB"), ir.batch_size).seconds


@pytest.mark.parametrize("name", ["resnet101", "bert_large"])
def test_large_graphs_get_at_most_60_balanced_groups(name: str) -> None:
    ir, times = zoo(name)
    grouping = group_ops(ir, times)
    assert 30 <= grouping.num_groups <= 60
    assert set(np.unique(grouping.op_group)) == set(range(grouping.num_groups))
    # METIS's balance factor 2 bounds the heaviest group by twice the average
    assert grouping.group_time_s.max() <= 2.0 * grouping.group_time_s.mean()
    assert grouping.group_time_s.sum() == pytest.approx(times.sum())


def test_a_parameter_stays_with_its_update_and_slots() -> None:
    ir, times = zoo("resnet101")
    grouping = group_ops(ir, times)
    params = ir.parameters
    for row in range(len(params)):
        group = grouping.op_group[params.variable_op[row]]
        assert grouping.op_group[params.apply_op[row]] == group
        slots = params.slot_op[params.slot_ptr[row] : params.slot_ptr[row + 1]]
        assert (grouping.op_group[slots] == group).all()
    assert grouping.group_param_bytes.sum() == ir.param_bytes


def test_same_seed_same_groups_and_fewer_groups_on_request() -> None:
    ir, times = zoo("bert_large")
    first, again = group_ops(ir, times, seed=3), group_ops(ir, times, seed=3)
    np.testing.assert_array_equal(first.op_group, again.op_group)
    assert group_ops(ir, times, max_groups=10).num_groups <= 10


def test_groups_are_numbered_by_their_first_op() -> None:
    ir, times = zoo("resnet101")
    grouping = group_ops(ir, times)
    firsts = [int(np.flatnonzero(grouping.op_group == g)[0]) for g in range(grouping.num_groups)]
    assert firsts == sorted(firsts)


def test_cut_edges_carry_the_bytes_between_groups() -> None:
    ir, times = zoo("bert_large")
    grouping = group_ops(ir, times, max_groups=20)
    assert (grouping.edge_src != grouping.edge_dst).all()
    assert grouping.edge_bytes.sum() > 0


def test_bad_options_are_refused() -> None:
    ir, times = zoo("mlp")
    with pytest.raises(InvalidInput, match="max_groups"):
        group_ops(ir, times, max_groups=0)
    with pytest.raises(InvalidInput, match="balance"):
        group_ops(ir, times, balance=0.5)
