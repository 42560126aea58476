"""The checkpoint registry: an operator activates an uploaded checkpoint and the jobs
submitted from then on search with it (their results name it), a job keeps the checkpoint
it recorded when another is activated, the strategy cache keys on the prior, a checkpoint
the workers refuse fails its jobs with the reason, and with none active jobs use the
shipped checkpoint."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from tagplan.db.session import session_scope
from tagplan.gnn import prior_name, shipped_prior_name
from tagplan.gnn.checkpoint import save_checkpoint
from tagplan.gnn.model import PriorNet
from tagplan.service.registry import active_checkpoint
from tests.service.conftest import assert_problem, make_key, wait_for

TENANT = "registry"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, str]:
    """A small trained-shape checkpoint's file and its prior's name."""
    path = Path(tmp_path_factory.mktemp("checkpoint")) / "small.pt"
    torch.manual_seed(0)
    digest = save_checkpoint(path, PriorNet(hidden=16, heads=2, layers=1), {})
    return path.read_bytes(), prior_name(digest)


def _other_schema(data: bytes) -> bytes:
    """The checkpoint as a version with another feature schema would have written it."""
    payload = torch.load(io.BytesIO(data), weights_only=True)
    payload["meta"]["schema"]["version"] += 1
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


@pytest.fixture
def operator(service: TestClient) -> Iterator[dict[str, str]]:
    """A key of the test's tenant that operates the registry and submits jobs (admin); the
    registry is cleared afterwards."""
    headers = make_key("admin", tenant=TENANT)
    yield headers
    service.delete("/v1/checkpoints/active", headers=headers)


def _upload(service: TestClient, headers: dict[str, str], data: bytes, name: str) -> str:
    created = service.post(f"/v1/checkpoints?name={name}", content=data, headers=headers)
    assert created.status_code == 201, created.text
    return created.json()["id"]


def _job(seed: int, budget_s: float = 1) -> dict:
    return {
        "graph": {"zoo": "mlp"},
        "cluster": "testbed",
        "options": {"budget_s": budget_s, "seed": seed},
    }


def _run(service: TestClient, headers: dict[str, str], body: dict) -> tuple[dict, dict]:
    """Submit, wait; the finished job and its result (None unless it succeeded)."""
    submitted = service.post("/v1/jobs", json=body, headers=headers)
    assert submitted.status_code == 202, submitted.text
    job = wait_for(service, headers, submitted.json()["id"])
    if job["status"] != "succeeded":
        return job, None
    return job, service.get(f"/v1/jobs/{job['id']}/result", headers=headers).json()


def test_with_no_checkpoint_active_jobs_use_the_shipped_one(service, operator) -> None:
    active = service.get("/v1/checkpoints/active", headers=make_key("read")).json()
    assert active == {
        "prior": "shipped",
        "checkpoint": None,
        "activated_at": None,
        "activated_by": None,
        "shipped": shipped_prior_name(),  # read by the API from the record, without torch
    }
    job, result = _run(service, operator, _job(seed=101))
    assert job["options"]["prior"] == "shipped"
    assert result["prior"] == shipped_prior_name() and result.get("prior_note") is None


def test_an_active_checkpoint_guides_new_jobs_and_a_job_keeps_its_own(
    service, operator, checkpoint
) -> None:
    data, name = checkpoint
    checkpoint_id = _upload(service, operator, data, "small")
    active = service.put(f"/v1/checkpoints/{checkpoint_id}/active", headers=operator).json()
    assert active["prior"] == f"checkpoint:{checkpoint_id}"
    assert active["checkpoint"]["id"] == checkpoint_id and active["checkpoint"]["active"]
    assert active["activated_by"] == operator["Authorization"].split("_")[1]  # the key's id
    assert active["activated_at"]
    listed = service.get("/v1/checkpoints", headers=operator).json()
    assert [c["id"] for c in listed if c["active"]] == [checkpoint_id]
    # another tenant's reader learns what new jobs use, not the checkpoint it does not hold
    seen = service.get("/v1/checkpoints/active", headers=make_key("read")).json()
    assert seen["prior"] == active["prior"] and seen["checkpoint"] is None

    submitted = service.post("/v1/jobs", json=_job(seed=102), headers=operator).json()
    cleared = service.delete("/v1/checkpoints/active", headers=operator).json()
    assert cleared["prior"] == "shipped" and cleared["checkpoint"] is None
    job = wait_for(service, operator, submitted["id"])
    assert job["status"] == "succeeded", job["error"]
    assert job["options"]["prior"] == f"checkpoint:{checkpoint_id}"
    result = service.get(f"/v1/jobs/{job['id']}/result", headers=operator).json()
    assert result["prior"] == name  # recorded at submission: the switch did not change it


def test_the_strategy_cache_keys_on_the_prior(service, operator, checkpoint) -> None:
    data, name = checkpoint
    checkpoint_id = _upload(service, operator, data, "small")
    planner = make_key("submit", tenant="registry-cache")
    _, shipped = _run(service, planner, _job(seed=103, budget_s=1))
    assert shipped["source"] == "search" and shipped["prior"] == shipped_prior_name()
    service.put(f"/v1/checkpoints/{checkpoint_id}/active", headers=operator)
    _, guided = _run(service, planner, _job(seed=103, budget_s=2))
    assert guided["source"] == "search" and guided["prior"] == name  # not the shipped plan
    _, repeat = _run(service, planner, _job(seed=103, budget_s=3))
    assert repeat["source"] == "cache" and repeat["prior"] == name
    assert repeat["cached_from"] == guided["job_id"]
    strategies = service.get(
        "/v1/strategies",
        params={"graph": repeat["graph_fingerprint"], "cluster": "testbed"},
        headers=planner,
    ).json()["data"]
    assert {s["prior"] for s in strategies} == {shipped_prior_name(), name}


def test_a_refused_checkpoint_fails_its_jobs_with_the_reason(service, operator, checkpoint) -> None:
    checkpoint_id = _upload(service, operator, _other_schema(checkpoint[0]), "next-schema")
    service.put(f"/v1/checkpoints/{checkpoint_id}/active", headers=operator)
    job, _ = _run(service, operator, _job(seed=104))
    assert job["status"] == "failed"
    assert f"checkpoint {checkpoint_id[:12]} (active when the job was submitted)" in job["error"]
    assert "feature schema" in job["error"] and "retrain" in job["error"]
    service.delete("/v1/checkpoints/active", headers=operator)
    job, result = _run(service, operator, _job(seed=104))  # resubmitted: a new job
    assert job["status"] == "succeeded" and result["prior"] == shipped_prior_name()


def test_registry_errors(service, operator) -> None:
    assert_problem(service.put(f"/v1/checkpoints/{'0' * 64}/active", headers=operator), 404)
    submitter = make_key("submit", tenant=TENANT)
    assert_problem(service.delete("/v1/checkpoints/active", headers=submitter), 403, "scope")


def test_a_change_is_committed_before_its_answer_is_sent(service, operator, checkpoint) -> None:
    """A client that acts on the answer (the dashboard reloads the registry when its
    change returns) reads what the change wrote: the registry row, read from another
    session when the response starts, is already the activated checkpoint."""
    checkpoint_id = _upload(service, operator, checkpoint[0], "committed-first")
    url = service.app.state.settings.sqlalchemy_url
    seen: list[str | None] = []

    async def watched(scope, receive, send) -> None:
        async def send_and_look(message) -> None:
            if message["type"] == "http.response.start":
                with session_scope(url) as session:
                    row = active_checkpoint(session)
                    seen.append(row.checkpoint_id if row else None)
            await send(message)

        await service.app(scope, receive, send_and_look)

    client = TestClient(watched)  # the service's app, started by its fixture
    activated = client.put(f"/v1/checkpoints/{checkpoint_id}/active", headers=operator)
    assert activated.status_code == 200, activated.text
    cleared = client.delete("/v1/checkpoints/active", headers=operator)
    assert cleared.status_code == 200, cleared.text
    assert seen == [checkpoint_id, None]
