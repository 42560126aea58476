"""With the broker down the API still answers: /readyz says why it is not ready, and a
submission is refused with 503 (the job is marked failed, not left queued forever)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tagplan.db.keys import create_key
from tagplan.db.migrate import upgrade
from tagplan.db.models import Job
from tagplan.db.session import session_scope
from tests.backends import environment_without_settings, free_port


def test_broker_down(tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'tagplan.db'}"
    upgrade(database_url)
    with session_scope(database_url) as session:
        _, token = create_key(session, scopes=["admin"])
    port = free_port()
    env = {
        **environment_without_settings(),
        "TAGPLAN_DATABASE_URL": database_url,
        "TAGPLAN_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0",  # nothing listens
    }
    api = subprocess.Popen(
        [sys.executable, "-m", "tagplan", "serve", "--port", str(port)],
        env=env,
        stdout=(tmp_path / "api.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "api.log").read_text()
            time.sleep(0.3)
        ready = httpx.get(f"{url}/readyz", timeout=30)
        assert ready.status_code == 503
        assert "broker unreachable" in ready.json()["problems"][0]
        body = {"graph": {"zoo": "mlp"}, "cluster": "testbed", "options": {"budget_s": 1}}
        headers = {"Authorization": f"Bearer {token}"}
        refused = httpx.post(f"{url}/v1/jobs", json=body, headers=headers, timeout=60)
        assert refused.status_code == 503, refused.text
        assert "queue is unavailable" in refused.json()["detail"]
        with session_scope(database_url) as session:
            (job,) = session.query(Job).all()
            assert job.status == "failed" and "could not enqueue" in job.error
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    finally:
        os.killpg(api.pid, signal.SIGTERM)
        api.wait(15)
