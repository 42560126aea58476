"""The authorization matrix: every route of the app x every kind of caller, with the status
each one gets.

Tenant ``alpha`` owns a job, a graph, a cluster, a profile and a checkpoint. Callers: no
key, an unknown key, a revoked key (401); alpha's keys of each scope (403 without the
route's scope); other tenants' keys of each scope (each key a tenant of its own, so what
one stores is no other's), which get the 404 of a row that does not exist on alpha's
objects unless they operate (operate and admin see every tenant's). What the matrix
uploads with the submit scope differs from alpha's objects: a tenant uploading the same
bytes holds the same row. A route missing from :data:`MATRIX` fails
:func:`test_every_route_is_in_the_matrix`.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient

from tagplan.db.keys import create_key, expand_scopes
from tagplan.db.models import ApiKey, utcnow
from tagplan.db.session import session_scope
from tagplan.planner.zoo import catalog
from tagplan.settings import get_settings
from tests.service.conftest import assert_problem, make_key, wait_for

OWNER, OTHER = "alpha", "other"
PROFILE = Path(__file__).resolve().parents[2] / "bench" / "profiles" / "cpu_vgg19.json"

Objects = dict[str, str]
"""Ids of the owner's objects by name: job, graph, cluster, profile, checkpoint,
fingerprint (of the graph)."""


@dataclass(frozen=True)
class Endpoint:
    """What a route needs and answers.

    ``scope``: the scope it requires (None: public). ``owned``: it reads or names one of
    the owner's objects, so another tenant without operate gets 404. ``ok``: the statuses
    of an admitted caller. ``lists``: the object whose id an admitted caller finds in the
    answer exactly when it sees the owner's rows. ``request``: the path's placeholders,
    query and body from the owner's objects.
    """

    scope: str | None
    ok: frozenset[int] = frozenset({200})
    owned: bool = False
    lists: str | None = None
    request: Callable[[Objects], dict[str, Any]] = field(default=lambda _: {})


def _job_body(objects: Objects) -> dict[str, Any]:
    model = catalog.get_model("mlp")
    graph = {
        "id": objects["graph"],
        "batch_inputs": [e["name"] for e in model.inputs],
        "loss": model.loss_node,
    }
    return {"graph": graph, "cluster": objects["cluster"], "options": {"budget_s": 1}}


def _cluster_spec(name: str) -> dict[str, Any]:
    machine = {"name": name, "gpus": {"type": "T4", "count": 2}, "intra_bandwidth_gbps": 96}
    return {"machines": [machine]}


def _compressed_mlp() -> bytes:
    """The owner's graph compressed: the same graph as other bytes, so another row."""
    return gzip.compress(catalog.read_graph_bytes("mlp"), mtime=0)


OWNERS_OBJECTS: dict[str, tuple[str, str, Callable[[Objects], dict[str, Any]]]] = {
    "graph": ("POST", "/v1/graphs", lambda _: {"content": catalog.read_graph_bytes("mlp")}),
    "cluster": ("POST", "/v1/clusters", lambda _: {"json": _cluster_spec("alpha")}),
    "profile": ("POST", "/v1/profiles", lambda _: {"json": json.loads(PROFILE.read_text())}),
    "checkpoint": ("POST", "/v1/checkpoints", lambda _: {"params": {"name": "a"}, "content": b"a"}),
    "job": ("POST", "/v1/jobs", lambda o: {"json": _job_body(o)}),
}
"""How the owner creates each object, in order (the job names the graph and cluster)."""


PUBLIC = Endpoint(scope=None)
READ_OWNED = Endpoint("read", owned=True)

MATRIX: dict[tuple[str, str], Endpoint] = {
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    ("GET", "/v1/openapi.json"): PUBLIC,
    ("GET", "/docs"): PUBLIC,
    ("GET", "/docs/oauth2-redirect"): PUBLIC,
    ("GET", "/redoc"): PUBLIC,
    ("GET", "/"): PUBLIC,  # leads to the dashboard's page, which asks for a key itself
    ("GET", "/v1/overview"): Endpoint("read"),
    ("GET", "/metrics"): Endpoint("operate"),
    ("GET", "/v1/gpu-types"): Endpoint("read"),
    ("GET", "/v1/clusters/named"): Endpoint("read"),
    ("POST", "/v1/clusters"): Endpoint(
        "submit", frozenset({201}), request=lambda _: {"json": _cluster_spec("other")}
    ),
    ("GET", "/v1/clusters/{cluster_id}"): READ_OWNED,
    ("GET", "/v1/clusters/{cluster_id}/layout"): READ_OWNED,
    ("POST", "/v1/graphs"): Endpoint(
        "submit",
        frozenset({201}),
        request=lambda _: {"content": _compressed_mlp()},
    ),
    ("GET", "/v1/graphs/{graph_id}"): READ_OWNED,
    # The body names the owner's graph and cluster; the owner's identical job is returned.
    ("POST", "/v1/jobs"): Endpoint(
        "submit", frozenset({200, 202}), owned=True, request=lambda o: {"json": _job_body(o)}
    ),
    ("GET", "/v1/jobs"): Endpoint("read", lists="job"),
    ("GET", "/v1/jobs/{job_id}"): READ_OWNED,
    # The job has succeeded: an admitted caller reaches the cancel and is told so.
    ("DELETE", "/v1/jobs/{job_id}"): Endpoint("submit", frozenset({409}), owned=True),
    ("GET", "/v1/jobs/{job_id}/result"): READ_OWNED,
    ("GET", "/v1/jobs/{job_id}/graphdef"): READ_OWNED,
    ("GET", "/v1/jobs/{job_id}/device-map"): READ_OWNED,
    ("GET", "/v1/jobs/{job_id}/trace"): READ_OWNED,
    ("GET", "/v1/jobs/{job_id}/progress"): READ_OWNED,
    ("GET", "/v1/jobs/{job_id}/timeline"): READ_OWNED,
    ("GET", "/v1/jobs/{job_id}/report"): READ_OWNED,
    ("GET", "/v1/strategies"): Endpoint(
        "read",
        lists="job",
        request=lambda o: {"params": {"graph": o["fingerprint"], "cluster": o["cluster"]}},
    ),
    ("POST", "/v1/profiles"): Endpoint(
        "operate", frozenset({201}), request=OWNERS_OBJECTS["profile"][2]
    ),
    ("GET", "/v1/profiles"): Endpoint("read", lists="profile"),
    ("GET", "/v1/profiles/{profile_id}"): READ_OWNED,
    ("POST", "/v1/checkpoints"): Endpoint(
        "operate", frozenset({201}), request=lambda _: {"params": {"name": "b"}, "content": b"b"}
    ),
    ("GET", "/v1/checkpoints"): Endpoint("read", lists="checkpoint"),
    ("GET", "/v1/checkpoints/{checkpoint_id}"): READ_OWNED,
    ("GET", "/v1/checkpoints/active"): Endpoint("read"),
    ("PUT", "/v1/checkpoints/{checkpoint_id}/active"): Endpoint("operate", owned=True),
    ("DELETE", "/v1/checkpoints/active"): Endpoint("operate"),
}

SCOPES = ("read", "submit", "operate", "admin")
CALLERS = (
    "no key",
    "wrong key",
    "revoked key",
    *(f"{OWNER}:{scope}" for scope in SCOPES),
    *(f"{OTHER}:{scope}" for scope in SCOPES),
)


def _sees_owners_rows(caller: str) -> bool:
    """The owner's keys and every operator see the owner's rows."""
    tenant, scope = caller.split(":")
    return tenant == OWNER or "operate" in expand_scopes([scope])


def expected(endpoint: Endpoint, caller: str) -> frozenset[int]:
    """The statuses ``caller`` may get from ``endpoint``."""
    if endpoint.scope is None:
        return endpoint.ok
    if ":" not in caller:
        return frozenset({401})
    if endpoint.scope not in expand_scopes([caller.split(":")[1]]):
        return frozenset({403})
    if endpoint.owned and not _sees_owners_rows(caller):
        return frozenset({404})
    return endpoint.ok


def _revoked_key() -> dict[str, str]:
    with session_scope(get_settings().sqlalchemy_url) as session:
        row, token = create_key(session, scopes=["admin"], tenant=OWNER)
        session.get(ApiKey, row.id).revoked_at = utcnow()
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def callers(service: TestClient) -> dict[str, dict[str, str]]:
    """Headers of each caller in :data:`CALLERS`."""
    headers = {"no key": {}, "wrong key": {"Authorization": "Bearer tpk_0123_not-a-key"}}
    headers["revoked key"] = _revoked_key()
    for scope in SCOPES:
        headers[f"{OWNER}:{scope}"] = make_key(scope, tenant=OWNER)
        headers[f"{OTHER}:{scope}"] = make_key(scope)
    return headers


@pytest.fixture(scope="module")
def objects(service: TestClient, callers: dict[str, dict[str, str]]) -> Objects:
    """The owner's job (succeeded), graph, cluster, profile and checkpoint."""
    admin = callers[f"{OWNER}:admin"]
    found: Objects = {}
    for name, (method, path, request) in OWNERS_OBJECTS.items():
        response = service.request(method, path, headers=admin, **request(found))
        assert response.status_code in (201, 202), response.text
        found[name] = response.json()["id"]
    assert wait_for(service, admin, found["job"])["status"] == "succeeded"
    found["fingerprint"] = service.get(f"/v1/graphs/{found['graph']}", headers=admin).json()[
        "fingerprint"
    ]
    return found


@pytest.fixture(scope="module", autouse=True)
def registry_cleared(service: TestClient) -> Iterator[None]:
    """The matrix activates the owner's checkpoint, bytes no worker loads: the registry is
    cleared afterwards, so the jobs of later tests search with the shipped checkpoint."""
    yield
    service.delete("/v1/checkpoints/active", headers=make_key("operate"))


def test_every_route_is_in_the_matrix(service: TestClient) -> None:
    """A new route must be added to the matrix with its scope and tenancy."""
    routes = {
        (method, route.path)
        for route in iter_route_contexts(service.app.routes)
        for method in route.methods or ()
        if method not in ("HEAD", "OPTIONS")
    }
    assert routes == set(MATRIX), {"not in the matrix": routes - set(MATRIX)}
    documented = service.get("/v1/openapi.json").json()["paths"]
    assert {(m.upper(), p) for p, ops in documented.items() for m in ops} <= routes


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize(("method", "path"), list(MATRIX), ids=[f"{m} {p}" for m, p in MATRIX])
def test_authorization(
    service: TestClient,
    callers: dict[str, dict[str, str]],
    objects: Objects,
    method: str,
    path: str,
    caller: str,
) -> None:
    endpoint = MATRIX[method, path]
    url = path.format(**{f"{name}_id": value for name, value in objects.items()})
    response = service.request(method, url, headers=callers[caller], **endpoint.request(objects))
    want = expected(endpoint, caller)
    assert response.status_code in want, (want, response.text)
    if want == {401}:
        assert_problem(response, 401, "API key")
    elif want == {403}:
        assert_problem(response, 403, "scope")
    elif want == {404}:
        assert_problem(response, 404, "does not exist")
    elif endpoint.lists is not None:
        rows = response.json()
        rows = rows["data"] if isinstance(rows, dict) else rows
        key = "job_id" if path == "/v1/strategies" else "id"
        assert (objects[endpoint.lists] in {row[key] for row in rows}) == _sees_owners_rows(caller)
