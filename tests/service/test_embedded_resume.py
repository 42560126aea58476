"""The embedded service keeps jobs across restarts: its in-memory queue dies with the
process, but the database says which jobs are unfinished, and which GraphDefs are owed
after an answer, and a new start resumes them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tagplan.db import job_state
from tagplan.db.keys import create_key
from tagplan.db.migrate import upgrade
from tagplan.db.models import Job, JobStatus, Result
from tagplan.db.session import session_scope
from tagplan.service.client import TagplanClient
from tagplan.service.intake import cluster_from_input, store_cluster, store_graph, zoo_graph
from tagplan.service.schemas import PlanOptionsIn
from tagplan.settings import Settings
from tests.backends import environment_without_settings, free_port

TENANT = "acme"
"""The tenant of the job and of the key that polls it."""


@pytest.mark.slow
def test_a_queued_job_and_an_owed_graphdef_left_by_a_stopped_service_complete_on_restart(
    tmp_path: Path,
) -> None:
    # the embedded defaults the child service reads, whatever this process's environment says
    settings = Settings(data_dir=tmp_path, database_url=None, broker_url=None)
    url = settings.sqlalchemy_url
    upgrade(url)
    data, inputs, loss = zoo_graph("mlp")
    with session_scope(url) as session:  # what a service stopped right after a submit leaves
        graph, _ = store_graph(session, settings, data, tenant=TENANT, label="zoo:mlp")
        cluster = store_cluster(session, cluster_from_input(settings, "testbed"), tenant=TENANT)
        job_id = str(uuid.uuid4())
        session.add(
            Job(
                id=job_id,
                key=uuid.uuid4().hex,
                graph_id=graph.id,
                cluster_id=cluster.id,
                batch_inputs=inputs,
                loss=loss,
                options=PlanOptionsIn(budget_s=1).model_dump(),
                status=JobStatus.QUEUED,
                tenant=TENANT,
            )
        )
        _, token = create_key(session, scopes=["read"], tenant=TENANT)
    with _serving(tmp_path, token) as client:
        job = client.wait(job_id, timeout_s=120, wait_s=5)
        assert job["status"] == "succeeded", (tmp_path / "serve.log").read_text()[-2000:]
        assert client.result(job_id)["step_time_s"] > 0
        compiled = client.graphdef(job_id, timeout_s=60)
    with session_scope(url) as session:  # a service stopped before its GraphDef step ran
        result = session.get(Result, job_id)
        result.graphdef_digest, result.device_map = None, None
        result.summary = {**result.summary, "graphdef_deferred": True}
        job_state.follow_answer(session, job_id=job_id)
    with _serving(tmp_path, token) as client:
        assert client.graphdef(job_id, timeout_s=120) == compiled  # waits out the 409s
    with session_scope(url) as session:
        assert not job_state.following_steps(session)


@contextmanager
def _serving(tmp_path: Path, token: str) -> Iterator[TagplanClient]:
    """``tagplan serve`` on the embedded defaults under ``tmp_path``, once it listens, with
    a client for it calling with ``token``; stopped on exit."""
    port = free_port()
    env = environment_without_settings()
    env["TAGPLAN_DATA_DIR"] = str(tmp_path)
    server = subprocess.Popen(
        [sys.executable, "-m", "tagplan", "serve", "--port", str(port)],
        env=env,
        stdout=(tmp_path / "serve.log").open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        with TagplanClient(f"http://127.0.0.1:{port}", token) as client:
            deadline = time.monotonic() + 60
            while True:  # until the server listens
                try:
                    client.http.get("/healthz")
                    break
                except httpx.TransportError:
                    assert server.poll() is None and time.monotonic() < deadline
                    time.sleep(0.3)
            yield client
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(30)
