"""A small client for schedulers: submit a graph and an allocation, wait, fetch the plan.

Depends only on httpx (and PyYAML for cluster files)::

    from tagplan.service.client import TagplanClient

    client = TagplanClient("http://planner:8000", api_key="tpk_...")
    job = client.submit("zoo:vgg19", cluster="testbed", options={"budget_s": 30})
    job = client.wait(job["id"])
    result = client.result(job["id"])            # strategy, step time, baselines, memory
    graph_def_bytes = client.graphdef(job["id"])  # the placed distributed GraphDef
"""

from __future__ import annotations

import base64
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

__all__ = ["FINISHED", "ServiceUnreachable", "TagplanClient", "TagplanError"]

FINISHED = frozenset({"succeeded", "failed", "cancelled"})
INLINE_LIMIT_BYTES = 8 << 20
"""Graphs up to this size travel inline (base64); larger ones are uploaded first."""


class TagplanError(Exception):
    """An error answer: ``status`` and the problem document (``detail`` says what is wrong);
    status 0 when no answer came; ``retry_after_s`` when the service said when to retry."""

    def __init__(
        self, status: int, problem: dict[str, Any], retry_after_s: float | None = None
    ) -> None:
        prefix = f"{status}: " if status else ""
        super().__init__(f"{prefix}{problem.get('detail') or problem.get('title')}")
        self.status = status
        self.problem = problem
        self.retry_after_s = retry_after_s


class ServiceUnreachable(TagplanError):
    """No answer: nothing listens at the URL, the connection broke, or it timed out."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(0, {"detail": f"cannot reach the tagplan service at {url}: {reason}"})
        self.url = url


_HINTS = {
    401: "give a key with --api-key or TAGPLAN_API_KEY (tagplan keys create)",
    403: "the key lacks the scope this call needs (tagplan keys create --scope ...)",
}


class TagplanClient:
    """Calls the tagplan REST API with one API key."""

    def __init__(self, base_url: str, api_key: str | None = None, *, timeout_s: float = 60.0):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url, self.timeout_s = base_url.rstrip("/"), timeout_s
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> TagplanClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request; every failure is a :class:`TagplanError` saying what went wrong."""
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise ServiceUnreachable(
                self.base_url, f"no answer within {self.timeout_s:g} s"
            ) from None
        except httpx.TransportError as exc:
            reason = str(exc) or type(exc).__name__
            raise ServiceUnreachable(
                self.base_url, f"{reason} (is it running? tagplan serve starts one)"
            ) from None
        if response.status_code >= 400:
            try:
                problem = response.json()
            except ValueError:
                problem = {"detail": response.text[:200] or response.reason_phrase}
            if not isinstance(problem, dict):
                problem = {"detail": str(problem)[:200]}
            hint = _HINTS.get(response.status_code)
            if hint:
                problem = {**problem, "detail": f"{problem.get('detail')}; {hint}"}
            retry = response.headers.get("Retry-After", "")
            retry_after_s = float(retry) if retry.isdigit() else None
            raise TagplanError(response.status_code, problem, retry_after_s)
        return response

    def upload_graph(self, data: bytes, *, label: str = "") -> dict[str, Any]:
        """Store a graph (binary body) and return its id and fingerprint."""
        return self._call("POST", "/v1/graphs", content=data, params={"label": label}).json()

    def _graph_input(self, graph: str | bytes) -> dict[str, Any]:
        if isinstance(graph, str) and graph.startswith("zoo:"):
            return {"zoo": graph[4:]}
        data = Path(graph).read_bytes() if isinstance(graph, str) else graph
        if len(data) > INLINE_LIMIT_BYTES:
            return {"id": self.upload_graph(data)["id"]}
        return {"base64": base64.b64encode(data).decode()}

    @staticmethod
    def _cluster_input(cluster: str | dict[str, Any]) -> str | dict[str, Any]:
        if isinstance(cluster, str) and Path(cluster).suffix.lower() in (".yaml", ".yml", ".json"):
            return yaml.safe_load(Path(cluster).read_text(encoding="utf-8"))
        return cluster

    def submit(
        self,
        graph: str | bytes,
        *,
        cluster: str | dict[str, Any],
        batch_size: int | None = None,
        options: dict[str, Any] | None = None,
        batch_inputs: list[str] | None = None,
        loss: str | None = None,
    ) -> dict[str, Any]:
        """Submit a job: ``graph`` is ``zoo:NAME``, a file path or bytes; ``cluster`` a name,
        a ``.yaml``/``.json`` file or a spec mapping. Returns the job (``existing`` is true
        when an identical job was submitted before)."""
        graph_input = self._graph_input(graph)
        if batch_inputs:
            graph_input["batch_inputs"] = batch_inputs
        if loss:
            graph_input["loss"] = loss
        body: dict[str, Any] = {
            "graph": graph_input,
            "cluster": self._cluster_input(cluster),
            "options": options or {},
        }
        if batch_size is not None:
            body["batch_size"] = batch_size
        return self._call("POST", "/v1/jobs", json=body).json()

    def job(self, job_id: str, *, wait_s: float = 0.0) -> dict[str, Any]:
        """The job; with ``wait_s``, once it has finished or after that long."""
        params = {"wait_s": wait_s} if wait_s > 0 else None
        return self._call("GET", f"/v1/jobs/{job_id}", params=params).json()

    def jobs(self, *, status: str | None = None, limit: int = 50, offset: int = 0) -> dict:
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        if status:
            params["status"] = status
        return self._call("GET", "/v1/jobs", params=params).json()

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/jobs/{job_id}").json()

    def wait(self, job_id: str, *, timeout_s: float = 3600.0, wait_s: float = 20.0) -> dict:
        """Wait until the job finishes; TimeoutError after ``timeout_s``. Each request
        waits on the server up to ``wait_s`` (``GET /v1/jobs/{id}?wait_s=``), so the
        answer is seen as soon as it exists, with one request per ``wait_s`` meanwhile."""
        deadline = time.monotonic() + timeout_s
        while True:
            left_s = max(deadline - time.monotonic(), 0.0)
            job = self.job(job_id, wait_s=min(wait_s, left_s))
            if job["status"] in FINISHED:
                return job
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} still {job['status']} after {timeout_s} s")

    def result(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}/result").json()

    def _artifact(self, path: str, timeout_s: float) -> httpx.Response:
        """A job's artifact, waiting while the service answers 409 with ``Retry-After``
        (one written after the answer: a cache answer's trace, a GraphDef whose compile
        did not fit in the budget), up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._call("GET", path)
            except TagplanError as exc:
                retry_s = exc.retry_after_s or 0.0
                if exc.status != 409 or not retry_s or time.monotonic() + retry_s > deadline:
                    raise
                time.sleep(retry_s)

    def graphdef(self, job_id: str, *, timeout_s: float = 600.0) -> bytes:
        return self._artifact(f"/v1/jobs/{job_id}/graphdef", timeout_s).content

    def device_map(self, job_id: str, *, timeout_s: float = 600.0) -> dict[str, Any]:
        return self._artifact(f"/v1/jobs/{job_id}/device-map", timeout_s).json()

    def trace(self, job_id: str, *, timeout_s: float = 60.0) -> dict[str, Any]:
        return self._artifact(f"/v1/jobs/{job_id}/trace", timeout_s).json()

    def strategies(self, *, graph: str, cluster: str, batch_size: int | None = None) -> dict:
        """Cached strategies (``cluster``: fingerprint, stored cluster id or name)."""
        params: dict[str, Any] = {"graph": graph, "cluster": cluster}
        if batch_size is not None:
            params["batch_size"] = batch_size
        return self._call("GET", "/v1/strategies", params=params).json()
