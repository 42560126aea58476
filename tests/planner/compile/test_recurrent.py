"""A statically unrolled recurrent model (the zoo's ``tiny_lstm``): each weight's gradient
is the ``AddN`` of one partial per time step. Under data parallelism each replica adds up
its own partials and the sum over replicas is taken once per parameter, in both back ends,
and the compiled graph computes what the single-device step computes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from tagplan.planner.compile.graphdef import compile_graphdef
from tagplan.planner.compile.placement import place
from tagplan.planner.compile.task_compiler import compile_tasks
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.batch import SplitCategory
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.sim.taskgraph import COLLECTIVE
from tagplan.planner.strategy import GroupDecision, Mode, OpGroup, Option, Strategy, resolve
from tagplan.planner.topology import load_cluster
from tests.planner.verify.own_process import verify_many_apart

THREE_GPUS = {
    "machines": [
        {"name": "a", "gpus": {"type": "T4", "count": 2}, "intra_bandwidth_gbps": 100},
        {"name": "b", "gpus": {"type": "V100-16GB", "count": 1}, "intra_bandwidth_gbps": 100},
    ],
    "network": {"bandwidth_gbps": 10},
}
DATA_PARALLEL = Strategy(
    default=GroupDecision(device_groups=[0, 1], option=Option.REPLICATE_ALLREDUCE)
)


@pytest.fixture(scope="module")
def source():
    return load_graph_source("zoo:tiny_lstm")


@pytest.fixture(scope="module")
def ir(source):
    return analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)


@pytest.fixture(scope="module")
def cluster():
    return load_cluster(THREE_GPUS)


def _accumulators(ir) -> list[int]:
    """The ``AddN`` ops that produce a parameter's gradient from per-step partials."""
    producers = ir.tensor_producer[ir.parameters.gradient_tensor]
    return [int(op) for op in producers if ir.op_types[op] == "AddN"]


def test_the_sum_of_per_step_partial_gradients_is_split_sum(ir) -> None:
    accumulators = _accumulators(ir)
    assert len(accumulators) == 8  # every weight but the two embedding tables
    assert all(ir.split_category[op] == SplitCategory.SPLIT_SUM for op in accumulators)


def test_data_parallelism_reduces_each_gradient_once(ir, cluster) -> None:
    resolved = resolve(DATA_PARALLEL, ir, cluster)
    placement = place(ir, resolved)
    assert all(placement.op_mode[op] == Mode.SPLIT for op in _accumulators(ir))
    costs = OpCostModel(ir, cluster)
    graph = compile_tasks(ir, cluster, resolved, costs=costs).task_graph
    collectives = np.flatnonzero(graph.task_kind == COLLECTIVE)
    reduced = sorted(graph.task_names[i].split()[1].rsplit(":", 1)[0] for i in collectives)
    gradients = ir.tensor_producer[ir.parameters.gradient_tensor]
    assert reduced == sorted(ir.op_names[op] for op in gradients)
    assert (
        graph.task_bytes[collectives].sum() == ir.tensor_bytes[ir.parameters.gradient_tensor].sum()
    )


def test_the_graphdef_sums_each_gradient_over_replicas_once(source, ir, cluster) -> None:
    """Across two machines every gradient is one ``CollectiveReduceV2`` per GPU, of the
    tensor the update reads, and nothing else is reduced."""
    resolved = resolve(DATA_PARALLEL, ir, cluster)
    graph_def = compile_graphdef(source.graph_def, ir, cluster, resolved).graph_def
    members = Counter(
        n.name.rsplit("/allreduce_d", 1)[0] for n in graph_def.node if n.op == "CollectiveReduceV2"
    )
    gradients = ir.tensor_producer[ir.parameters.gradient_tensor]
    assert members == {ir.op_names[op]: cluster.num_devices for op in gradients}


@pytest.mark.tf
@pytest.mark.slow
def test_the_compiled_step_computes_the_single_device_step(ir) -> None:
    """Uneven data parallelism, and a strategy that puts the encoder's weight sums in a
    group of their own on one GPU (they then read the partials summed over replicas)."""
    params = ir.parameters
    encoder = [
        ir.op_names[ir.tensor_producer[gradient]]
        for variable, gradient in zip(params.variable_op, params.gradient_tensor, strict=True)
        if ir.op_names[variable].startswith("encoder/")
    ]
    assert len(encoder) == 2
    apart = Strategy(
        groups=[
            OpGroup(
                ops=encoder,
                decision=GroupDecision(device_groups=[1], option=Option.REPLICATE_ALLREDUCE),
            )
        ],
        default=DATA_PARALLEL.default,
    )
    cluster = load_cluster(THREE_GPUS)
    reports = verify_many_apart("zoo:tiny_lstm", cluster, [DATA_PARALLEL, apart], batch_size=5)
    for report in reports:
        assert report.passed, report.summary()
