"""A database that cannot be reached is a 503 the client retries, not a 500, and a
connection broken by a database restart is not handed out again."""

from __future__ import annotations

import socket

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from tagplan.db.session import engine_for
from tagplan.service.app import create_app
from tagplan.service.problems import DATABASE_RETRY_AFTER_S
from tagplan.settings import Settings
from tests.backends import POSTGRES_ADMIN_URL, fresh_postgres_database
from tests.service.conftest import assert_problem


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_requests_get_503_while_the_database_is_unreachable() -> None:
    port = _closed_port()  # nothing listens there once the socket is closed
    settings = Settings(
        database_url=f"postgresql+psycopg://postgres@127.0.0.1:{port}/tagplan",
        broker_url=f"redis://127.0.0.1:{port}/0",
    )
    client = TestClient(create_app(settings))  # no lifespan: no sweeper, no migration
    headers = {"Authorization": "Bearer tpk_0123456789abcdef_secret"}  # well-formed
    for method, path in [("GET", "/v1/jobs/abc"), ("GET", "/v1/jobs"), ("DELETE", "/v1/jobs/a")]:
        response = client.request(method, path, headers=headers)
        assert_problem(response, 503, "the database is unreachable; retry later")
        assert response.headers["retry-after"] == str(DATABASE_RETRY_AFTER_S)
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert any(p.startswith("database unreachable") for p in ready.json()["problems"])
    assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize("error", [OperationalError, InterfaceError])
def test_both_connection_errors_of_sqlalchemy_are_503(error: type[DBAPIError]) -> None:
    """psycopg reports a closed connection as either, depending on where it broke."""
    app = create_app(Settings(broker_url="redis://127.0.0.1:1/0"))

    @app.get("/broken")
    def broken() -> None:
        raise error("SELECT 1", {}, Exception("the connection is closed"))

    response = TestClient(app).get("/broken")
    assert_problem(response, 503, "the database is unreachable")
    assert response.headers["retry-after"] == str(DATABASE_RETRY_AFTER_S)


def test_a_connection_killed_by_the_server_is_not_reused() -> None:
    """What a PostgreSQL restart does to the pooled connections: the next checkout must
    get a live one (pre-ping), not fail the first request after the restart."""
    with fresh_postgres_database() as url:
        engine = engine_for(url)
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))  # now idle in the pool
        admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            killed = connection.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": url.rsplit("/", 1)[1]},
            ).scalar_one()
        admin.dispose()
        assert killed >= 1
        with engine.connect() as connection:
            assert connection.execute(text("SELECT 1")).scalar_one() == 1
