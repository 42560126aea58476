"""Jobs end to end in the embedded service: submit, poll, result, GraphDef, trace,
deduplication, listing, cancellation, metrics; VGG19 and a verified mlp."""

from __future__ import annotations

import base64
import json
import threading
import time
from datetime import datetime

import pytest
from fastapi.testclient import TestClient

from tagplan.db.models import Result
from tagplan.db.session import session_scope
from tagplan.planner.graph.protos import GraphDef
from tagplan.service.client import TagplanClient
from tests.service.conftest import TENANT, assert_problem, make_key, wait_for

# fresh: a search whatever other modules of the tenant planned before (the cache would
# answer a repeat of their mlp on the testbed without one)
MLP = {"graph": {"zoo": "mlp"}, "cluster": "testbed", "options": {"budget_s": 2, "fresh": True}}


@pytest.fixture(scope="module")
def mlp_job(service: TestClient, admin: dict) -> dict:
    response = service.post("/v1/jobs", json=MLP, headers=admin)
    assert response.status_code == 202, response.text
    assert response.headers["location"] == f"/v1/jobs/{response.json()['id']}"
    job = wait_for(service, admin, response.json()["id"])
    assert job["status"] == "succeeded", job
    return job


def test_job_reports_progress_and_timestamps(mlp_job: dict) -> None:
    assert mlp_job["phase"] == "bound"  # the last phase
    assert mlp_job["progress"]["iterations"] > 0
    assert mlp_job["progress"]["best_speedup"] > 0
    assert mlp_job["created_at"] <= mlp_job["started_at"] <= mlp_job["finished_at"]
    assert mlp_job["error"] is None


def test_plan_time_is_the_jobs_wall_time_with_its_phases(
    service: TestClient, mlp_job: dict
) -> None:
    """Timed across every step of the job, not only the last: within 10% (or a second of
    bookkeeping) of its start to its end, with the phases of every step."""
    result = service.get(mlp_job["links"]["result"], headers=make_key("read", tenant=TENANT))
    result = result.json()
    started, finished, created = (
        datetime.fromisoformat(mlp_job[k]) for k in ("started_at", "finished_at", "created_at")
    )
    wall_s = (finished - started).total_seconds()
    assert abs(result["plan_time_s"] - wall_s) <= max(0.1 * wall_s, 1.0)
    assert set(result["phases"]) >= {"group", "baselines", "search", "sfb", "compile", "bound"}
    assert sum(p["seconds"] for p in result["phases"].values()) <= result["plan_time_s"] + 0.5
    assert result["queued_s"] == pytest.approx((started - created).total_seconds())


def test_result_has_every_number(service: TestClient, mlp_job: dict) -> None:
    reader = make_key("read", tenant=TENANT)
    result = service.get(mlp_job["links"]["result"], headers=reader).json()
    assert result["step_time_s"] > 0
    assert result["lower_bound_s"] <= result["step_time_s"]
    assert set(result["baselines"]) >= {"single", "dp-nccl", "dp-ps", "horovod"}
    assert len(result["peak_memory_bytes"]) == 16
    assert result["estimated"]["compute"] in ("estimated", "measured", "partly measured")
    assert result["strategy"]["version"] == 1


def test_graphdef_parses_and_matches_the_device_map(service: TestClient, mlp_job: dict) -> None:
    reader = make_key("read", tenant=TENANT)
    response = service.get(mlp_job["links"]["graphdef"], headers=reader)
    assert response.headers["content-type"] == "application/octet-stream"
    graph = GraphDef.FromString(response.content)
    assert len(graph.node) > 0
    devices = {node.device for node in graph.node if node.device}
    assert devices and all(d.startswith("/job:worker/replica:0/task:") for d in devices)
    device_map = service.get(mlp_job["links"]["device_map"], headers=reader).json()
    assert device_map
    trace = service.get(mlp_job["links"]["trace"], headers=reader).json()
    assert trace["traceEvents"]


def test_identical_submission_returns_the_existing_job(
    service: TestClient, admin: dict, mlp_job: dict
) -> None:
    again = service.post("/v1/jobs", json=MLP, headers=admin)
    assert again.status_code == 200
    assert again.json()["id"] == mlp_job["id"] and again.json()["existing"] is True
    other_seed = json.loads(json.dumps(MLP))
    other_seed["options"]["seed"] = 1
    fresh = service.post("/v1/jobs", json=other_seed, headers=admin)
    assert fresh.status_code == 202 and fresh.json()["id"] != mlp_job["id"]
    wait_for(service, admin, fresh.json()["id"])


def test_list_filters_by_status_and_paginates(service: TestClient, mlp_job: dict) -> None:
    reader = make_key("read", tenant=TENANT)
    page = service.get("/v1/jobs?status=succeeded&limit=1", headers=reader).json()
    assert page["count"] >= 1 and len(page["data"]) == 1
    assert all(j["status"] == "succeeded" for j in page["data"])
    assert service.get("/v1/jobs?status=cancelled", headers=reader).status_code == 200
    assert_problem(service.get("/v1/jobs?status=bogus", headers=reader), 422)


def test_cancel_a_running_job(service: TestClient, admin: dict) -> None:
    body = {"graph": {"zoo": "small_cnn"}, "cluster": "cloud", "options": {"budget_s": 60}}
    job_id = service.post("/v1/jobs", json=body, headers=admin).json()["id"]
    deadline = time.monotonic() + 60
    while service.get(f"/v1/jobs/{job_id}", headers=admin).json()["phase"] != "search":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    cancelled = service.delete(f"/v1/jobs/{job_id}", headers=admin)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert_problem(service.delete(f"/v1/jobs/{job_id}", headers=admin), 409, "cancelled")
    assert_problem(service.get(f"/v1/jobs/{job_id}/result", headers=admin), 409, "cancelled")
    # the worker stops searching and takes the next job
    follow = {**MLP, "options": {"budget_s": 1, "seed": 7}}
    next_id = service.post("/v1/jobs", json=follow, headers=admin).json()["id"]
    assert wait_for(service, admin, next_id, timeout_s=60)["status"] == "succeeded"
    assert service.get(f"/v1/jobs/{job_id}", headers=admin).json()["status"] == "cancelled"


SHAPE = (
    'attr { key: "_output_shapes" value { list { shape { dim { size: 4 } dim { size: 3 } } } } }'
)
NO_PARAMETERS = f"""
node {{ name: "x" op: "Placeholder" attr {{ key: "dtype" value {{ type: DT_FLOAT }} }} {SHAPE} }}
node {{ name: "loss" op: "Relu" input: "x" attr {{ key: "T" value {{ type: DT_FLOAT }} }} {SHAPE} }}
""".encode()


def test_a_graph_the_worker_refuses_fails_its_job_and_the_worker_goes_on(
    service: TestClient, admin: dict
) -> None:
    body = {"graph": {"base64": base64.b64encode(NO_PARAMETERS).decode()}, "cluster": "testbed"}
    job_id = service.post("/v1/jobs", json=body, headers=admin).json()["id"]
    failed = wait_for(service, admin, job_id, timeout_s=60)
    assert failed["status"] == "failed" and failed["phase"] == "analyze"
    assert "no trainable parameters" in failed["error"]
    assert_problem(service.get(f"/v1/jobs/{job_id}/result", headers=admin), 409, "failed")
    follow = {**MLP, "options": {"budget_s": 1, "seed": 8}}
    next_id = service.post("/v1/jobs", json=follow, headers=admin).json()["id"]
    assert wait_for(service, admin, next_id, timeout_s=60)["status"] == "succeeded"


def test_a_graphdef_that_does_not_fit_in_the_budget_follows_the_answer(
    service: TestClient, admin: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job whose GraphDef compile would not fit in its budget (here: estimated a million
    evaluations long) is answered without it, saying so, and a step of its own compiles it
    after the answer: the GraphDef and device map answer 409 with ``Retry-After`` until
    then. A GraphDef step still owed (its message lost) attaches the same GraphDef when it
    runs, while the client waits the 409s out."""
    from tagplan.db import job_state
    from tagplan.planner import plan as plan_module
    from tagplan.settings import get_settings
    from tagplan.workers.steps import graphdef_step

    monkeypatch.setattr(plan_module, "_GRAPHDEF_EVALUATIONS", 10**6)
    body = {**MLP, "options": {"budget_s": 5, "fresh": True, "seed": 21}}
    job_id = service.post("/v1/jobs", json=body, headers=admin).json()["id"]
    assert wait_for(service, admin, job_id)["status"] == "succeeded"
    result = service.get(f"/v1/jobs/{job_id}/result", headers=admin).json()
    assert result["graphdef_deferred"] is True and result["graphdef_error"] is None
    assert "compiled after the answer" in result["phases"]["compile"]["note"]
    attached = time.monotonic() + 60
    response = service.get(f"/v1/jobs/{job_id}/graphdef", headers=admin)
    while response.status_code == 409 and time.monotonic() < attached:
        assert_problem(response, 409, "compiled after the answer")
        assert response.headers["retry-after"] == "5"
        time.sleep(0.2)
        response = service.get(f"/v1/jobs/{job_id}/graphdef", headers=admin)
    assert response.status_code == 200, response.text
    first = GraphDef.FromString(response.content)
    assert {n.device for n in first.node if n.device}
    settings = get_settings()
    with session_scope(settings.sqlalchemy_url) as session:
        assert not job_state.following_steps(session)  # attached: no longer owed
        row = session.get(Result, job_id)
        row.graphdef_digest, row.device_map = None, None
        job_state.follow_answer(session, job_id=job_id)
    for artifact in ("graphdef", "device-map"):
        missing = service.get(f"/v1/jobs/{job_id}/{artifact}", headers=admin)
        assert_problem(missing, 409, "did not fit in its budget")
    late = threading.Thread(target=graphdef_step, args=(settings, job_id))
    late.start()
    client = TagplanClient(str(service.base_url))  # it waits out the 409s
    client.http = TestClient(service.app, headers=admin)
    assert GraphDef.FromString(client.graphdef(job_id, timeout_s=120)) == first
    assert client.device_map(job_id)
    late.join()
    with session_scope(settings.sqlalchemy_url) as session:
        assert not job_state.following_steps(session)


def test_a_graphdef_that_fails_after_the_answer_says_why(
    service: TestClient, admin: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GraphDef step of a job answered without it fails: the answer stands, its result
    says why, and the GraphDef and device map answer 404 with the reason. The step
    delivered again compiles nothing (here it would raise)."""
    from tagplan.planner import plan as plan_module
    from tagplan.planner.compile import graphdef
    from tagplan.planner.errors import InvalidInput
    from tagplan.settings import get_settings
    from tagplan.workers.steps import graphdef_step

    def refuse(*_: object, **__: object) -> None:
        raise InvalidInput("no GraphDef today")

    monkeypatch.setattr(plan_module, "_GRAPHDEF_EVALUATIONS", 10**6)
    monkeypatch.setattr(graphdef, "compile_graphdef", refuse)
    body = {**MLP, "options": {"budget_s": 5, "fresh": True, "seed": 22}}
    job_id = service.post("/v1/jobs", json=body, headers=admin).json()["id"]
    assert wait_for(service, admin, job_id)["status"] == "succeeded"
    failed = time.monotonic() + 60
    result = service.get(f"/v1/jobs/{job_id}/result", headers=admin).json()
    while result["graphdef_error"] is None and time.monotonic() < failed:
        time.sleep(0.2)
        result = service.get(f"/v1/jobs/{job_id}/result", headers=admin).json()
    assert result["graphdef_error"] == "no GraphDef today"
    assert result["step_time_s"] > 0 and result["strategy"]
    for artifact in ("graphdef", "device-map"):
        missing = service.get(f"/v1/jobs/{job_id}/{artifact}", headers=admin)
        assert_problem(missing, 404, "its compile after the answer failed: no GraphDef today")
    graphdef_step(get_settings(), job_id)
    again = service.get(f"/v1/jobs/{job_id}/result", headers=admin).json()
    assert again["graphdef_error"] == "no GraphDef today"


def test_unknown_job_is_404(service: TestClient, admin: dict) -> None:
    assert_problem(service.get("/v1/jobs/nope", headers=admin), 404, "does not exist")


def test_metrics(service: TestClient, mlp_job: dict) -> None:
    text = service.get("/metrics", headers=make_key("operate")).text
    assert 'tagplan_jobs{status="succeeded"}' in text
    assert "tagplan_queue_depth" in text
    assert "tagplan_plan_latency_seconds_count" in text
    assert 'tagplan_cache_hits_total{kind="job"}' in text


@pytest.mark.slow
def test_vgg19_on_testbed(service: TestClient, admin: dict) -> None:
    body = {"graph": {"zoo": "vgg19"}, "cluster": "testbed", "options": {"budget_s": 4}}
    job_id = service.post("/v1/jobs", json=body, headers=admin).json()["id"]
    job = wait_for(service, admin, job_id)
    assert job["status"] == "succeeded", job
    # a slow machine leaves the GraphDef to its step after the answer: 409 until it is there
    ends = time.monotonic() + 300
    answer = service.get(f"/v1/jobs/{job_id}/graphdef", headers=admin)
    while answer.status_code == 409 and time.monotonic() < ends:
        time.sleep(float(answer.headers["Retry-After"]) / 5)
        answer = service.get(f"/v1/jobs/{job_id}/graphdef", headers=admin)
    assert answer.status_code == 200, answer.text
    graph = GraphDef.FromString(answer.content)
    assert any("conv" in node.name.lower() for node in graph.node)
    result = service.get(f"/v1/jobs/{job_id}/result", headers=admin).json()
    assert result["speedup_vs_dp_nccl"] >= 1.0
    best = result["baselines"][result["best_data_parallel"]]
    assert result["speedup_vs_best_data_parallel"] == pytest.approx(best / result["step_time_s"])


@pytest.mark.tf
@pytest.mark.slow
def test_mlp_plan_verifies_in_tensorflow(service: TestClient, mlp_job: dict) -> None:
    from tagplan.planner.verify.check import verify

    result = service.get(mlp_job["links"]["result"], headers=make_key("read", tenant=TENANT)).json()
    report = verify("zoo:mlp", "testbed", result["strategy"])
    assert report.passed, report.summary()
