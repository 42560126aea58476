"""The evaluator's compute bound: exactly the compute the task graph gives the busiest
GPU, so never above the simulated step, for every strategy kind (pipelines included)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.search.pipeline_stages import pipeline_candidates
from tagplan.planner.topology import load_cluster
from tests.planner.compile.test_graphdef import (
    LAYERS,
    STRATEGIES,
    committed,
    strategy,
    two_by_two,
)


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


def test_the_bound_of_every_pipelined_candidate_on_a_real_cluster() -> None:
    _, ir = committed("small_cnn")
    cluster = load_cluster("testbed")
    evaluator = Evaluator(ir, cluster)
    candidates = pipeline_candidates(ir, cluster, evaluator.costs)
    assert len(candidates) >= 5
    for candidate in candidates:
        busy = _instance_compute_s(evaluator, candidate)
        assert evaluator.compute_bound_s(candidate) == pytest.approx(busy.max(), rel=1e-12)


def test_the_bound_refuses_a_pipeline_the_graph_cannot_run() -> None:
    _, ir = committed("bert_small")
    cluster = two_by_two()
    evaluator = Evaluator(ir, cluster)
    candidate = pipeline_candidates(ir, cluster, evaluator.costs)[0]
    with pytest.raises(InvalidInput) as refused:
        evaluator.evaluate(candidate)
    with pytest.raises(InvalidInput, match=re.escape(str(refused.value))):
        evaluator.compute_bound_s(candidate)
