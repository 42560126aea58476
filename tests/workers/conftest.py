"""A production-shaped stack from real processes: the API (``tagplan serve``) and Celery
workers (``tagplan worker``) on the Redis and PostgreSQL of this machine."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tagplan.db.keys import create_key
from tagplan.db.migrate import upgrade
from tagplan.db.session import session_scope
from tagplan.service.client import TagplanClient
from tests.backends import (
    environment_without_settings,
    free_port,
    fresh_postgres_database,
    reset_redis,
)

VISIBILITY_TIMEOUT_S = 6
"""Short, so a task of a killed worker comes back within seconds."""


@dataclass
class Stack:
    env: dict[str, str]
    logs: Path
    database_url: str
    url: str
    token: str
    client: TagplanClient
    workers: list[subprocess.Popen] = field(default_factory=list)
    processes: list[subprocess.Popen] = field(default_factory=list)

    def spawn(self, name: str, *args: str, **env: str) -> subprocess.Popen:
        """Start ``python -m tagplan ARGS`` in its own process group, logging to a file;
        ``env`` adds to the stack's environment."""
        log = (self.logs / f"{name}.log").open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "tagplan", *args],
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes.append(process)
        return process

    def start_worker(self, name: str, pool: str = "solo", **env: str) -> subprocess.Popen:
        args = ("worker", "--pool", pool, "--hostname", f"{name}@test")
        worker = self.spawn(name, *args, **env)
        self.workers.append(worker)
        return worker

    def kill(self, process: subprocess.Popen) -> None:
        """SIGKILL the process and its children, as when a machine or container dies."""
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(5)


@contextmanager
def running_stack(
    logs: Path, broker: str, workers: int = 1, *, database_url: str | None = None, **env: str
) -> Iterator[Stack]:
    """The API and ``workers`` workers on ``broker`` and a fresh PostgreSQL database (or
    the empty database at ``database_url``, as on a PostgreSQL server the test runs itself);
    ``env`` adds settings (``TAGPLAN_...``) to every process's environment."""
    database = nullcontext(database_url) if database_url else fresh_postgres_database()
    with database as database_url:
        upgrade(database_url)
        with session_scope(database_url) as session:
            _, token = create_key(session, scopes=["admin"], name="tests")
        port = free_port()
        environment = {
            **environment_without_settings(),
            "TAGPLAN_DATABASE_URL": database_url,
            "TAGPLAN_BROKER_URL": broker,
            "TAGPLAN_VISIBILITY_TIMEOUT_S": str(VISIBILITY_TIMEOUT_S),
            "TAGPLAN_RESTORE_INTERVAL_S": "1",
            "TAGPLAN_DATA_DIR": str(logs),
            **env,
        }
        url = f"http://127.0.0.1:{port}"
        stack = Stack(environment, logs, database_url, url, token, TagplanClient(url, token))
        try:
            stack.spawn("api", "serve", "--port", str(port))
            for k in range(workers):
                stack.start_worker(f"worker{k + 1}")
            wait_ready(url, logs)
            yield stack
        finally:
            stack.client.close()
            stack.stop_all()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("stack-logs"), reset_redis()) as running:
        yield running


def wait_ready(url: str, logs: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError("API not ready: " + (logs / "api.log").read_text()[-3000:])


class OwnRedis:
    """A ``redis-server`` without persistence on a port of its own."""

    def __init__(self, logs: Path) -> None:
        self.port = free_port()
        self.logs = logs
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly"]
        self.process = subprocess.Popen(
            ["redis-server", *args, "no"],
            stdout=(self.logs / "redis.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[OwnRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.kill()
