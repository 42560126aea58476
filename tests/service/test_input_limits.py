"""Every number a request carries is bounded below what PostgreSQL stores: one past a
bound is a 422 problem naming the field, never a 500 from the database; the bound itself
is accepted. The service under test runs on the PostgreSQL server here."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tagplan.planner.topology.schema import MAX_BANDWIDTH_GBPS, MAX_GPUS_PER_MACHINE, MAX_LATENCY_US
from tagplan.service.schemas import (
    INT32_MAX,
    MAX_BUDGET_S,
    MAX_GROUPS,
    MAX_NAME_CHARS,
    MAX_NODE_NAME_CHARS,
    MAX_SHARDS,
)
from tagplan.settings import get_settings
from tests.service.conftest import assert_problem
from tests.service.test_jobs import NO_PARAMETERS

GRAPH = {"base64": base64.b64encode(NO_PARAMETERS).decode()}
"""A graph the API takes and the worker refuses at once: accepted jobs cost nothing."""


def submission(**changes: Any) -> dict[str, Any]:
    """A job body with ``changes`` applied at dotted paths (``options.seed``)."""
    body: dict[str, Any] = {"graph": dict(GRAPH), "cluster": "testbed", "options": {}}
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        target = body
        for part in parents:
            target = target[part]
        target[leaf] = value
    return body


def post_json(client: TestClient, path: str, body: Any, headers: dict[str, str]) -> Any:
    """POST ``body`` as JSON as Python writes it: ``Infinity`` and ``NaN`` included."""
    content = json.dumps(body)
    return client.post(
        path, content=content, headers={**headers, "content-type": "application/json"}
    )


def accepted(client: TestClient, response: Any, headers: dict[str, str]) -> None:
    """A new job (202); cancelled at once so the worker does not plan it."""
    assert response.status_code == 202, response.text
    client.delete(f"/v1/jobs/{response.json()['id']}", headers=headers)


OUT_OF_RANGE = [
    ("batch_size", 0),
    ("batch_size", INT32_MAX + 1),
    ("batch_size", 10**12),
    ("options__budget_s", 0),
    ("options__budget_s", MAX_BUDGET_S * 2),
    ("options__budget_s", float("inf")),
    ("options__budget_s", float("nan")),
    ("options__iterations", 0),
    ("options__iterations", INT32_MAX + 1),
    ("options__seed", -1),
    ("options__seed", INT32_MAX + 1),
    ("options__shards", 0),
    ("options__shards", MAX_SHARDS + 1),
    ("options__max_groups", 0),
    ("options__max_groups", MAX_GROUPS + 1),
    ("options__profiles", ["p"] * 101),
    ("options__profiles", ["0" * 65]),
    ("graph__loss", "x" * (MAX_NODE_NAME_CHARS + 1)),
    ("graph__batch_inputs", ["x" * (MAX_NODE_NAME_CHARS + 1)]),
    ("graph__zoo", "x" * (MAX_NAME_CHARS + 1)),
    ("cluster", "random:" + "9" * MAX_NAME_CHARS),
]


@pytest.mark.parametrize(("field", "value"), OUT_OF_RANGE, ids=lambda v: str(v)[:24])
def test_out_of_range_job_fields_are_422(
    service: TestClient, admin: dict, field: str, value: Any
) -> None:
    body = submission(**{field: value})
    if field == "graph__zoo":
        body["graph"] = {"zoo": value}
    response = post_json(service, "/v1/jobs", body, admin)
    assert_problem(response, 422, field.split("__")[-1])


AT_THE_BOUND = [
    ("batch_size", INT32_MAX),
    ("options__iterations", INT32_MAX),
    ("options__seed", INT32_MAX),
    ("options__max_groups", MAX_GROUPS),
    ("graph__loss", "x" * MAX_NODE_NAME_CHARS),
    ("graph__batch_inputs", ["x" * MAX_NODE_NAME_CHARS]),
    ("cluster", "random:" + "9" * (MAX_NAME_CHARS - len("random:"))),
]


@pytest.mark.parametrize(("field", "value"), AT_THE_BOUND, ids=lambda v: str(v)[:24])
def test_job_fields_at_their_bound_are_accepted(
    service: TestClient, admin: dict, field: str, value: Any
) -> None:
    response = service.post("/v1/jobs", json=submission(**{field: value}), headers=admin)
    accepted(service, response, admin)


def test_the_service_limits_are_accepted_up_to_the_limit(service: TestClient, admin: dict) -> None:
    settings = get_settings()
    at = submission(options__budget_s=settings.max_budget_s, options__shards=settings.max_shards)
    accepted(service, service.post("/v1/jobs", json=at, headers=admin), admin)
    over = submission(options__budget_s=settings.max_budget_s + 1)
    assert_problem(service.post("/v1/jobs", json=over, headers=admin), 422, "budget_s")
    over = submission(options__shards=settings.max_shards + 1)
    assert_problem(service.post("/v1/jobs", json=over, headers=admin), 422, "shards")


def machine(**changes: Any) -> dict[str, Any]:
    return {"name": "m0", "gpus": {"type": "T4", "count": 2}, "intra_bandwidth_gbps": 96, **changes}


def two_machines(**network: Any) -> dict[str, Any]:
    return {
        "machines": [machine(), machine(name="m1")],
        "network": {"bandwidth_gbps": 10, **network},
    }


BAD_CLUSTERS = [
    ("count", {"machines": [machine(gpus={"type": "T4", "count": MAX_GPUS_PER_MACHINE + 1})]}),
    ("count", {"machines": [machine(gpus={"type": "T4", "count": 10**12})]}),
    ("index", {"machines": [machine(gpus=[{"index": MAX_GPUS_PER_MACHINE, "type": "T4"}])]}),
    ("intra_bandwidth_gbps", {"machines": [machine(intra_bandwidth_gbps=MAX_BANDWIDTH_GBPS * 2)]}),
    ("intra_bandwidth_gbps", {"machines": [machine(intra_bandwidth_gbps=float("inf"))]}),
    ("intra_latency_us", {"machines": [machine(intra_latency_us=MAX_LATENCY_US * 2)]}),
    ("bandwidth_gbps", two_machines(bandwidth_gbps=float("inf"))),
    ("latency_us", two_machines(latency_us=float("nan"))),
    ("bandwidth_gbps", two_machines(links=[{"between": ["m0", "m1"], "bandwidth_gbps": 1e300}])),
    (
        "fp32_tflops",
        {
            "gpu_types": [
                {
                    "name": "X1",
                    "fp32_tflops": 1e300,
                    "memory_bandwidth_gb_per_s": 900,
                    "memory_gib": 16,
                }
            ],
            "machines": [machine(gpus={"type": "X1", "count": 1})],
        },
    ),
    (
        "8192 GPUs",  # refused before a cluster of that size is built
        {
            "machines": [
                machine(name=f"m{i}", gpus={"type": "T4", "count": 4096}) for i in range(2)
            ],
            "network": {"bandwidth_gbps": 10},
        },
    ),
]


@pytest.mark.parametrize(("field", "spec"), BAD_CLUSTERS, ids=lambda v: str(v)[:24])
def test_out_of_range_cluster_specs_are_422(
    service: TestClient, admin: dict, field: str, spec: dict
) -> None:
    assert_problem(post_json(service, "/v1/clusters", spec, admin), 422, field)
    job = submission(cluster=spec)
    assert_problem(post_json(service, "/v1/jobs", job, admin), 422, field)


def test_cluster_figures_at_their_bound_are_accepted(service: TestClient, admin: dict) -> None:
    spec = two_machines(
        latency_us=MAX_LATENCY_US,
        links=[{"between": ["m0", "m1"], "bandwidth_gbps": MAX_BANDWIDTH_GBPS}],
    )
    spec["machines"][0].update(intra_bandwidth_gbps=MAX_BANDWIDTH_GBPS, intra_latency_us=0)
    spec["machines"][1]["gpus"] = [{"index": MAX_GPUS_PER_MACHINE - 1, "type": "T4"}]
    stored = service.post("/v1/clusters", json=spec, headers=admin)
    assert stored.status_code == 201, stored.text
    assert stored.json()["num_gpus"] == 3
    accepted(service, service.post("/v1/jobs", json=submission(cluster=spec), headers=admin), admin)


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/v1/jobs", {"offset": INT32_MAX + 1}, "offset"),
        ("/v1/jobs", {"limit": 501}, "limit"),
        (
            "/v1/strategies",
            {"graph": "0" * 64, "cluster": "testbed", "batch_size": INT32_MAX + 1},
            "batch_size",
        ),
        ("/v1/strategies", {"graph": "0" * 65, "cluster": "testbed"}, "graph"),
        ("/v1/strategies", {"graph": "0" * 64, "cluster": "x" * (MAX_NAME_CHARS + 1)}, "cluster"),
        ("/v1/profiles", {"kind": "other"}, "kind"),
    ],
)
def test_out_of_range_query_parameters_are_422(
    service: TestClient, admin: dict, path: str, params: dict, field: str
) -> None:
    assert_problem(service.get(path, params=params, headers=admin), 422, field)


def test_query_parameters_at_their_bound_are_accepted(service: TestClient, admin: dict) -> None:
    page = service.get("/v1/jobs", params={"offset": INT32_MAX, "limit": 500}, headers=admin)
    assert page.status_code == 200 and page.json()["data"] == []
    query = {"graph": "0" * 64, "cluster": "testbed", "batch_size": INT32_MAX}
    assert service.get("/v1/strategies", params=query, headers=admin).json()["count"] == 0


def test_a_head_over_the_header_limit_is_431(service: TestClient, admin: dict) -> None:
    limit = get_settings().max_header_bytes
    response = service.get("/v1/gpu-types", headers={**admin, "X-Padding": "x" * limit})
    assert_problem(response, 431, f"limit of {limit} bytes")
    padded = {**admin, "X-Padding": "x" * (limit // 2)}
    assert service.get("/v1/gpu-types", headers=padded).status_code == 200
