"""The service commands as an operator and a scheduler run them, against the real stack."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tests.workers.conftest import Stack


def tagplan(stack: Stack, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tagplan", *args],
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_keys_create_gives_a_working_key_with_its_scope(stack: Stack) -> None:
    created = tagplan(stack, "keys", "create", "--scope", "read", "--name", "dashboard")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert token.startswith("tpk_")
    headers = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{stack.url}/v1/gpu-types", headers=headers).status_code == 200
    refused = httpx.post(f"{stack.url}/v1/jobs", json={}, headers=headers)
    assert refused.status_code == 403
    listed = tagplan(stack, "keys", "list")
    assert '"dashboard"' in listed.stdout and token not in listed.stdout
    assert tagplan(stack, "keys", "create", "--scope", "root").returncode == 2


@pytest.mark.slow
def test_submit_waits_and_prints_the_summary(stack: Stack) -> None:
    args = ["submit", "zoo:mlp", "-c", "testbed", "--server", stack.url, "--budget-s", "2"]
    done = tagplan(stack, *args, "--seed", "21", "--api-key", stack.token, "--wait")
    assert done.returncode == 0, done.stderr
    assert "succeeded" in done.stdout and "predicted step time" in done.stdout
    refused = tagplan(stack, *args, "--api-key", "tpk_bad_key")
    assert refused.returncode == 2 and "401" in refused.stderr
