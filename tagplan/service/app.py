"""The FastAPI application (docs/design.md §9).

:func:`create_app` wires settings, auth state, metrics, error handlers, the request-size
limits and the routers. Embedded (no broker configured) it also migrates the SQLite
database and runs the Celery worker in-process for the app's lifetime; either way it runs
the sweeper that recovers jobs the broker lost. This module and everything it imports load
neither TensorFlow nor torch.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from tagplan.db.migrate import upgrade
from tagplan.service.api.routes import (
    catalog,
    checkpoints,
    graphs,
    health,
    jobs,
    overview,
    profiles,
    strategies,
)
from tagplan.service.auth import KeyCache
from tagplan.service.dashboard import mount_dashboard
from tagplan.service.limits import RequestSizeLimit
from tagplan.service.memo import TtlCache
from tagplan.service.metrics import ServiceMetrics
from tagplan.service.problems import install_problem_handlers
from tagplan.service.rate_limit import rate_limiter_for
from tagplan.service.timeline import TimelineCache
from tagplan.settings import Settings, get_settings
from tagplan.workers.app import app as celery_app
from tagplan.workers.embedded import EmbeddedWorker, requeue_unfinished
from tagplan.workers.sweeper import Sweeper

__all__ = ["create_app"]

log = logging.getLogger(__name__)

DESCRIPTION = """Deployment planning for distributed training on heterogeneous GPU allocations.

Submit a training graph and the GPUs a job was given (`POST /v1/jobs`), poll the job, then
fetch the strategy, the placed distributed GraphDef, its device map and a Chrome trace.
Errors are `application/problem+json`. Every endpoint but `/healthz` and `/readyz` needs an
API key (`Authorization: Bearer <key>`) with the scope it names: submit, read, operate, admin.
"""


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    if settings.embedded:
        upgrade(settings.sqlalchemy_url)
        worker = EmbeddedWorker(celery_app)
        worker.start()
        app.state.embedded_worker = worker
        resumed = requeue_unfinished(settings, celery_app)
        if resumed:
            log.info("resumed %d unfinished jobs and GraphDef steps", resumed)
    sweeper = Sweeper(settings, celery_app)  # recovers jobs the broker lost
    sweeper.start()
    # Everything loaded so far lives as long as the process: keep the garbage collector
    # from walking it on every full collection (a pause of 100+ ms on the hot path).
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        sweeper.stop()
        if app.state.embedded_worker is not None:
            app.state.embedded_worker.stop()


def create_app(settings: Settings | None = None) -> FastAPI:
    """A new app for ``settings`` (default: :func:`get_settings`)."""
    settings = settings or get_settings()
    app = FastAPI(
        title="tagplan",
        version="1",
        description=DESCRIPTION,
        lifespan=_lifespan,
        openapi_url="/v1/openapi.json",
        docs_url="/docs",
    )
    app.state.settings = settings
    app.state.celery = celery_app
    app.state.embedded_worker = None
    app.state.key_cache = KeyCache()
    app.state.rate_limiter = rate_limiter_for(settings)
    app.state.metrics = ServiceMetrics(settings.sqlalchemy_url)
    app.state.strategy_cache = TtlCache(settings.strategy_cache_ttl_s)
    app.state.timelines = TimelineCache()
    install_problem_handlers(app)
    app.add_middleware(
        RequestSizeLimit,
        max_bytes=settings.max_request_bytes,
        max_header_bytes=settings.max_header_bytes,
    )
    for module in (jobs, graphs, strategies, profiles, checkpoints, catalog, health, overview):
        app.include_router(module.router)
    mount_dashboard(app)
    return app
