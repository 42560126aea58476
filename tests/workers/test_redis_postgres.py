"""End to end on Redis and PostgreSQL with real worker processes: VGG19 on the testbed,
root-parallel shards as a chord, and a worker killed mid-search."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from tagplan.db.models import JobStep, Result
from tagplan.db.session import session_scope
from tagplan.planner.graph.protos import GraphDef
from tests.workers.conftest import Stack


def steps(stack: Stack, job_id: str) -> dict[str, JobStep]:
    with session_scope(stack.database_url) as session:
        rows = session.scalars(select(JobStep).where(JobStep.job_id == job_id)).all()
        return {row.step: row for row in rows}


@pytest.mark.slow
def test_vgg19_on_testbed(stack: Stack) -> None:
    job = stack.client.submit("zoo:vgg19", cluster="testbed", options={"budget_s": 4})
    assert job["status"] == "queued"
    job = stack.client.wait(job["id"], timeout_s=300, wait_s=5)
    assert job["status"] == "succeeded", job
    result = stack.client.result(job["id"])
    assert result["speedup_vs_dp_nccl"] >= 1.0
    graph = GraphDef.FromString(stack.client.graphdef(job["id"]))
    assert len({n.device for n in graph.node if n.device}) > 1


@pytest.mark.slow
def test_root_parallel_shards_run_as_a_chord(stack: Stack) -> None:
    options = {"budget_s": 2, "shards": 3, "seed": 5}
    job = stack.client.submit("zoo:mlp", cluster="testbed", options=options)
    job = stack.client.wait(job["id"], timeout_s=300, wait_s=5)
    assert job["status"] == "succeeded", job
    done = steps(stack, job["id"])
    assert {"analyze", "shard:000", "shard:001", "shard:002", "finish"} <= set(done)
    seeds = sorted(done[f"shard:00{k}"].output["seed"] for k in range(3))
    assert seeds == [5, 6, 7]
    assert stack.client.result(job["id"])["iterations"] == sum(
        done[f"shard:00{k}"].output["iterations"] for k in range(3)
    )


@pytest.mark.tf
@pytest.mark.slow
def test_served_mlp_plan_verifies(stack: Stack) -> None:
    from tagplan.planner.verify.check import verify

    job = stack.client.submit("zoo:mlp", cluster="testbed", options={"budget_s": 2, "seed": 11})
    job = stack.client.wait(job["id"], timeout_s=300, wait_s=5)
    assert job["status"] == "succeeded", job
    report = verify("zoo:mlp", "testbed", stack.client.result(job["id"])["strategy"])
    assert report.passed, report.summary()


@pytest.mark.slow
def test_job_survives_a_killed_worker(stack: Stack) -> None:
    job = stack.client.submit("zoo:small_cnn", cluster="cloud", options={"budget_s": 10})
    deadline = time.monotonic() + 120
    while True:
        seen = stack.client.job(job["id"])
        if seen["phase"] == "search" and seen["progress"]["iterations"] > 0:
            break
        assert seen["status"] in ("queued", "running"), seen
        assert time.monotonic() < deadline, seen
        time.sleep(0.2)
    for worker in stack.workers:
        stack.kill(worker)
    time.sleep(2)
    stalled = stack.client.job(job["id"])
    assert stalled["status"] == "running" and stalled["phase"] == "search"
    assert "shard:000" not in {s for s, row in steps(stack, job["id"]).items() if row.output}

    stack.start_worker("worker2")
    job = stack.client.wait(job["id"], timeout_s=300, wait_s=5)
    assert job["status"] == "succeeded", job
    done = steps(stack, job["id"])
    assert done["shard:000"].attempts == 2  # redelivered once, then completed
    assert done["analyze"].attempts == 1  # finished before the kill: not repeated
    with session_scope(stack.database_url) as session:
        assert session.get(Result, job["id"]) is not None
    assert GraphDef.FromString(stack.client.graphdef(job["id"])).node
