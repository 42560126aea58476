"""The evaluator's compute bound: exactly the compute the task graph gives the busiest
GPU, so never above the simulated step, for every strategy kind (pipelines included);
a by-class evaluation's per-GPU factor, the size of the per-GPU task graph over its
own; and the compile identity, which changes with whatever the compile reads."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.strategy import Collective, GradientSync
from tagplan.planner.topology import load_cluster
from tests.planner.compile.test_graphdef import (
    LAYERS,
    STRATEGIES,
    committed,
    strategy,
    two_by_two,
)
from tests.planner.compile.test_pipeline import joined_stages
from tests.planner.layouts import layout_strategies
from tests.planner.zoo_graphs import zoo_ir


def _instance_compute_s(evaluator: Evaluator, candidate) -> np.ndarray:
    """Seconds of op-instance compute tasks per GPU in the per-GPU task graph."""
    evaluation = evaluator.evaluate(candidate, by_class=False)
    graph, tasks = evaluation.compiled.task_graph, evaluation.compiled.instance_task
    busy = np.bincount(
        graph.task_device[tasks],
        weights=graph.task_duration_s[tasks],
        minlength=graph.num_devices,
    )
    assert evaluation.step_time_s >= busy.max() * (1 - 1e-12)
    return busy


@pytest.mark.parametrize("model", ["mlp", "small_cnn"])
def test_the_bound_is_the_busiest_gpus_op_compute(model: str) -> None:
    _, ir = committed(model)
    cluster = two_by_two()
    evaluator = Evaluator(ir, cluster)
    candidates = [strategy(name, ir, cluster, LAYERS[model]) for name in STRATEGIES]
    candidates += [baseline_strategy(n, ir, cluster, evaluator.costs) for n in ("single", "m-topo")]
    for candidate in candidates:
        busy = _instance_compute_s(evaluator, candidate)
        assert evaluator.compute_bound_s(candidate) == pytest.approx(busy.max(), rel=1e-12)


def test_a_strategy_bounded_then_simulated_is_placed_once() -> None:
    """The search bounds a strategy and then simulates it: the evaluator places it once
    for both (the same object), and the simulation equals a new evaluator's, which never
    bounded it; another strategy, even an equal one, is placed anew."""
    _, ir = committed("mlp")
    cluster = two_by_two()
    evaluator = Evaluator(ir, cluster)
    candidate = baseline_strategy("dp-nccl", ir, cluster, evaluator.costs)
    evaluator.step_bound_s(candidate)
    resolved, placement = evaluator.placed(candidate)
    evaluation = evaluator.evaluate(candidate)
    assert evaluation.resolved is resolved
    assert evaluator.placed(candidate)[1] is placement
    assert evaluator.placed(candidate.model_copy())[1] is not placement
    fresh = Evaluator(ir, cluster, costs=evaluator.costs).evaluate(candidate)
    assert evaluation.step_time_s == fresh.step_time_s
    assert evaluation.result.peak_memory_bytes.tolist() == fresh.result.peak_memory_bytes.tolist()


def test_the_bound_of_every_pipelined_candidate_on_a_real_cluster() -> None:
    _, ir = committed("small_cnn")
    cluster = load_cluster("testbed")
    evaluator = Evaluator(ir, cluster)
    candidates = layout_strategies(ir, cluster, evaluator.costs)
    assert len(candidates) >= 5
    for candidate in candidates:
        busy = _instance_compute_s(evaluator, candidate)
        assert evaluator.compute_bound_s(candidate) == pytest.approx(busy.max(), rel=1e-12)


def test_the_bound_refuses_a_pipeline_the_graph_cannot_run() -> None:
    """A model-parallel layer outside the stages, between two of them, would join every
    micro-batch: the bound refuses it for the evaluation's reason."""
    _, ir = committed("mlp")
    cluster = two_by_two()
    evaluator = Evaluator(ir, cluster)
    candidate = joined_stages(ir)
    with pytest.raises(InvalidInput) as refused:
        evaluator.evaluate(candidate)
    with pytest.raises(InvalidInput, match=re.escape(str(refused.value))):
        evaluator.compute_bound_s(candidate)


@pytest.mark.parametrize(
    ("model", "cluster", "batch"),
    [("mlp", "testbed", None), ("small_cnn", "cloud", None), ("mlp", "testbed", 4)],
)
def test_the_per_gpu_factor_counts_the_tasks_a_per_gpu_compile_makes(model, cluster, batch) -> None:
    """By class, each task stands for the per-GPU tasks of its class's members: their sum
    is the per-GPU task graph's size, and GPUs without a replica (a batch of 4 on
    ``testbed``) add none; a per-GPU compile's factor is 1."""
    ir, topology = zoo_ir(model, batch), load_cluster(cluster)
    evaluator = Evaluator(ir, topology)
    for name in ("dp-nccl", "horovod"):
        candidate = baseline_strategy(name, ir, topology, evaluator.costs)
        by_class = evaluator.evaluate(candidate).compiled
        per_gpu = evaluator.evaluate(candidate, by_class=False).compiled
        assert by_class.symmetry is not None and per_gpu.per_gpu_factor == 1.0
        by_class_tasks = len(by_class.task_graph.task_kind)
        per_gpu_tasks = len(per_gpu.task_graph.task_kind)
        assert by_class.per_gpu_factor * by_class_tasks == pytest.approx(per_gpu_tasks)
        assert by_class.per_gpu_factor > 1.0


def test_the_compile_identity_tells_apart_what_the_compile_reads() -> None:
    """Changing any decision field the compile reads beside the placement (a group's
    gradient synchronization, bucket size, collective), or the placement itself (the
    GPUs a group replicates over), changes the identity; the strategy's name does not.
    Each changed strategy is simulated: the identity separates strategies that step
    differently."""
    ir = zoo_ir("mlp")
    evaluator = Evaluator(ir, load_cluster("testbed"))
    base = baseline_strategy("dp-nccl", ir, evaluator.cluster, evaluator.costs)
    decision = base.default

    def with_decision(**update) -> object:
        return base.model_copy(update={"default": decision.model_copy(update=update)})

    changed = [
        with_decision(gradient_sync=GradientSync.OVERLAP),
        with_decision(gradient_sync=GradientSync.BUCKETED, bucket_bytes=2**20),
        with_decision(gradient_sync=GradientSync.BUCKETED, bucket_bytes=2**10),
        with_decision(collective=Collective.TREE),
        with_decision(device_groups=decision.device_groups[:1]),
    ]
    identities = [evaluator.identity(s) for s in [base, *changed]]
    assert len(set(identities)) == len(identities)
    assert evaluator.identity(base.model_copy(update={"name": "renamed"})) == identities[0]
    steps = {evaluator.evaluate(s).step_time_s for s in [base, *changed]}
    assert len(steps) > 1
