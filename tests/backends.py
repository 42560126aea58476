"""The real PostgreSQL and Redis on this machine, each test on its own database."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import create_engine, text

POSTGRES_ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


@contextmanager
def fresh_postgres_database() -> Iterator[str]:
    """A new, empty PostgreSQL database for one test; dropped afterwards."""
    if not _reachable("127.0.0.1", 5432):
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    name = f"tagplan_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield POSTGRES_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        from tagplan.db.session import engine_for

        engine_for.cache_clear()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def reset_redis() -> str:
    """The URL of a Redis database index of its own, emptied first."""
    if not _reachable(REDIS_HOST, REDIS_PORT):
        pytest.skip("Redis is not reachable on 127.0.0.1:6379")
    import redis

    url = f"redis://{REDIS_HOST}:{REDIS_PORT}/13"
    redis.Redis.from_url(url).flushdb()
    return url


def environment_without_settings() -> dict[str, str]:
    """This process's environment without ``TAGPLAN_*`` settings: a child service or
    worker reads only the settings its test gives it."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TAGPLAN_")}


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
"""Chromium's flags for a machine with a closed network: no background connections, no
first-run work (the dashboard's browser tests and benchmark)."""
