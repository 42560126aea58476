"""``/v1/jobs``: submit, list, inspect, cancel, and fetch results of planning jobs."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy import func, select

from tagplan.db import job_state
from tagplan.db.blobs import get_blob
from tagplan.db.models import Job, JobStatus, Result
from tagplan.planner.report import report_markdown
from tagplan.service.auth import Principal
from tagplan.service.deps import ReadKey, SessionDep, SettingsDep, SubmitKey
from tagplan.service.job_intake import find_job, job_names, job_public, submit
from tagplan.service.problems import Problem
from tagplan.service.schemas import (
    INT32_MAX,
    JobCreate,
    JobPublic,
    JobsPublic,
    ResultPublic,
    Status,
)
from tagplan.service.tenancy import job_filter
from tagplan.service.timeline import Timeline

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

MAX_WAIT_S = 30.0
"""The longest ``GET /v1/jobs/{id}?wait_s=`` holds a request (and a worker thread)."""
WAIT_POLL_S = 0.05
"""How often a waiting request reads the job's status."""

_SUBMIT_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": JobPublic, "description": "An identical job exists; it is returned."},
}


@router.post("", status_code=202, response_model=JobPublic, responses=_SUBMIT_RESPONSES)
def create_job(
    body: JobCreate,
    request: Request,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    caller: SubmitKey,
) -> JobPublic:
    """Plan a graph on a cluster: 202 with the job and its status URL."""
    job, existing = submit(session, settings, request.app.state.celery, body, caller=caller)
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    if existing:
        response.status_code = 200
        request.app.state.metrics.cache_hits.labels("job").inc()
    return job_public(job, existing=existing)


@router.get("", response_model=JobsPublic)
def list_jobs(
    session: SessionDep,
    caller: ReadKey,
    status: Status | None = None,
    limit: int = Query(default=50, ge=1, le=500),
    offset: int = Query(default=0, ge=0, le=INT32_MAX),
) -> JobsPublic:
    """The tenant's jobs (every tenant's for operators), newest first, optionally with one
    status."""
    where = job_filter(caller) + ([Job.status == status] if status else [])
    count = session.scalar(select(func.count()).select_from(Job).where(*where)) or 0
    rows = list(
        session.scalars(
            select(Job).where(*where).order_by(Job.created_at.desc()).limit(limit).offset(offset)
        )
    )
    names = job_names(session, rows)
    data = [job_public(j, names=names) for j in rows]
    return JobsPublic(data=data, count=count, limit=limit, offset=offset)


@router.get("/{job_id}", response_model=JobPublic)
def get_job(
    job_id: str,
    session: SessionDep,
    caller: ReadKey,
    wait_s: float = Query(
        default=0.0,
        ge=0,
        le=MAX_WAIT_S,
        description="wait up to this long for the job to finish before answering (a "
        "scheduler waiting on its answer learns of it at once, with one request)",
    ),
) -> JobPublic:
    """Status, phase, progress (iterations, best speedup so far), timestamps, error."""
    job = find_job(session, caller, job_id)
    deadline = time.monotonic() + wait_s
    while not JobStatus(job.status).finished and time.monotonic() < deadline:
        time.sleep(min(WAIT_POLL_S, max(deadline - time.monotonic(), 0.0)))
        session.refresh(job)
    return job_public(job, names=job_names(session, [job]))


@router.get("/{job_id}/progress")
def get_progress(job_id: str, session: SessionDep, caller: ReadKey) -> dict[str, Any]:
    """The search's progress for a chart: the best step over time, and what it is measured
    against (every baseline's step, None when it does not fit; the lower bound), known
    once the job's analysis has run."""
    job = find_job(session, caller, job_id)
    references = job_state.step_output(session, job_id=job_id, step="references")
    result = session.get(Result, job_id)
    if references is None and result is not None:
        references = {
            "baselines": result.summary.get("baselines", {}),
            "lower_bound_s": result.summary.get("lower_bound_s"),
        }
    return {
        "status": job.status,
        "phase": job.phase,
        "iterations": job.iterations,
        "best_step_time_s": job.best_step_time_s,
        "history": job.history or [],
        "baselines": (references or {}).get("baselines", {}),
        "lower_bound_s": (references or {}).get("lower_bound_s"),
        "step_time_s": result.step_time_s if result is not None else None,
    }


@router.delete("/{job_id}", response_model=JobPublic)
def cancel_job(job_id: str, session: SessionDep, caller: SubmitKey) -> JobPublic:
    """Cancel a queued or running job (its worker stops at the next progress check)."""
    job = find_job(session, caller, job_id)
    if not job_state.cancel_job(session, job_id=job_id):
        raise Problem(409, f"job {job_id} already {job.status}; nothing to cancel")
    session.refresh(job)
    return job_public(job)


def _result(session: SessionDep, caller: Principal, job_id: str) -> Result:
    job = find_job(session, caller, job_id)
    result = session.get(Result, job_id)
    if result is None:
        detail = f"job {job_id} is {job.status}" + (f": {job.error}" if job.error else "")
        status = 409 if job.status != JobStatus.SUCCEEDED else 404
        raise Problem(status, detail + "; the result exists once it has succeeded")
    return result


@router.get("/{job_id}/result", response_model=ResultPublic)
def get_result(job_id: str, session: SessionDep, caller: ReadKey) -> ResultPublic:
    """Strategy, predicted step time, every baseline, lower bound, memory per GPU, which
    numbers were estimated, and where the time went: ``plan_time_s`` from the job's start
    to its result across every worker, per-phase ``phases``, ``queued_s`` before it
    started."""
    result = _result(session, caller, job_id)
    job = session.get(Job, job_id)
    queued = job.started_at - job.created_at if job and job.started_at else None
    return ResultPublic(
        **result.summary,
        job_id=job_id,
        graph_fingerprint=result.graph_fingerprint,
        cluster_fingerprint=result.cluster_fingerprint,
        batch_size=result.batch_size,
        queued_s=queued.total_seconds() if queued is not None else None,
        complete=result.complete,
    )


@router.get(
    "/{job_id}/graphdef",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
def get_graphdef(job_id: str, session: SessionDep, caller: ReadKey) -> Response:
    """The placed distributed GraphDef (binary protobuf)."""
    result = _compiled_result(session, caller, job_id)
    return Response(
        get_blob(session, result.graphdef_digest),
        media_type="application/octet-stream",
        headers={"Content-Disposition": f'attachment; filename="{job_id}.pb"'},
    )


@router.get("/{job_id}/device-map")
def get_device_map(job_id: str, session: SessionDep, caller: ReadKey) -> dict[str, Any]:
    """TensorFlow task index -> machine name and GPU ids of the compiled GraphDef."""
    return _compiled_result(session, caller, job_id).device_map


def _compiled_result(session: SessionDep, caller: Principal, job_id: str) -> Result:
    """The job's result once its GraphDef exists: 409 with ``Retry-After`` while the
    GraphDef of a plan whose budget left its compile out is being compiled after the
    answer, 404 for a plan stored without one (with the reason when that compile failed)."""
    result = _result(session, caller, job_id)
    failed = result.graphdef_digest is None and result.summary.get("graphdef_error")
    if failed:
        raise Problem(
            404,
            f"job {job_id} has no compiled GraphDef: its compile after the answer failed: {failed}",
        )
    if result.graphdef_digest is None and result.summary.get("graphdef_deferred"):
        pending = Problem(
            409,
            f"the distributed GraphDef of job {job_id} did not fit in its budget and is "
            "being compiled after the answer; retry in a few seconds",
        )
        pending.headers["Retry-After"] = "5"
        raise pending
    if result.graphdef_digest is None or result.device_map is None:
        raise Problem(404, f"job {job_id} has no compiled GraphDef")
    return result


@router.get("/{job_id}/trace", response_class=Response)
def get_trace(job_id: str, session: SessionDep, caller: ReadKey) -> Response:
    """The predicted step as a Chrome trace (JSON; opens in Perfetto)."""
    result = _traced_result(session, caller, job_id)
    return Response(get_blob(session, result.trace_digest), media_type="application/json")


def _traced_result(session: SessionDep, caller: Principal, job_id: str) -> Result:
    """The job's result once its trace exists: 409 with ``Retry-After`` while a cache
    answer's trace is being written, 404 for a plan stored without one."""
    result = _result(session, caller, job_id)
    if result.trace_digest is None and result.source == "cache":
        pending = Problem(
            409,
            f"the trace of job {job_id} (answered from the cache) is being written; "
            "retry in a few seconds",
        )
        pending.headers["Retry-After"] = "2"
        raise pending
    if result.trace_digest is None:
        raise Problem(404, f"job {job_id} has no trace")
    return result


@router.get("/{job_id}/timeline")
def get_timeline(
    job_id: str,
    request: Request,
    session: SessionDep,
    caller: ReadKey,
    start_s: float | None = Query(default=None, ge=0, le=1e9),
    end_s: float | None = Query(default=None, ge=0, le=1e9),
    bins: int = Query(default=800, ge=10, le=4000),
) -> dict[str, Any]:
    """The predicted step per GPU and link, windowed and aggregated for drawing: tasks one
    by one where few, busy runs where many (:mod:`tagplan.service.timeline`)."""
    result = _traced_result(session, caller, job_id)
    lanes, trace = result.lanes_digest, result.trace_digest

    def load() -> Timeline:
        if lanes is not None:
            return Timeline.from_lanes(get_blob(session, lanes))
        return Timeline.from_trace_json(get_blob(session, trace))  # stored before lanes were

    return request.app.state.timelines.get(lanes or trace, load).window(start_s, end_s, bins)


@router.get("/{job_id}/report", response_class=Response)
def get_report(job_id: str, session: SessionDep, caller: ReadKey) -> Response:
    """The plan as Markdown: tagplan against every baseline and the lower bound, memory and
    busy share per GPU."""
    result = _result(session, caller, job_id)
    text = report_markdown(result.summary, f"tagplan plan: job {job_id}")
    return Response(text, media_type="text/markdown; charset=utf-8")
