"""Drill: the broker restarts empty while jobs run. A Redis of the test's own, without
persistence, is killed and started again while eight jobs are queued or running on two
workers; the queue, the unacknowledged messages and the shards' chord counters are gone.
The sweeper finds the jobs nothing reports for and re-sends them, the reruns skip the
steps that finished, and all eight succeed, each finished once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from tagplan.db.models import JobStep
from tagplan.db.session import session_scope
from tests.workers.conftest import OwnRedis, Stack, running_stack, wait_ready

JOBS = 8
BUDGET_S = 5


def _finish_attempts(stack: Stack, job_id: str) -> int:
    with session_scope(stack.database_url) as session:
        row = session.scalar(
            select(JobStep).where(JobStep.job_id == job_id, JobStep.step == "finish")
        )
        return row.attempts if row else 0


@pytest.mark.slow
def test_jobs_survive_a_broker_that_restarts_empty(tmp_path: Path, redis_server: OwnRedis) -> None:
    settings = {
        "TAGPLAN_SWEEP_INTERVAL_S": "1",
        "TAGPLAN_STALL_GRACE_S": "3",
        "TAGPLAN_TIME_LIMIT_MARGIN_S": "10",
    }
    with running_stack(tmp_path, redis_server.url, workers=2, **settings) as stack:
        models = ["mlp", "small_cnn"]
        submitted = [
            stack.client.submit(
                f"zoo:{models[k % 2]}",
                cluster=f"random:{k + 1}",
                options={"budget_s": BUDGET_S, "seed": k},
            )["id"]
            for k in range(JOBS)
        ]
        deadline = time.monotonic() + 120
        while sum(stack.client.job(j)["status"] == "running" for j in submitted) < 2:
            assert time.monotonic() < deadline, [stack.client.job(j) for j in submitted]
            time.sleep(0.2)

        redis_server.kill()
        time.sleep(1)
        redis_server.start()

        jobs = [stack.client.wait(j, timeout_s=240, wait_s=5) for j in submitted]
        assert [job["status"] for job in jobs] == ["succeeded"] * JOBS, jobs
        assert [_finish_attempts(stack, j) for j in submitted] == [1] * JOBS
        assert max(job["dispatches"] for job in jobs) > 1  # the sweeper recovered some
        for job_id in submitted:
            assert stack.client.result(job_id)["job_id"] == job_id


@pytest.mark.slow
def test_jobs_go_on_while_the_api_is_killed(tmp_path: Path, redis_server: OwnRedis) -> None:
    """The API holds no job state: SIGKILLed with jobs in flight, the workers finish them,
    and the restarted API serves their results."""
    with running_stack(tmp_path, redis_server.url, workers=1) as stack:
        submitted = [
            stack.client.submit("zoo:mlp", cluster="testbed", options={"budget_s": 2, "seed": k})[
                "id"
            ]
            for k in range(3)
        ]
        api = stack.processes[0]
        stack.kill(api)
        port = stack.url.rsplit(":", 1)[1]
        deadline = time.monotonic() + 180
        while sum(_finish_attempts(stack, j) for j in submitted) < len(submitted):
            assert time.monotonic() < deadline
            time.sleep(0.5)
        stack.spawn("api", "serve", "--port", port)
        wait_ready(stack.url, stack.logs)
        jobs = [stack.client.wait(j, timeout_s=60, wait_s=5) for j in submitted]
        assert [job["status"] for job in jobs] == ["succeeded"] * len(submitted), jobs
        assert [job["dispatches"] for job in jobs] == [1] * len(submitted)
