"""Probes and metrics: ``/healthz`` (up), ``/readyz`` (database and broker), ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from tagplan.db.session import engine_for
from tagplan.service.deps import OperateKey

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


def _database(url: str) -> str | None:
    try:
        with engine_for(url).connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        return f"database unreachable: {type(exc).__name__}: {exc}"
    return None


def _broker(request: Request) -> str | None:
    embedded = request.app.state.embedded_worker
    if embedded is not None:
        return None if embedded.alive else "the in-process worker has stopped"
    try:
        with request.app.state.celery.connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:
        return f"broker unreachable: {type(exc).__name__}: {exc}"
    return None


@router.get("/readyz")
def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 when the database and the broker (or embedded worker) answer, else 503."""
    problems = [
        p for p in (_database(request.app.state.settings.sqlalchemy_url), _broker(request)) if p
    ]
    body: dict[str, Any] = {"status": "ok" if not problems else "unavailable", "problems": problems}
    return JSONResponse(body, status_code=200 if not problems else 503)


@router.get("/metrics", response_class=Response)
def metrics(request: Request, _: OperateKey) -> Response:
    """Prometheus exposition: jobs by status, queue depth, plan latency, cache hits (of
    every tenant: operators only)."""
    return Response(
        generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST
    )
