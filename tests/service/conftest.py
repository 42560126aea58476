"""One embedded service for the API tests: a fresh database on the PostgreSQL server here
(what production runs: its column types refuse what SQLite stores), the Celery worker
in-process (the production task code on the in-memory broker), small limits so the limit
tests send small bodies."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tagplan.db.keys import create_key
from tagplan.db.session import session_scope
from tagplan.service.app import create_app
from tagplan.settings import get_settings
from tests.backends import fresh_postgres_database

LIMITS = {
    "TAGPLAN_MAX_REQUEST_BYTES": str(1 << 20),
    "TAGPLAN_MAX_GRAPH_BYTES": str(2 << 20),
    "TAGPLAN_MAX_OPS": "3000",
    "TAGPLAN_MAX_GPUS": "64",
}


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    names = (*LIMITS, "TAGPLAN_DATA_DIR", "TAGPLAN_BROKER_URL", "TAGPLAN_DATABASE_URL")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.pop("TAGPLAN_BROKER_URL", None)
    os.environ.update(LIMITS, TAGPLAN_DATA_DIR=str(tmp_path_factory.mktemp("tagplan-data")))
    try:
        with fresh_postgres_database() as url:
            os.environ["TAGPLAN_DATABASE_URL"] = url
            get_settings.cache_clear()
            with TestClient(create_app()) as client:
                yield client
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        get_settings.cache_clear()


def make_key(
    *scopes: str, rate_limit: int | None = None, tenant: str | None = None
) -> dict[str, str]:
    """Authorization headers of a new key with ``scopes`` (a tenant of its own unless
    ``tenant`` names one)."""
    with session_scope(get_settings().sqlalchemy_url) as session:
        _, token = create_key(session, scopes=scopes, rate_limit=rate_limit, tenant=tenant)
    return {"Authorization": f"Bearer {token}"}


TENANT = "tests"
"""The tenant of :func:`admin` and of the keys that read what it submits."""


@pytest.fixture(scope="session")
def admin(service: TestClient) -> dict[str, str]:
    return make_key("admin", tenant=TENANT)


def wait_for(client: TestClient, headers: dict[str, str], job_id: str, timeout_s: float = 240):
    """Poll a job until it finishes; the last job document."""
    deadline = time.monotonic() + timeout_s
    while True:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}", headers=headers).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, f"job still {job['status']} in {job['phase']}"
        time.sleep(0.3)


def assert_problem(response: Any, status: int, *needles: str) -> dict[str, Any]:
    """``response`` is an RFC 9457 problem with ``status`` whose detail has ``needles``."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body = response.json()
    assert body["status"] == status and body["title"] and body["type"]
    for needle in needles:
        assert needle in body["detail"], body["detail"]
    return body
