"""Start and stop the service's processes for the benchmarks that measure it whole."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

__all__ = ["free_port", "fresh_database", "spawn", "stop", "wait_ready"]

DATABASE = "tagplan_bench"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fresh_database(admin_url: str) -> str:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)'))
        connection.execute(text(f'CREATE DATABASE "{DATABASE}"'))
    engine.dispose()
    return admin_url.rsplit("/", 1)[0] + f"/{DATABASE}"


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """``python -m tagplan ARGS`` in its own process group (children inherit our priority)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tagplan", *args],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    process.wait(30)


def wait_ready(url: str, logs: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, (logs / "api.log").read_text()[-2000:]
        time.sleep(0.3)
