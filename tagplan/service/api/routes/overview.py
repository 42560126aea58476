"""``/v1/overview``: what the dashboard shows first — who the caller is and what it may
do, its jobs by status and the queue."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy import func, select

from tagplan.db.models import Job, JobStatus
from tagplan.service.deps import ReadKey, SessionDep
from tagplan.service.tenancy import job_filter

router = APIRouter(prefix="/v1/overview", tags=["overview"])


@router.get("")
def get_overview(request: Request, session: SessionDep, caller: ReadKey) -> dict[str, Any]:
    """The caller's tenant and scopes, its jobs by status (every tenant's for operators),
    the jobs waiting for a worker, and the model zoo's graphs a job can name. The page
    polls it; readiness, which connects to the broker, is ``/readyz``'s."""
    from tagplan.planner.zoo import catalog  # at the first request, as intake reads the zoo

    rows = session.execute(
        select(Job.status, func.count()).where(*job_filter(caller)).group_by(Job.status)
    )
    counts = dict(rows.all())
    return {
        "tenant": caller.tenant,
        "scopes": sorted(caller.scopes),
        "sees_all": caller.sees_all,
        "jobs": {status.value: counts.get(status.value, 0) for status in JobStatus},
        "queue_depth": counts.get(JobStatus.QUEUED.value, 0),
        "embedded": request.app.state.embedded_worker is not None,
        "zoo": [model.name for model in catalog.list_models()],
    }
