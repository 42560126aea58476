"""Anytime jobs: at ``deadline_s`` the job answers with the best plan so far
(``complete: false``), its progress over time readable; with ``refine_s`` a refinement job
searches on from the answer and never ends slower."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import assert_problem, make_key, wait_for

# VGG19 on 64 GPUs with a deadline soon after its baselines: about six iterations of the
# search fit here, where converging takes at least 65 (a machine would need to be about
# four times faster; with a deadline of 2 s, a fast run of this one converged before it)
ANYTIME = {
    "graph": {"zoo": "vgg19"},
    "cluster": "scale:64",
    "options": {"budget_s": 120, "deadline_s": 0.5, "refine_s": 5},
}


@pytest.fixture(scope="module")
def owner(service: TestClient) -> dict[str, str]:
    return make_key("admin", tenant="anytime")


@pytest.fixture(scope="module")
def answered(service: TestClient, owner: dict) -> tuple[dict, dict]:
    response = service.post("/v1/jobs", json=ANYTIME, headers=owner)
    assert response.status_code == 202, response.text
    job = response.json()
    done = wait_for(service, owner, job["id"])
    assert done["status"] == "succeeded", done
    return done, service.get(f"/v1/jobs/{job['id']}/result", headers=owner).json()


def test_the_answer_comes_at_the_deadline_incomplete(answered) -> None:
    job, result = answered
    assert result["complete"] is False
    assert result["plan_time_s"] < ANYTIME["options"]["budget_s"] / 4
    history = job["progress"]["history"]
    assert history, "the search's progress over time"
    seconds, iterations, steps = zip(*history, strict=True)
    assert list(seconds) == sorted(seconds) and list(iterations) == sorted(iterations)
    assert list(steps) == sorted(steps, reverse=True)
    assert steps[-1] == pytest.approx(job["progress"]["best_step_time_s"])


def test_the_refinement_starts_from_the_answer_and_is_never_slower(
    service: TestClient, owner: dict, answered
) -> None:
    job, result = answered
    assert job["refined_by"]
    refined = wait_for(service, owner, job["refined_by"])
    assert refined["status"] == "succeeded" and refined["refines"] == job["id"]
    assert refined["options"]["fresh"] is True
    assert refined["options"]["budget_s"] == ANYTIME["options"]["refine_s"]
    better = service.get(f"/v1/jobs/{refined['id']}/result", headers=owner).json()
    assert better["warm_start"] == {"job_id": job["id"], "kind": "same plan"}
    assert better["step_time_s"] <= result["step_time_s"] * (1 + 1e-9)
    # a repeat now gets the fastest cached plan
    repeat = service.post(
        "/v1/jobs", json={**ANYTIME, "options": {"budget_s": 30}}, headers=owner
    ).json()
    assert wait_for(service, owner, repeat["id"])["status"] == "succeeded"
    answer = service.get(f"/v1/jobs/{repeat['id']}/result", headers=owner).json()
    assert answer["source"] == "cache"
    assert answer["step_time_s"] == pytest.approx(min(result["step_time_s"], better["step_time_s"]))


def test_refine_without_a_deadline_is_refused(service: TestClient, owner: dict) -> None:
    body = {**ANYTIME, "options": {"budget_s": 10, "refine_s": 5}}
    assert_problem(service.post("/v1/jobs", json=body, headers=owner), 422, "deadline_s")
