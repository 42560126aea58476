"""Submitting jobs: resolve inputs, deduplicate identical content, enqueue; and views.

The routes in :mod:`tagplan.service.api.routes.jobs` stay HTTP-only (status codes,
headers); what a submission means lives here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from celery import Celery
from sqlalchemy import select
from sqlalchemy.orm import Session

from tagplan.db.job_state import add_job
from tagplan.db.models import ApiKey, ClusterRow, GraphRow, Job, JobStatus, Profile
from tagplan.service.auth import Principal
from tagplan.service.intake import cluster_from_input, store_cluster, store_graph, zoo_graph
from tagplan.service.problems import Problem
from tagplan.service.registry import new_job_prior
from tagplan.service.schemas import JobCreate, JobLinks, JobPublic, Progress
from tagplan.service.tenancy import hold, holds, owns_job
from tagplan.settings import Settings
from tagplan.workers.pipeline import enqueue_job

__all__ = ["JobNames", "find_job", "job_names", "job_public", "submit"]


@dataclass(frozen=True)
class JobNames:
    """Names a job view shows: of the keys that submitted jobs and of their graphs."""

    keys: dict[str, str]
    graphs: dict[str, str]


def job_names(session: Session, jobs: list[Job]) -> JobNames:
    """The key and graph names of ``jobs`` (two queries for a whole page)."""
    key_ids = {job.api_key_id for job in jobs if job.api_key_id}
    graph_ids = {job.graph_id for job in jobs}
    keys = session.execute(select(ApiKey.id, ApiKey.name).where(ApiKey.id.in_(key_ids)))
    graphs = session.execute(select(GraphRow.id, GraphRow.label).where(GraphRow.id.in_(graph_ids)))
    return JobNames(dict(keys.all()) if key_ids else {}, dict(graphs.all()))


def job_public(job: Job, *, existing: bool = False, names: JobNames | None = None) -> JobPublic:
    """The public view of a job row; ``names`` (:func:`job_names`) adds its key's and its
    graph's names."""
    base = f"/v1/jobs/{job.id}"
    return JobPublic(
        id=job.id,
        status=job.status,
        phase=job.phase,
        progress=Progress(
            iterations=job.iterations,
            best_speedup=job.best_speedup,
            best_step_time_s=job.best_step_time_s,
            history=job.history or [],
        ),
        graph_id=job.graph_id,
        cluster_id=job.cluster_id,
        batch_size=job.batch_size,
        options=job.options,
        error=job.error,
        dispatches=job.dispatches,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        links=JobLinks(
            self=base,
            result=f"{base}/result",
            graphdef=f"{base}/graphdef",
            device_map=f"{base}/device-map",
            trace=f"{base}/trace",
        ),
        existing=existing,
        submitted_by=names.keys.get(job.api_key_id or "") if names else None,
        label=names.graphs.get(job.graph_id) or None if names else None,
        refines=job.refines,
        refined_by=job.refined_by,
    )


def find_job(session: Session, caller: Principal, job_id: str) -> Job:
    """The job; a 404 problem when it does not exist or belongs to another tenant."""
    job = session.get(Job, job_id)
    if job is None or not owns_job(caller, job):
        raise Problem(404, f"job {job_id} does not exist")
    return job


def _graph(
    session: Session, settings: Settings, caller: Principal, body: JobCreate
) -> tuple[GraphRow, Any, Any]:
    """The graph row plus the batch inputs and loss node the job uses."""
    spec = body.graph
    batch_inputs, loss = spec.batch_inputs, spec.loss
    if spec.id is not None:
        row = session.get(GraphRow, spec.id)
        if row is None or not holds(session, caller, "graph", spec.id):
            raise Problem(404, f"graph {spec.id} does not exist; upload it with POST /v1/graphs")
        hold(session, caller.tenant, "graph", row.id, row.label)
        return row, batch_inputs, loss
    if spec.zoo is not None:
        data, zoo_inputs, zoo_loss = zoo_graph(spec.zoo)
        row, _ = store_graph(session, settings, data, tenant=caller.tenant, label=f"zoo:{spec.zoo}")
        return row, batch_inputs or zoo_inputs, loss or zoo_loss
    try:
        data = base64_bytes(spec.base64 or "")
    except ValueError as exc:
        raise Problem(422, f"graph.base64 is not valid base64: {exc}") from None
    return store_graph(session, settings, data, tenant=caller.tenant)[0], batch_inputs, loss


def base64_bytes(text: str) -> bytes:
    """Strict base64 decoding (whitespace allowed)."""
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except binascii.Error as exc:
        raise ValueError(str(exc)) from None


def _cluster(
    session: Session, settings: Settings, caller: Principal, value: str | dict[str, Any]
) -> ClusterRow:
    """A stored cluster the caller holds (by id), else a named or inline one stored now."""
    if isinstance(value, str) and holds(session, caller, "cluster", value):
        stored = session.get(ClusterRow, value)
        if stored is not None:
            hold(session, caller.tenant, "cluster", stored.id)
            return stored
    return store_cluster(session, cluster_from_input(settings, value), tenant=caller.tenant)


def _check_profiles(session: Session, caller: Principal, ids: list[str]) -> None:
    kinds = dict(session.execute(select(Profile.id, Profile.kind).where(Profile.id.in_(ids))).all())
    kinds = {i: kind for i, kind in kinds.items() if holds(session, caller, "profile", i)}
    missing = [i for i in ids if i not in kinds]
    if missing:
        raise Problem(404, f"profiles {missing} do not exist; upload them with POST /v1/profiles")
    if sum(kind == "comm" for kind in kinds.values()) > 1:
        raise Problem(422, "options.profiles may name at most one communication profile")


def _check_options(settings: Settings, options: dict[str, Any]) -> None:
    for name in ("budget_s", "refine_s"):
        if (options[name] or 0) > settings.max_budget_s:
            raise Problem(
                422, f"options.{name} is {options[name]}; the limit is {settings.max_budget_s}"
            )
    if options["refine_s"] is not None and options["deadline_s"] is None:
        raise Problem(422, "options.refine_s goes with options.deadline_s (an anytime job)")
    if options["shards"] > settings.max_shards:
        raise Problem(
            422, f"options.shards is {options['shards']}; the limit is {settings.max_shards}"
        )


def submit(
    session: Session, settings: Settings, celery: Celery, body: JobCreate, *, caller: Principal
) -> tuple[Job, bool]:
    """Store the inputs and enqueue a job of the caller's tenant; an identical live job of
    that tenant is returned instead.

    Returns the job and whether it existed. Identical means same graph content, batch
    inputs, loss, cluster spec, batch size and options, the prior the job's search is to
    use included (``options["prior"]``: the active checkpoint now, :mod:`.registry`);
    failed and cancelled jobs do not count, so resubmitting retries them.
    """
    graph, batch_inputs, loss = _graph(session, settings, caller, body)
    cluster = _cluster(session, settings, caller, body.cluster)
    options = body.options.model_dump()
    _check_options(settings, options)
    _check_profiles(session, caller, options["profiles"])
    options["prior"] = new_job_prior(session)
    identity = [graph.fingerprint, batch_inputs, loss, cluster.id, body.batch_size, options]
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
    job = Job(
        id=str(uuid.uuid4()),
        key=key,
        graph_id=graph.id,
        cluster_id=cluster.id,
        batch_size=body.batch_size,
        batch_inputs=batch_inputs,
        loss=loss,
        options=options,
        status=JobStatus.QUEUED,
        api_key_id=caller.key_id,
        tenant=caller.tenant,
    )
    job, existed = add_job(session, job)
    session.commit()
    if existed:
        return job, True
    try:
        enqueue_job(celery, job.id, options, margin_s=settings.time_limit_margin_s)
    except Exception as exc:  # broker down: the job must not stay queued forever
        job.status, job.error = JobStatus.FAILED, f"could not enqueue: {exc}"
        session.commit()
        raise Problem(503, f"the job queue is unavailable: {exc}") from None
    return job, False
