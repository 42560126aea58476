"""Property-based fuzzing of every operation of the API from its OpenAPI document, and the
server errors it found.

Schemathesis generates requests from the document, both valid ones and ones that break
it (wrong types, missing fields, out-of-range numbers, odd bodies and media types); each
is sent with an admin key to the service on PostgreSQL. None may be answered 5xx, nor
raise in the app (the test client re-raises). Derandomized: the same requests every run.
The same fuzzing, fewer requests, goes over HTTP to a live stack (``tagplan serve`` and a
worker on PostgreSQL and Redis): the production server, broker and rate limiter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from tagplan.db.keys import create_key
from tagplan.db.session import session_scope
from tagplan.service.app import create_app
from tests.backends import reset_redis
from tests.service.conftest import LIMITS, assert_problem, make_key
from tests.service.test_catalog_profiles import PROFILE
from tests.workers.conftest import Stack, running_stack

EXAMPLES = 150
"""Requests per operation, valid and invalid mixed, each with an operator's or a submitter's
key (they look rows up differently), over every operation of the document (fewer than 150
where it allows fewer distinct requests, as for the probes)."""

LIVE_EXAMPLES = 100
"""Requests per operation against the live stack, valid and invalid mixed."""

SCOPES = ("admin", "submit")
"""An operator's and a submitter's key: they look rows up differently."""

OPERATIONS = [
    f"{method.upper()} {path}"
    for path, methods in create_app().openapi()["paths"].items()
    for method in methods
]


@pytest.fixture(scope="module")
def api_schema(service: TestClient) -> Any:
    """The live OpenAPI document, as schemathesis reads it."""
    return schemathesis.openapi.from_dict(service.get("/v1/openapi.json").json())


def _request_kwargs(
    case: Any, headers: dict[str, str], base_url: str = "http://testserver"
) -> dict[str, Any]:
    """The generated request, encoded as schemathesis sends it (URL, headers, body), as the
    arguments of an httpx client (the test client is one), with ``headers`` added."""
    prepared = requests.Request(**case.as_transport_kwargs(base_url=base_url)).prepare()
    return {
        "method": prepared.method,
        "url": prepared.url,
        "headers": {**prepared.headers, **headers},
        "content": prepared.body,
    }


def _fuzz(
    api_schema: Any,
    operation: str,
    keys: list[dict[str, str]],
    send: Callable[..., httpx.Response],
    examples: int,
    base_url: str = "http://testserver",
) -> None:
    """Send up to ``examples`` requests generated for ``operation`` (valid and invalid) with
    ``send`` (an httpx-style ``request``), each with one of ``keys``; none may be a 5xx."""
    found = api_schema.find_operation_by_label(operation)
    assert found is not None, f"{operation} is not in the live document"

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        case=st.one_of(found.as_strategy(generation_mode=mode) for mode in GenerationMode),
        headers=st.sampled_from(keys),
    )
    def check(case: Any, headers: dict[str, str]) -> None:
        kwargs = _request_kwargs(case, headers, base_url)
        response = send(**kwargs)
        assert response.status_code < 500, (kwargs, response.text)

    check()


@pytest.mark.parametrize("operation", OPERATIONS)
def test_no_request_is_a_server_error(service: TestClient, api_schema: Any, operation: str) -> None:
    keys = [make_key(scope, rate_limit=10**6) for scope in SCOPES]
    _fuzz(api_schema, operation, keys, service.request, EXAMPLES)


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """``tagplan serve`` and one worker on PostgreSQL and Redis, with the embedded
    service's limits."""
    logs = tmp_path_factory.mktemp("fuzz-stack")
    with running_stack(logs, reset_redis(), workers=1, **LIMITS) as stack:
        yield stack


@pytest.mark.slow
@pytest.mark.parametrize("operation", OPERATIONS)
def test_no_request_to_the_live_stack_is_a_server_error(live_stack: Stack, operation: str) -> None:
    """The generated requests over HTTP to the production server (``LIVE_EXAMPLES`` per
    operation): what the in-process client hides (the server's own parsing of odd URLs,
    headers and bodies, the Redis rate limiter and broker) is in the path too."""
    with session_scope(live_stack.database_url) as session:
        tokens = [create_key(session, scopes=[scope], rate_limit=10**6)[1] for scope in SCOPES]
    keys = [{"Authorization": f"Bearer {token}"} for token in tokens]
    api_schema = schemathesis.openapi.from_url(f"{live_stack.url}/v1/openapi.json")
    with httpx.Client(timeout=60) as client:
        _fuzz(api_schema, operation, keys, client.request, LIVE_EXAMPLES, live_stack.url)


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("GET", "/v1/jobs/%00"),
        ("DELETE", "/v1/jobs/a%00b"),
        ("GET", "/v1/graphs/%00"),
        ("GET", "/v1/strategies?graph=%00&cluster=testbed"),
        ("POST", "/v1/graphs?label=%00"),
    ],
)
def test_nul_in_the_url_is_400(service: TestClient, method: str, url: str) -> None:
    """PostgreSQL refuses NUL in text: the lookup failed with a 500."""
    response = service.request(method, url, headers=make_key("submit"), content=b"x")
    assert_problem(response, 400, "NUL")


@pytest.mark.parametrize(
    "graph",
    [{"id": "\x00"}, {"zoo": "mlp", "loss": "a\x00"}, {"zoo": "mlp", "batch_inputs": ["\x00"]}],
)
def test_nul_in_a_body_name_is_422(service: TestClient, graph: dict[str, Any]) -> None:
    """Found by the fuzzing: a graph id or loss node with NUL reached the database (500)."""
    body = {"graph": graph, "cluster": "testbed", "options": {"budget_s": 1}}
    response = service.post("/v1/jobs", json=body, headers=make_key("submit"))
    assert_problem(response, 422, "NUL")


def test_a_problem_quoting_a_lone_surrogate_is_rendered(service: TestClient) -> None:
    """The detail quotes a lone surrogate of the input: it failed to encode as UTF-8 (500)."""
    machine = '{"name": "\\ud800", "gpus": {"type": "T4", "count": 1}, "intra_bandwidth_gbps": 9}'
    headers = {**make_key("submit"), "Content-Type": "application/json"}
    body = f'{{"machines": [{machine}]}}'.encode()
    response = service.post("/v1/clusters", content=body, headers=headers)
    assert_problem(response, 422, "\\ud800")


def test_a_profile_with_a_lone_surrogate_is_422(service: TestClient) -> None:
    """It was stored, and its entry in the answer failed to encode as UTF-8 (500)."""
    text = PROFILE.read_text().replace('"zoo:vgg19"', '"\\ud800"', 1)
    headers = {**make_key("operate"), "Content-Type": "application/json"}
    response = service.post("/v1/profiles", content=text.encode(), headers=headers)
    assert_problem(response, 422, "not valid Unicode")
