"""The OpenAPI document lists every endpoint with its operation and parameters."""

from __future__ import annotations

from fastapi.testclient import TestClient

ENDPOINTS = {
    "/v1/jobs": {"get", "post"},
    "/v1/jobs/{job_id}": {"get", "delete"},
    "/v1/jobs/{job_id}/result": {"get"},
    "/v1/jobs/{job_id}/graphdef": {"get"},
    "/v1/jobs/{job_id}/device-map": {"get"},
    "/v1/jobs/{job_id}/trace": {"get"},
    "/v1/graphs": {"post"},
    "/v1/strategies": {"get"},
    "/v1/profiles": {"get", "post"},
    "/v1/checkpoints": {"get", "post"},
    "/v1/checkpoints/active": {"get", "delete"},
    "/v1/checkpoints/{checkpoint_id}/active": {"put"},
    "/v1/gpu-types": {"get"},
    "/v1/clusters/named": {"get"},
    "/v1/clusters": {"post"},
    "/healthz": {"get"},
    "/readyz": {"get"},
    "/metrics": {"get"},
}


def test_openapi_documents_every_endpoint(service: TestClient) -> None:
    document = service.get("/v1/openapi.json").json()
    paths = document["paths"]
    for path, methods in ENDPOINTS.items():
        assert path in paths, path
        assert methods <= set(paths[path]), (path, set(paths[path]))
        for method in methods:
            assert paths[path][method].get("summary") or paths[path][method].get("description")
    submit = paths["/v1/jobs"]["post"]
    assert {"200", "202"} <= set(submit["responses"])
    assert "multipart/form-data" in paths["/v1/graphs"]["post"]["requestBody"]["content"]
    strategies = {p["name"] for p in paths["/v1/strategies"]["get"]["parameters"]}
    assert {"graph", "cluster", "batch_size"} <= strategies
