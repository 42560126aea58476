"""Identical rows inserted by concurrent requests: one insert wins and the other request
gets the winner's row, on SQLite and on the PostgreSQL server here."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tagplan.db.job_state import add_job
from tagplan.db.migrate import upgrade
from tagplan.db.models import Blob, ClusterRow, GraphRow, Job, JobStatus
from tagplan.db.session import add_once, engine_for
from tests.backends import fresh_postgres_database


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        found = f"sqlite:///{tmp_path / 'race.db'}"
        upgrade(found)
        yield found
        engine_for.cache_clear()
        return
    with fresh_postgres_database() as found:
        upgrade(found)
        yield found


def _job(key: str) -> Job:
    return Job(
        id=str(uuid.uuid4()),
        key=key,
        tenant="acme",
        graph_id="g" * 64,
        cluster_id="c" * 64,
        options={},
        status=JobStatus.QUEUED,
    )


def _race(url: str, first_row, second_row, insert) -> tuple[object, bool, object]:
    """``insert`` the first row in one session and hold its transaction open while another
    session inserts the second (it waits on the database's lock); then commit the first.
    Returns the first's result row, and the second's result and whether it existed.
    PostgreSQL holds the first insert until the commit, so the second misses it on its look,
    waits on the unique index and loses there; pysqlite commits the first insert when its
    savepoint is released, so on SQLite the second finds it on its first look."""
    engine = engine_for(url)
    holder, rival = Session(engine, expire_on_commit=False), Session(engine, expire_on_commit=False)
    won, existed = insert(holder, first_row)
    assert existed is False
    outcome: dict = {}

    def second() -> None:
        try:
            outcome["row"], outcome["existed"] = insert(rival, second_row)
            rival.commit()
        except Exception as exc:  # reported to the test below
            outcome["error"] = exc

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(1.0)  # the second insert is now waiting for the first transaction
    holder.commit()
    thread.join(timeout=60)
    holder.close()
    rival.close()
    assert "error" not in outcome, outcome.get("error")
    return won, outcome["existed"], outcome["row"]


def _prerequisites(url: str) -> None:
    with Session(engine_for(url)) as session:
        session.add(Blob(digest="b" * 64, size_bytes=1, data=b"x"))
        session.add(ClusterRow(id="c" * 64, fingerprint="f", spec={}, num_gpus=1))
        session.add(
            GraphRow(id="g" * 64, fingerprint="f", blob_digest="b" * 64, num_nodes=1, size_bytes=1)
        )
        session.commit()


def test_identical_jobs_submitted_together_make_one_job(url: str) -> None:
    _prerequisites(url)
    won, existed, got = _race(url, _job("k" * 64), _job("k" * 64), add_job)
    assert existed is True and got.id == won.id
    with Session(engine_for(url)) as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 1


def test_a_failed_job_does_not_hold_its_key(url: str) -> None:
    _prerequisites(url)
    with Session(engine_for(url)) as session:
        failed = _job("k" * 64)
        failed.status = JobStatus.FAILED
        session.add(failed)
        session.commit()
        retry, existed = add_job(session, _job("k" * 64))
        session.commit()
        assert existed is False and retry.id != failed.id


def test_identical_content_stored_together_is_stored_once(url: str) -> None:
    def insert(session: Session, row: ClusterRow) -> tuple[ClusterRow, bool]:
        stored = add_once(session, row)
        return stored, stored is not row

    first = ClusterRow(id="c" * 64, fingerprint="first", spec={}, num_gpus=1)
    second = ClusterRow(id="c" * 64, fingerprint="second", spec={}, num_gpus=1)
    _, existed, got = _race(url, first, second, insert)
    assert existed is True and got.fingerprint == "first"
