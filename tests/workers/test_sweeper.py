"""The sweeper on SQLite and PostgreSQL with a Redis broker of its own: a job quiet for
longer than its window while nothing waits in the queue is re-sent once; one that reported
recently, or whose message may still wait in the queue, is left alone; one lost too often
fails with the reason; so do the GraphDef steps owed after an answer; one process at a time
holds the lease."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from celery import Celery

from tagplan.db import job_state
from tagplan.db.blobs import put_blob
from tagplan.db.leases import take_lease
from tagplan.db.migrate import upgrade
from tagplan.db.models import ClusterRow, GraphRow, Job, JobStatus, JobStep, Result, utcnow
from tagplan.db.session import session_scope
from tagplan.settings import Settings
from tagplan.workers.app import QUEUE, celery_config
from tagplan.workers.sweeper import (
    graphdef_window_s,
    quiet_window_s,
    sweep_once,
    waiting_messages,
)
from tests.backends import fresh_postgres_database, reset_redis

BUDGET_S = 10.0


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Settings]:
    broker = reset_redis()
    common = {
        "data_dir": tmp_path,
        "broker_url": broker,
        "time_limit_margin_s": 20.0,
        "stall_grace_s": 30.0,
        "max_dispatches": 3,
    }
    if request.param == "sqlite":
        found = Settings(database_url=None, **common)
        upgrade(found.sqlalchemy_url)
        yield found
        return
    with fresh_postgres_database() as url:
        upgrade(url)
        yield Settings(database_url=url, **common)


@pytest.fixture
def broker(settings: Settings) -> Iterator[Celery]:
    app = Celery("sweeper-test")
    app.conf.update(celery_config(settings))
    yield app
    with app.connection_for_write() as connection:
        connection.default_channel.queue_purge(QUEUE)


def _job(settings: Settings, *, quiet_s: float, status: str, dispatches: int = 1) -> str:
    """A job whose last report was ``quiet_s`` ago."""
    job_id = str(uuid.uuid4())
    with session_scope(settings.sqlalchemy_url) as session:
        if session.get(GraphRow, "g" * 64) is None:
            digest = put_blob(session, b"graph")
            session.add(ClusterRow(id="c" * 64, fingerprint="f", spec={}, num_gpus=1))
            session.add(
                GraphRow(
                    id="g" * 64, fingerprint="f", blob_digest=digest, num_nodes=1, size_bytes=5
                )
            )
            session.flush()
        session.add(
            Job(
                id=job_id,
                key=uuid.uuid4().hex,
                tenant="acme",
                graph_id="g" * 64,
                cluster_id="c" * 64,
                options={"budget_s": BUDGET_S},
                status=status,
                dispatches=dispatches,
                updated_at=utcnow() - timedelta(seconds=quiet_s),
            )
        )
    return job_id


def _row(settings: Settings, job_id: str) -> Job:
    with session_scope(settings.sqlalchemy_url) as session:
        job = session.get(Job, job_id)
        session.expunge(job)
        return job


def test_the_quiet_window_is_the_soft_time_limit_plus_the_grace(settings: Settings) -> None:
    assert quiet_window_s(settings, {"budget_s": BUDGET_S}) == BUDGET_S + 20.0 + 30.0


def test_a_lost_job_is_sent_again_once(settings: Settings, broker: Celery) -> None:
    window_s = quiet_window_s(settings, {"budget_s": BUDGET_S})
    lost = _job(settings, quiet_s=window_s + 5, status=JobStatus.RUNNING)
    never_started = _job(settings, quiet_s=window_s + 5, status=JobStatus.QUEUED)
    reporting = _job(settings, quiet_s=window_s - 5, status=JobStatus.RUNNING)
    done = _job(settings, quiet_s=window_s + 5, status=JobStatus.SUCCEEDED)

    report = sweep_once(settings, broker, holder="a")
    assert sorted(report.redispatched) == sorted([lost, never_started]) and report.failed == []
    assert waiting_messages(broker) == 2
    assert [_row(settings, j).dispatches for j in (lost, never_started, reporting, done)] == [
        2,
        2,
        1,
        1,
    ]
    assert _row(settings, lost).status == JobStatus.RUNNING

    again = sweep_once(settings, broker, holder="a")  # quiet again only after a window
    assert again.redispatched == [] and again.failed == []
    assert waiting_messages(broker) == 2


def test_nothing_is_sent_while_messages_wait_in_the_queue(
    settings: Settings, broker: Celery
) -> None:
    lost = _job(settings, quiet_s=1000, status=JobStatus.RUNNING)
    broker.send_task("tagplan.analyze", args=("another job",), ignore_result=True)
    report = sweep_once(settings, broker, holder="a")
    assert report.redispatched == [] and report.skipped == "1 messages wait in the queue"
    assert _row(settings, lost).dispatches == 1


def test_a_job_lost_too_often_fails_with_the_reason(settings: Settings, broker: Celery) -> None:
    lost = _job(settings, quiet_s=1000, status=JobStatus.RUNNING, dispatches=3)
    report = sweep_once(settings, broker, holder="a")
    assert report.failed == [lost] and report.redispatched == []
    job = _row(settings, lost)
    assert job.status == JobStatus.FAILED
    assert job.error.startswith("lost 3 times: no step reported for 60 s")
    assert waiting_messages(broker) == 0


def _answered(settings: Settings, *, owed_quiet_s: float, dispatches: int = 1) -> str:
    """A job answered without its GraphDef, whose GraphDef step was last sent or begun
    ``owed_quiet_s`` ago."""
    job_id = _job(settings, quiet_s=owed_quiet_s, status=JobStatus.SUCCEEDED)
    with session_scope(settings.sqlalchemy_url) as session:
        summary = {"step_time_s": 0.1, "strategy": {}, "graphdef_deferred": True}
        session.add(
            Result(
                job_id=job_id,
                graph_fingerprint="f",
                cluster_fingerprint="f",
                batch_size=1,
                step_time_s=0.1,
                summary=summary,
            )
        )
        job_state.follow_answer(session, job_id=job_id)
        session.flush()
        step = session.get(JobStep, (job_id, job_state.FOLLOWING_STEP))
        step.output = {"dispatches": dispatches}
        step.updated_at = utcnow() - timedelta(seconds=owed_quiet_s)
    return job_id


def _owed(settings: Settings) -> dict[str, int]:
    with session_scope(settings.sqlalchemy_url) as session:
        return {s.job_id: s.output["dispatches"] for s in job_state.following_steps(session)}


def test_a_lost_graphdef_step_is_sent_again_then_given_up(
    settings: Settings, broker: Celery
) -> None:
    window_s = graphdef_window_s(settings)
    assert window_s == settings.graphdef_time_limit_s + 30.0
    lost = _answered(settings, owed_quiet_s=window_s + 5)
    running = _answered(settings, owed_quiet_s=window_s - 5)
    given_up = _answered(settings, owed_quiet_s=window_s + 5, dispatches=3)

    report = sweep_once(settings, broker, holder="a")
    assert report.graphdefs_resent == [lost] and report.graphdefs_failed == [given_up]
    assert report.redispatched == [] and report.failed == []  # the jobs stay answered
    assert waiting_messages(broker) == 1
    assert _owed(settings) == {lost: 2, running: 1}
    with session_scope(settings.sqlalchemy_url) as session:
        summary = session.get(Result, given_up).summary
        assert session.get(Job, given_up).status == JobStatus.SUCCEEDED
    assert summary["graphdef_error"].startswith("the GraphDef step was lost 3 times")

    again = sweep_once(settings, broker, holder="a")  # quiet again only after a window
    assert again.graphdefs_resent == [] and _owed(settings) == {lost: 2, running: 1}


def test_one_process_at_a_time_sweeps(settings: Settings, broker: Celery) -> None:
    url = settings.sqlalchemy_url
    with session_scope(url) as session:
        assert take_lease(session, name="test", holder="a", ttl_s=60)
        assert take_lease(session, name="test", holder="a", ttl_s=60)  # renewed
        assert not take_lease(session, name="test", holder="b", ttl_s=60)
        assert take_lease(session, name="expired", holder="a", ttl_s=-1)
        assert take_lease(session, name="expired", holder="b", ttl_s=60)  # taken over
        assert not take_lease(session, name="expired", holder="a", ttl_s=60)
    lost = _job(settings, quiet_s=1000, status=JobStatus.RUNNING)
    assert sweep_once(settings, broker, holder="a").redispatched == [lost]
    refused = sweep_once(settings, broker, holder="b")
    assert refused.skipped == "another process holds the sweeper's lease"
