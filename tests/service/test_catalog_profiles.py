"""GPU types, named clusters, stored clusters and profiles."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient

from tests.service.conftest import assert_problem, make_key, wait_for

PROFILE = Path(__file__).resolve().parents[2] / "bench" / "profiles" / "cpu_vgg19.json"


def test_gpu_types_cover_the_catalog(service: TestClient) -> None:
    types = service.get("/v1/gpu-types", headers=make_key("read")).json()
    names = {t["name"] for t in types}
    assert {"V100-32GB", "GTX-1080Ti", "P100", "T4", "A100-80GB", "H100"} <= names
    assert all(t["memory_gib"] > 0 for t in types)


def test_named_clusters(service: TestClient) -> None:
    named = service.get("/v1/clusters/named", headers=make_key("read")).json()
    testbed = next(c for c in named if c["name"] == "testbed")
    assert testbed["summary"]["gpus"] == 16 and testbed["summary"]["machines"] == 7


def test_stored_cluster_round_trip(service: TestClient) -> None:
    spec = {
        "machines": [{"name": "a", "gpus": {"type": "T4", "count": 2}, "intra_bandwidth_gbps": 96}]
    }
    stored = service.post("/v1/clusters", json=spec, headers=make_key("submit", tenant="acme"))
    assert stored.status_code == 201
    reader = make_key("read", tenant="acme")
    again = service.get(f"/v1/clusters/{stored.json()['id']}", headers=reader).json()
    assert again["num_gpus"] == 2 and again["fingerprint"] == stored.json()["fingerprint"]
    assert_problem(service.get("/v1/clusters/nope", headers=make_key("read")), 404)


def test_profile_upload_list_and_download(service: TestClient) -> None:
    operator = make_key("operate")
    document = json.loads(PROFILE.read_text())
    created = service.post("/v1/profiles?name=vgg19-cpu", json=document, headers=operator)
    assert created.status_code == 201, created.text
    profile = created.json()
    assert profile["kind"] == "op" and profile["meta"]["gpu_type"] == "CPU"
    listed = service.get("/v1/profiles?kind=op", headers=operator).json()
    assert profile["id"] in {p["id"] for p in listed}
    stored = service.get(f"/v1/profiles/{profile['id']}", headers=operator).json()
    assert stored["ops"] == document["ops"]


def test_bad_profile_is_422_naming_the_field(service: TestClient) -> None:
    document = json.loads(PROFILE.read_text())
    document["batch_sizes"] = [0]
    response = service.post("/v1/profiles", json=document, headers=make_key("operate"))
    assert_problem(response, 422, "batch")
    response = service.post("/v1/profiles", json={"format": "x"}, headers=make_key("operate"))
    assert_problem(response, 422, "tagplan.profile", "tagplan.comm-profile")


CPU_PAIR = {
    "machines": [{"name": "c0", "gpus": {"type": "CPU", "count": 2}, "intra_bandwidth_gbps": 96}]
}


def test_a_job_plans_with_an_uploaded_profile(service: TestClient) -> None:
    operator = make_key("operate", "submit")
    document = json.loads(PROFILE.read_text())
    profile_id = service.post("/v1/profiles", json=document, headers=operator).json()["id"]
    body = {"graph": {"zoo": "vgg19"}, "cluster": CPU_PAIR, "options": {"budget_s": 2}}
    measured = {**body, "options": {"budget_s": 2, "profiles": [profile_id]}}
    results = {}
    for name, request in (("analytic", body), ("profiled", measured)):
        job = service.post("/v1/jobs", json=request, headers=operator).json()
        assert wait_for(service, operator, job["id"])["status"] == "succeeded"
        results[name] = service.get(f"/v1/jobs/{job['id']}/result", headers=operator).json()
    assert results["analytic"]["estimated"]["compute_measured_fraction"] == 0
    assert results["profiled"]["estimated"]["compute_measured_fraction"] > 0.5
    assert results["profiled"]["step_time_s"] != results["analytic"]["step_time_s"]


def test_unknown_profile_is_404(service: TestClient) -> None:
    body = {"graph": {"zoo": "mlp"}, "cluster": "testbed", "options": {"profiles": ["nope"]}}
    response = service.post("/v1/jobs", json=body, headers=make_key("submit"))
    assert_problem(response, 404, "nope")
