"""The compile's walk (compile/walk.py): fragments and crossings cover every read once, and
a placement compiles to the same task graph whatever op groups a strategy names it by."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tagplan.planner.compile.graphdef import compile_graphdef
from tagplan.planner.compile.placement import place
from tagplan.planner.compile.walk import default_walk, walk
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.search.actions import ActionSpace
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.search.grouping import cluster_mean_op_time_s, group_ops
from tagplan.planner.search.mcts import StrategySearch
from tagplan.planner.strategy import OpGroup, Option, Strategy, resolve
from tagplan.planner.topology import load_cluster
from tests.planner.zoo_graphs import zoo_ir, zoo_source


@pytest.mark.parametrize("model", ["small_cnn", "tiny_lstm", "tiny_wide_deep"])
def test_fragments_and_crossings_read_every_input_once(model: str) -> None:
    ir = zoo_ir(model)
    chunk = np.random.default_rng(3).integers(0, 5, size=ir.num_ops)
    order = walk(ir, chunk)
    reads: Counter = Counter()
    for k, (ops, inputs) in enumerate(zip(order.ops, order.inputs, strict=True)):
        assert ops == sorted(ops) and len({int(chunk[op]) for op in ops}) == 1
        assert order.position[ops].tolist() == [k] * len(ops)
        for op, tensors in zip(ops, inputs, strict=True):
            reads.update((op, t) for t in tensors)
            assert all(chunk[ir.tensor_producer[t]] == chunk[op] for t in tensors)
    for crossing in order.crossings:
        for tensor, readers in crossing.reads:
            assert tensor in order.exported[crossing.chunk]
            readers_chunks = set()
            for op, count in readers:
                reads[(op, tensor)] += count
                readers_chunks.add(int(order.position[op]))
            assert readers_chunks == set(crossing.readers)
            assert crossing.chunk not in crossing.readers
    assert reads == Counter((op, t) for op in range(ir.num_ops) for t in ir.input_lists[op])


def pinned(strategy: Strategy, ir, cluster) -> Strategy:
    """``strategy`` with each parameter server named where resolving it put it (a server
    left unnamed goes round robin over the groups that leave theirs unnamed, which another
    grouping counts anew)."""
    resolved = resolve(strategy, ir, cluster)
    groups = [
        OpGroup(
            ops=g.ops,
            decision=g.decision.model_copy(
                update={"ps_device": str(cluster.device_names[resolved.group_ps_device[k]])}
            )
            if g.decision.option == Option.REPLICATE_PS
            else g.decision,
        )
        for k, g in enumerate(strategy.groups)
    ]
    return Strategy(name=strategy.name, groups=groups)


@pytest.mark.parametrize("model", ["small_cnn", "tiny_wide_deep"])
def test_a_placement_compiles_alike_whatever_groups_name_it(model: str) -> None:
    """A random mix of the search's replicating actions, over the search's op groups and
    again with every op a group of its own: the same placement, the same task graph (but
    the group each task reports to) and the same step."""
    ir = zoo_ir(model)
    cluster = load_cluster("testbed")
    evaluator = Evaluator(ir, cluster)
    grouping = group_ops(ir, cluster_mean_op_time_s(ir, cluster, evaluator.costs), max_groups=8)
    search = StrategySearch(
        evaluator, grouping, ActionSpace(ir, cluster, evaluator.costs), reference_step_s=1.0
    )
    # a model-parallel group's placer places its ops together: one op a group, apart
    replicated = [
        i for i, a in enumerate(search.space.actions) if a.option != Option.MODEL_PARALLEL
    ]
    rng = np.random.default_rng(11)
    for _ in range(3):
        key = tuple(rng.choice(replicated, size=grouping.num_groups).tolist())
        grouped = pinned(search.strategy_of(key), ir, cluster)
        one_each = Strategy(
            name="one op a group",
            groups=[OpGroup(ops=[op], decision=g.decision) for g in grouped.groups for op in g.ops],
        )
        placements = [place(ir, resolve(s, ir, cluster)) for s in (grouped, one_each)]
        for name in ("op_mode", "inst_ptr", "inst_device", "inst_lo", "inst_hi"):
            np.testing.assert_array_equal(*(getattr(p, name) for p in placements))
        for by_class in (True, False):
            a = evaluator.evaluate(grouped, by_class=by_class)
            b = Evaluator(ir, cluster).evaluate(one_each, by_class=by_class)
            assert a.step_time_s == b.step_time_s
            graph_a, graph_b = a.compiled.task_graph, b.compiled.task_graph
            for name, value in vars(graph_a).items():
                if isinstance(value, np.ndarray) and name != "task_group":
                    np.testing.assert_array_equal(getattr(graph_b, name), value, err_msg=name)
            assert graph_a.task_names == graph_b.task_names


def test_a_graphdef_compiled_in_an_evaluators_walk_is_the_one_it_cuts_itself() -> None:
    """The planner hands the GraphDef its evaluator's walk instead of cutting the graph
    again: the same chunks, the same bytes."""
    source, ir = zoo_source("small_cnn"), zoo_ir("small_cnn")
    cluster = load_cluster("testbed")
    evaluator = Evaluator(ir, cluster)
    assert evaluator.compiler.walk.op_order.tolist() == default_walk(ir, cluster).op_order.tolist()
    resolved = resolve(baseline_strategy("dp-ps", ir, cluster, evaluator.costs), ir, cluster)
    handed = compile_graphdef(source.graph_def, ir, cluster, resolved, walk=evaluator.compiler.walk)
    own = compile_graphdef(source.graph_def, ir, cluster, resolved)
    assert handed.graph_def_bytes == own.graph_def_bytes
