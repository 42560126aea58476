"""Bad input is a 4xx problem+json naming the problem, and the service keeps serving."""

from __future__ import annotations

import base64
import gzip

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import assert_problem, make_key

CYCLE = b"""
node { name: "x" op: "Placeholder" attr { key: "dtype" value { type: DT_FLOAT } } }
node { name: "a" op: "AddV2" input: "x" input: "b" attr { key: "T" value { type: DT_FLOAT } } }
node { name: "b" op: "Relu" input: "a" attr { key: "T" value { type: DT_FLOAT } } }
"""


def job(graph: dict, cluster: object = "testbed", **extra: object) -> dict:
    return {"graph": graph, "cluster": cluster, "options": {"budget_s": 1}, **extra}


def inline(data: bytes) -> dict:
    return {"base64": base64.b64encode(data).decode()}


def test_malformed_graph(service: TestClient, admin: dict) -> None:
    response = service.post(
        "/v1/jobs", json=job(inline(b"\x08\xff\xff\xff garbage")), headers=admin
    )
    assert_problem(response, 422, "GraphDef")


def test_cyclic_graph(service: TestClient, admin: dict) -> None:
    response = service.post("/v1/jobs", json=job(inline(CYCLE)), headers=admin)
    assert_problem(response, 422, "cycle")


def test_invalid_base64(service: TestClient, admin: dict) -> None:
    response = service.post("/v1/jobs", json=job({"base64": "not base64!"}), headers=admin)
    assert_problem(response, 422, "base64")


def test_unknown_gpu_type_lists_the_known_ones(service: TestClient, admin: dict) -> None:
    cluster = {
        "machines": [
            {"name": "m0", "gpus": {"type": "Z900", "count": 2}, "intra_bandwidth_gbps": 96}
        ]
    }
    response = service.post("/v1/jobs", json=job({"zoo": "mlp"}, cluster), headers=admin)
    assert_problem(response, 422, "Z900", "V100-32GB", "T4")


def test_too_many_gpus(service: TestClient, admin: dict) -> None:
    cluster = {
        "machines": [
            {"name": f"m{i}", "gpus": {"type": "T4", "count": 8}, "intra_bandwidth_gbps": 96}
            for i in range(9)
        ],
        "network": {"bandwidth_gbps": 10},
    }
    response = service.post("/v1/jobs", json=job({"zoo": "mlp"}, cluster), headers=admin)
    assert_problem(response, 422, "72 GPUs", "limit is 64")


def test_oversize_body_is_413(service: TestClient, admin: dict) -> None:
    body = b"\0" * (2 << 20)
    response = service.post("/v1/graphs", content=body, headers=admin)
    assert_problem(response, 413, "exceeds the limit")


def test_graph_over_the_size_limit_after_gunzip_is_413(service: TestClient, admin: dict) -> None:
    bomb = gzip.compress(b"\0" * (3 << 20))  # 3 MiB inflated, a few KiB on the wire
    assert len(bomb) < 64 << 10
    response = service.post("/v1/jobs", json=job(inline(bomb)), headers=admin)
    assert_problem(response, 413, "exceeds the limit of 2097152 bytes")


def test_graph_over_the_op_limit(service: TestClient, admin: dict) -> None:
    response = service.post("/v1/jobs", json=job({"zoo": "bert_small"}), headers=admin)
    assert_problem(response, 422, "3952 nodes", "limit is 3000")


def test_unknown_graph_id_is_404(service: TestClient, admin: dict) -> None:
    response = service.post("/v1/jobs", json=job({"id": "0" * 64}), headers=admin)
    assert_problem(response, 404, "does not exist")


def test_two_graph_sources_are_refused(service: TestClient, admin: dict) -> None:
    response = service.post("/v1/jobs", json=job({"zoo": "mlp", "id": "x"}), headers=admin)
    assert_problem(response, 422, "exactly one")


def test_request_errors_have_the_planners_wording(service: TestClient, admin: dict) -> None:
    body = job({"zoo": "mlp"}, options={"seed": -1, "temperature": 2})
    response = service.post("/v1/jobs", json=body, headers=admin)
    problem = assert_problem(
        response,
        422,
        "invalid request: options.seed: Input should be greater than or equal to 0 (got -1)",
        "options.temperature: unknown field",
    )
    assert "body" not in problem["detail"]


def test_budget_over_the_limit(service: TestClient, admin: dict) -> None:
    body = job({"zoo": "mlp"})
    body["options"]["budget_s"] = 1e6
    assert_problem(service.post("/v1/jobs", json=body, headers=admin), 422, "budget_s")


def test_missing_key_is_401(service: TestClient) -> None:
    response = service.get("/v1/jobs")
    assert_problem(response, 401, "API key is required")
    assert response.headers["www-authenticate"] == "Bearer"


def test_unknown_key_is_401(service: TestClient) -> None:
    response = service.get("/v1/jobs", headers={"Authorization": "Bearer tpk_nope_nope"})
    assert_problem(response, 401, "unknown or revoked")


@pytest.mark.parametrize(
    ("scope", "method", "path"),
    [
        ("read", "POST", "/v1/jobs"),
        ("submit", "POST", "/v1/profiles"),
        ("read", "POST", "/v1/graphs"),
    ],
)
def test_wrong_scope_is_403(service: TestClient, scope: str, method: str, path: str) -> None:
    headers = make_key(scope)
    response = service.request(method, path, json={}, headers=headers)
    assert_problem(response, 403, "scope")


def test_rate_limit_is_429_per_key(service: TestClient) -> None:
    limited = make_key("read", rate_limit=3)
    codes = [service.get("/v1/gpu-types", headers=limited).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    other = make_key("read")
    assert service.get("/v1/gpu-types", headers=other).status_code == 200


def test_health_is_anonymous_and_the_service_keeps_serving(service: TestClient) -> None:
    assert service.get("/healthz").json() == {"status": "ok"}
    ready = service.get("/readyz")
    assert ready.status_code == 200, ready.json()
    assert service.get("/v1/clusters/named", headers=make_key("read")).status_code == 200
