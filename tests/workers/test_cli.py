"""The service commands as an operator and a scheduler run them, against the real stack."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from tagplan.gnn import shipped_prior_name
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


def test_keys_of_one_tenant_share_its_jobs_and_other_tenants_see_none(stack: Stack) -> None:
    def key(tenant: str) -> dict[str, str]:
        created = tagplan(stack, "keys", "create", "--scope", "submit", "--tenant", tenant)
        assert created.returncode == 0 and f"of tenant {tenant} " in created.stderr
        return {"Authorization": f"Bearer {created.stdout.strip()}"}

    first, colleague, stranger = key("pool-a"), key("pool-a"), key("pool-b")
    body = {"graph": {"zoo": "mlp"}, "cluster": "testbed", "options": {"budget_s": 1}}
    job_id = httpx.post(f"{stack.url}/v1/jobs", json=body, headers=first).json()["id"]
    assert httpx.get(f"{stack.url}/v1/jobs/{job_id}", headers=colleague).status_code == 200
    assert httpx.get(f"{stack.url}/v1/jobs/{job_id}", headers=stranger).status_code == 404
    assert httpx.delete(f"{stack.url}/v1/jobs/{job_id}", headers=stranger).status_code == 404
    assert httpx.get(f"{stack.url}/v1/jobs", headers=stranger).json()["count"] == 0
    listed = tagplan(stack, "keys", "list")
    assert '"pool-a"' in listed.stdout and '"pool-b"' in listed.stdout
    bad = tagplan(stack, "keys", "create", "--scope", "read", "--tenant", "a:b")
    assert bad.returncode == 2 and "tenant" in bad.stderr


@pytest.mark.slow
def test_submit_waits_and_prints_the_summary(stack: Stack) -> None:
    args = ["submit", "zoo:mlp", "-c", "testbed", "--server", stack.url, "--budget-s", "2"]
    done = tagplan(stack, *args, "--seed", "21", "--api-key", stack.token, "--wait")
    assert done.returncode == 0, done.stderr
    assert "succeeded" in done.stdout and "predicted step time" in done.stdout
    assert f"search prior         {shipped_prior_name()}" in done.stdout
    refused = tagplan(stack, *args, "--api-key", "tpk_bad_key")
    assert refused.returncode == 2 and "401" in refused.stderr and "--api-key" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_a_repeat_submission_is_answered_from_the_cache_unless_fresh(stack: Stack) -> None:
    args = ["submit", "zoo:small_cnn", "-c", "cloud", "--server", stack.url, "--wait"]
    key = ["--api-key", stack.token]
    first = tagplan(stack, *args, *key, "--budget-s", "3")
    assert first.returncode == 0, first.stderr
    repeat = tagplan(stack, *args, *key, "--budget-s", "4")
    assert repeat.returncode == 0, repeat.stderr
    assert "chosen from          cache (the plan of job" in repeat.stdout
    fresh = tagplan(stack, *args, *key, "--budget-s", "4", "--fresh")
    assert fresh.returncode == 0, fresh.stderr
    assert "chosen from          cache" not in fresh.stdout
