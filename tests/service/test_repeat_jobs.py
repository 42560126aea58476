"""Repeat jobs: a job for a graph and allocation planned before is answered from the
cache (renamed, reordered machines included), in the job's numbering and re-simulated;
``fresh`` searches from the cached plan; near misses warm-start the search; stale plans
and other tenants' plans never answer."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from tagplan.db.models import Result
from tagplan.db.session import session_scope
from tagplan.planner.compile.graphdef import worker_device
from tagplan.planner.graph.protos import GraphDef
from tagplan.planner.strategy_remap import ClusterMapping
from tagplan.planner.topology import canonical_order, load_cluster
from tagplan.settings import get_settings
from tests.service.conftest import make_key, wait_for

TENANT = "repeats"


def _machine(name: str, kind: str, count: int, gbps: float) -> dict:
    return {"name": name, "gpus": {"type": kind, "count": count}, "intra_bandwidth_gbps": gbps}


FIRST = {
    "machines": [
        _machine("v100-box", "V100-16GB", 3, 120),
        _machine("t4-box", "T4", 2, 30),
        _machine("p100-box", "P100", 1, 40),
    ],
    "network": {"bandwidth_gbps": 25, "latency_us": 5},
}
# the same allocation as a scheduler might hand it out again: renamed, reordered
RENUMBERED = {
    **FIRST,
    "machines": [
        {**FIRST["machines"][2], "name": "n7"},
        {**FIRST["machines"][0], "name": "n3"},
        {**FIRST["machines"][1], "name": "n5"},
    ],
}
# one machine more: a near miss
GROWN = {**FIRST, "machines": [*FIRST["machines"], _machine("t4-box-2", "T4", 2, 30)]}


def _job(cluster: dict, budget_s: float, **options) -> dict:
    return {
        "graph": {"zoo": "small_cnn"},
        "cluster": cluster,
        "options": {"budget_s": budget_s, **options},
    }


def _plan(service: TestClient, headers: dict, body: dict) -> tuple[dict, dict]:
    job = service.post("/v1/jobs", json=body, headers=headers).json()
    done = wait_for(service, headers, job["id"])
    assert done["status"] == "succeeded", done
    return done, service.get(f"/v1/jobs/{job['id']}/result", headers=headers).json()


@pytest.fixture(scope="module")
def owner(service: TestClient) -> dict[str, str]:
    return make_key("admin", tenant=TENANT)


@pytest.fixture(scope="module")
def first(service: TestClient, owner: dict) -> tuple[dict, dict]:
    return _plan(service, owner, _job(FIRST, 3))


def test_a_renumbered_repeat_is_answered_from_the_cache(service, owner, first) -> None:
    first_job, cached = first
    assert cached["source"] == "search"
    job, answer = _plan(service, owner, _job(RENUMBERED, 4))
    assert answer["source"] == "cache" and answer["cached_from"] == first_job["id"]
    assert answer["stop_reason"] == "cache" and answer["iterations"] == 0
    source, target = load_cluster(FIRST), load_cluster(RENUMBERED)
    mapping = ClusterMapping((source, canonical_order(source)), (target, canonical_order(target)))
    assert answer["strategy"] == mapping.strategy(cached["strategy"])
    assert answer["step_time_s"] == pytest.approx(cached["step_time_s"], rel=1e-9)
    assert answer["peak_memory_bytes"] == mapping.per_device(cached["peak_memory_bytes"])
    assert answer["baselines"] == cached["baselines"]
    assert set(answer["peak_memory_bytes"]) == set(target.device_names)
    # the GraphDef is the cached one on the mapped devices of the new numbering
    old = GraphDef.FromString(
        service.get(f"/v1/jobs/{first_job['id']}/graphdef", headers=owner).content
    )
    new = GraphDef.FromString(service.get(f"/v1/jobs/{job['id']}/graphdef", headers=owner).content)
    strings = {
        worker_device(source, d): worker_device(target, int(t))
        for d, t in enumerate(mapping.devices)
    }
    on_gpus = {n.name: n.device for n in old.node if "GPU" in n.device}
    assert on_gpus and all(
        {n.name: n.device for n in new.node}[name] == strings[device]
        for name, device in on_gpus.items()
    )
    device_map = service.get(f"/v1/jobs/{job['id']}/device-map", headers=owner).json()
    assert {t["machine"] for t in device_map["tasks"].values()} == {"n3", "n5", "n7"}
    # the answer's own clock: from its start to its end
    wall_s = (
        datetime.fromisoformat(job["finished_at"]) - datetime.fromisoformat(job["started_at"])
    ).total_seconds()
    assert answer["plan_time_s"] == pytest.approx(wall_s, rel=0.1, abs=1e-3)


def test_the_trace_of_a_cached_answer_follows(service, owner, first) -> None:
    job, answer = _plan(service, owner, _job(RENUMBERED, 5))
    assert answer["cached_from"] == first[0]["id"]  # the searched plan, not another copy
    deadline = time.monotonic() + 60
    while (
        response := service.get(f"/v1/jobs/{job['id']}/trace", headers=owner)
    ).status_code == 409:
        assert response.headers["Retry-After"] and time.monotonic() < deadline
        time.sleep(0.2)
    assert response.status_code == 200
    events = response.json()["traceEvents"]
    lanes = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert any("n3" in lane for lane in lanes)


def test_fresh_searches_from_the_cached_plan_and_is_never_slower(service, owner, first) -> None:
    _, cached = first
    _, answer = _plan(service, owner, _job(RENUMBERED, 3, fresh=True))
    assert answer["source"] == "search" and answer["iterations"] > 0
    assert answer["warm_start"]["kind"] == "same plan"
    assert answer["step_time_s"] <= cached["step_time_s"] * (1 + 1e-9)


def test_a_machine_more_warm_starts_the_search(service, owner, first) -> None:
    _, cached = first
    _, answer = _plan(service, owner, _job(GROWN, 3))
    assert answer["source"] == "search"
    assert answer["warm_start"]["kind"] == "machines"
    origin = service.get(f"/v1/jobs/{answer['warm_start']['job_id']}/result", headers=owner)
    assert origin.json()["cluster_fingerprint"] == cached["cluster_fingerprint"]


def test_another_tenant_never_gets_the_cached_plan(service, first) -> None:
    _, answer = _plan(service, make_key("submit", tenant="elsewhere"), _job(RENUMBERED, 3))
    assert answer["source"] == "search" and answer.get("warm_start") is None


def test_a_stale_plan_is_listed_but_never_answers(service) -> None:
    tenant = "stale"
    headers = make_key("admin", tenant=tenant)
    own_first, own = _plan(service, headers, _job(FIRST, 3))
    with session_scope(get_settings().sqlalchemy_url) as session:
        session.execute(
            update(Result)
            .where(Result.job_id == own_first["id"])
            .values(cost_key="0" * 64, planner_version="0.0.1+000000000000")
        )
    _, answer = _plan(service, headers, _job(RENUMBERED, 4))
    assert answer["source"] == "search" and answer.get("warm_start") is None
    listed = service.get(
        "/v1/strategies",
        params={"graph": own["graph_fingerprint"], "cluster": own["cluster_fingerprint"]},
        headers=headers,
    ).json()["data"]
    stale = {s["job_id"]: s["stale"] for s in listed}
    assert stale[own_first["id"]] is True and list(stale.values()).count(False) >= 1


def test_a_waiting_request_answers_once_the_job_has_ended(service, owner, first) -> None:
    job = service.post("/v1/jobs", json=_job(RENUMBERED, 6), headers=owner).json()
    started = time.monotonic()
    done = service.get(f"/v1/jobs/{job['id']}", params={"wait_s": 30}, headers=owner).json()
    assert done["status"] == "succeeded" and time.monotonic() - started < 30
    too_long = service.get(f"/v1/jobs/{job['id']}", params={"wait_s": 31}, headers=owner)
    assert too_long.status_code == 422
