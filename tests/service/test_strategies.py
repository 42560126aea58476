"""The strategy cache: a cluster equal up to renaming and renumbering hits it, and the
strategy comes back in the caller's numbering and runs there with the same step time."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.strategy import load_strategy
from tagplan.planner.topology import dumps_cluster_spec, load_cluster
from tests.service.conftest import TENANT, assert_problem, make_key, wait_for

MLP = {"graph": {"zoo": "mlp"}, "cluster": "testbed", "options": {"budget_s": 2}}


def renumbered_testbed() -> dict:
    """The testbed with machines listed in reverse and renamed."""
    spec = json.loads(dumps_cluster_spec(load_cluster("testbed"), fmt="json"))
    machines = list(reversed(spec["machines"]))
    for i, machine in enumerate(machines):
        machine["name"] = f"node-{i}"
    return {**spec, "machines": machines}


@pytest.fixture(scope="module")
def cached(service: TestClient, admin: dict) -> dict:
    job = service.post("/v1/jobs", json=MLP, headers=admin).json()
    assert wait_for(service, admin, job["id"])["status"] == "succeeded"
    return service.get(f"/v1/jobs/{job['id']}/result", headers=admin).json()


def test_same_cluster_by_fingerprint_and_by_name(service: TestClient, cached: dict) -> None:
    reader = make_key("read", tenant=TENANT)
    query = {"graph": cached["graph_fingerprint"], "cluster": cached["cluster_fingerprint"]}
    hits = service.get("/v1/strategies", params=query, headers=reader).json()
    assert hits["count"] >= 1
    assert hits["data"][0]["step_time_s"] <= cached["step_time_s"]
    by_name = service.get(
        "/v1/strategies", params={**query, "cluster": "testbed"}, headers=reader
    ).json()
    assert by_name["data"][0]["remapped"] is False


def test_renumbered_cluster_hits_and_is_remapped(service: TestClient, cached: dict) -> None:
    spec = renumbered_testbed()
    stored = service.post("/v1/clusters", json=spec, headers=make_key("submit")).json()
    assert stored["fingerprint"] == cached["cluster_fingerprint"]
    query = {"graph": cached["graph_fingerprint"], "cluster": stored["id"]}
    hit = service.get("/v1/strategies", params=query, headers=make_key("operate")).json()
    best = hit["data"][0]
    assert best["remapped"] is True
    assert all(name.startswith("node-") for name in best["peak_memory_bytes"])

    source = load_graph_source("zoo:mlp")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    target = load_cluster(spec)
    evaluation = Evaluator(ir, target).evaluate(load_strategy(best["strategy"]))
    assert evaluation.step_time_s == pytest.approx(best["step_time_s"], rel=1e-6)
    peaks = dict(zip(target.device_names, evaluation.result.peak_memory_bytes, strict=True))
    assert peaks == pytest.approx(best["peak_memory_bytes"], rel=1e-6)


def test_other_cluster_misses(service: TestClient, cached: dict) -> None:
    query = {"graph": cached["graph_fingerprint"], "cluster": "cloud"}
    assert service.get(
        "/v1/strategies", params=query, headers=make_key("read", tenant=TENANT)
    ).json() == {
        "data": [],
        "count": 0,
    }


def test_unknown_named_cluster(service: TestClient) -> None:
    query = {"graph": "0" * 64, "cluster": "nonsense"}
    response = service.get("/v1/strategies", params=query, headers=make_key("read", tenant=TENANT))
    assert_problem(response, 422)
