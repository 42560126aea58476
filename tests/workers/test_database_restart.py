"""Drill: PostgreSQL restarts while jobs run. A PostgreSQL cluster of the test's own is
stopped (``pg_ctl stop -m fast``: every session is cut) while six jobs are queued or running
on two workers, and started again some seconds later. While it is down the API answers
503 with ``Retry-After``, never 500; the steps that cannot reach it are retried by Celery.
Once it is back the API answers 200 at once, and every job succeeds."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from tagplan.db.session import engine_for
from tests.backends import free_port
from tests.workers.conftest import OwnRedis, running_stack

JOBS = 6
BUDGET_S = 4
DOWN_S = 8
"""How long PostgreSQL stays down: within the workers' retries (ten, 5 s apart)."""


class OwnPostgres:
    """A throwaway PostgreSQL cluster on a port of its own: trust auth, no fsync, its unix
    socket in its directory. As root the server programs run as the ``postgres`` user
    (PostgreSQL refuses to run as root), so the directory is a fresh one under the system
    temporary directory that the user owns (pytest's are private to root)."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="tagplan-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self.port = free_port()
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_postgres:
            shutil.chown(self.root, "postgres", "postgres")

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, program: str, *args: str, check: bool = True) -> None:
        command = [*self.as_postgres, shutil.which(program) or program, *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if check:
            assert done.returncode == 0, f"{program} {' '.join(args)}: {done.stdout}{done.stderr}"

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root}"
            " -c fsync=off -c full_page_writes=off -c synchronous_commit=off"
        )
        self._run("pg_ctl", "start", "-w", "-D", str(self.data), "-l", str(self.log), "-o", options)

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "stop", "-w", "-m", mode, "-D", str(self.data))

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def create_database(self, name: str) -> str:
        admin = create_engine(self.url("postgres"), isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        admin.dispose()
        return self.url(name)

    def remove(self, logs: Path) -> None:
        """Stop the server if it runs and delete the cluster, keeping its log in ``logs``."""
        if self.running():
            self._run("pg_ctl", "stop", "-w", "-m", "immediate", "-D", str(self.data), check=False)
        if self.log.exists():
            shutil.copy(self.log, logs / "postgres.log")
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def postgres_server(tmp_path: Path) -> Iterator[OwnPostgres]:
    if shutil.which("initdb") is None or shutil.which("pg_ctl") is None:
        pytest.skip("initdb and pg_ctl are not installed")
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root without a postgres user to run PostgreSQL as")
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser")
    server = OwnPostgres()
    try:
        server.init()
        server.start()
        yield server
    finally:
        engine_for.cache_clear()  # no engine of this process keeps the dead URL
        server.remove(tmp_path)


@pytest.mark.slow
def test_jobs_survive_a_database_restart(
    tmp_path: Path, postgres_server: OwnPostgres, redis_server: OwnRedis
) -> None:
    settings = {
        "TAGPLAN_SWEEP_INTERVAL_S": "1",
        "TAGPLAN_STALL_GRACE_S": "3",
        "TAGPLAN_TIME_LIMIT_MARGIN_S": "10",
    }
    database_url = postgres_server.create_database("tagplan")
    began = time.monotonic()
    with running_stack(
        tmp_path, redis_server.url, workers=2, database_url=database_url, **settings
    ) as stack:
        models = ["mlp", "small_cnn"]
        clusters = ["testbed", *(f"random:{k}" for k in range(1, JOBS))]
        submitted = [
            stack.client.submit(
                f"zoo:{models[k % 2]}",
                cluster=clusters[k],
                options={"budget_s": BUDGET_S, "seed": k},
            )["id"]
            for k in range(JOBS)
        ]
        deadline = time.monotonic() + 60
        while sum(stack.client.job(j)["status"] == "running" for j in submitted) < 2:
            assert time.monotonic() < deadline, [stack.client.job(j) for j in submitted]
            time.sleep(0.2)

        probe = httpx.Client(
            base_url=stack.url, headers={"Authorization": f"Bearer {stack.token}"}, timeout=30
        )
        stopped = time.monotonic()
        postgres_server.stop("fast")
        answers: list[httpx.Response] = []
        while time.monotonic() - stopped < DOWN_S:
            answers.append(probe.get(f"/v1/jobs/{submitted[0]}"))
            time.sleep(0.5)
        statuses = {answer.status_code for answer in answers}
        assert statuses == {503}, [(a.status_code, a.text) for a in answers]
        assert answers[-1].headers["retry-after"].isdigit()
        assert "database is unreachable" in answers[-1].json()["detail"]
        assert probe.get("/readyz").status_code == 503

        postgres_server.start()
        # The first request after the start already succeeds: no connection the restart
        # broke is handed out (the pool's pre-ping itself is shown in
        # tests/service/test_database_down.py; here the failed requests have already
        # discarded the broken connections).
        first = probe.get(f"/v1/jobs/{submitted[0]}")
        unavailable_s = time.monotonic() - stopped
        assert first.status_code == 200, first.text
        assert probe.get("/readyz").status_code == 200

        jobs = [stack.client.wait(j, timeout_s=120, wait_s=5) for j in submitted]
        probe.close()
        for job in jobs:
            assert job["status"] in ("succeeded", "failed"), job
            assert job["status"] == "succeeded" or job["error"], job
        assert [job["status"] for job in jobs] == ["succeeded"] * JOBS, jobs
        for job_id in submitted:
            assert stack.client.result(job_id)["job_id"] == job_id
    print(
        f"database restart drill: {JOBS} jobs, "
        f"{sum(job['status'] == 'succeeded' for job in jobs)} succeeded, "
        f"max dispatches {max(job['dispatches'] for job in jobs)}, {len(answers)} answers 503, "
        f"API unavailable {unavailable_s:.1f} s, drill {time.monotonic() - began:.0f} s"
    )
