"""``tagplan demo``, the README's run command: embedded service on loopback, a zoo model
submitted over HTTP without a key, the summary printed with the dashboard's address, the
service stopped; with ``--keep`` it serves until interrupted."""

from __future__ import annotations

import signal
import subprocess
import sys

import httpx
import pytest

from tests.backends import environment_without_settings


@pytest.mark.slow
def test_demo_plans_a_zoo_model_and_exits() -> None:
    env = environment_without_settings()
    done = subprocess.run(
        [sys.executable, "-m", "tagplan", "demo", "--model", "mlp", "--budget-s", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "succeeded" in done.stdout
    assert "predicted step time" in done.stdout and "baselines" in done.stdout
    assert "dashboard: http://127.0.0.1:" in done.stdout


@pytest.mark.slow
def test_demo_keep_serves_the_page_until_interrupted() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "tagplan", "demo", "--model", "mlp", "--budget-s", "2", "--keep"],
        env=environment_without_settings(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        address = None
        for line in process.stdout:
            if line.startswith("dashboard: "):
                address = line.split()[1]
            if "serving until Ctrl-C" in line:
                break
        assert address is not None
        page = httpx.get(address.split("#")[0], timeout=10)
        assert page.status_code == 200 and "app.js" in page.text
        job_id = address.rsplit("/", 1)[1]
        base = address.split("/ui/")[0]
        assert httpx.get(f"{base}/v1/jobs/{job_id}", timeout=10).json()["status"] == "succeeded"
        process.send_signal(signal.SIGINT)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
