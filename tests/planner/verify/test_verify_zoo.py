"""Verification by execution on the larger zoo models without batch norm (docs/design.md §5):
data parallelism across machines and model parallelism over three GPUs on two machines."""

from __future__ import annotations

import pytest

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.search.pipeline_stages import pipeline_baseline
from tagplan.planner.strategy import GroupDecision, Option, Schedule, Strategy
from tagplan.planner.topology import load_cluster
from tests.planner.verify.own_process import verify_many_apart
from tests.planner.zoo_graphs import zoo_ir

pytestmark = [pytest.mark.tf, pytest.mark.slow]

# two T4s on one machine, one on another: every cross-machine path is exercised
THREE_GPUS = {
    "machines": [
        {"name": "a", "gpus": {"type": "T4", "count": 2}, "intra_bandwidth_gbps": 100},
        {"name": "b", "gpus": {"type": "T4", "count": 1}, "intra_bandwidth_gbps": 100},
    ],
    "network": {"bandwidth_gbps": 10},
}
STRATEGIES = {
    "data-parallel": Strategy(
        default=GroupDecision(device_groups=[0, 1], option=Option.REPLICATE_ALLREDUCE)
    ),
    "model-parallel": Strategy(
        default=GroupDecision(device_groups=[0, 1], option=Option.MODEL_PARALLEL)
    ),
}


@pytest.mark.parametrize("model", ["bert_small", "transformer"])
def test_language_models_verify_under_data_and_model_parallelism(model: str) -> None:
    reports = verify_many_apart(
        f"zoo:{model}", load_cluster(THREE_GPUS), list(STRATEGIES.values()), batch_size=3
    )
    for name, report in zip(STRATEGIES, reports, strict=True):
        assert report.passed, f"{name}: {report.summary()}"


def test_vgg19_verifies_under_data_and_model_parallelism_across_two_machines() -> None:
    """VGG19 at batch 2 over two machines with one GPU each, in float32 at the verification
    matrix's tolerance (atol = 1% of Adam's first step, bench/verify_matrix.py): in float64
    its child process peaks at 16 GB, too close to the machine's memory for the suite."""
    cluster = load_cluster(
        {
            "machines": [
                {"name": "a", "gpus": {"type": "T4", "count": 1}, "intra_bandwidth_gbps": 100},
                {"name": "b", "gpus": {"type": "T4", "count": 1}, "intra_bandwidth_gbps": 100},
            ],
            "network": {"bandwidth_gbps": 10},
        }
    )
    reports = verify_many_apart(
        "zoo:vgg19",
        cluster,
        list(STRATEGIES.values()),
        batch_size=2,
        precision="float32",
        rtol=1e-3,
        atol=1e-5,
    )
    for name, report in zip(STRATEGIES, reports, strict=True):
        assert report.passed, f"{name}: {report.summary()}"


@pytest.mark.parametrize("model", ["transformer", "bert_small"])
def test_language_models_verify_as_a_pipeline_under_both_schedules(model: str) -> None:
    """The pipeline baseline over the two machines (two stages: two GPUs feeding one),
    as GPipe with 2 micro-batches and as 1F1B with 4. BERT's masked-LM head gathers with
    ``batch_dims=1``: its gradient's segment sum runs per micro-batch, on segment ids and
    a segment count each replica computes from its own rows."""
    cluster = load_cluster(THREE_GPUS)
    ir = zoo_ir(model)
    pipelined = pipeline_baseline(ir, cluster, OpCostModel(ir, cluster))
    assert pipelined.pipeline is not None and len(pipelined.pipeline.stages) == 2
    strategies = [
        pipelined.model_copy(
            update={
                "pipeline": pipelined.pipeline.model_copy(update=dict(micro_batches=m, schedule=s))
            }
        )
        for m, s in ((2, Schedule.GPIPE), (4, Schedule.ONE_F_ONE_B))
    ]
    reports = verify_many_apart(f"zoo:{model}", cluster, strategies, batch_size=4)
    for report in reports:
        assert report.passed, report.summary()
