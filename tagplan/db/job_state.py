"""Job state transitions and step outputs, shared by the API and the workers.

Every write is conditional on the job's current status, so a worker that lost a race
with a cancellation (or a redelivered task) cannot resurrect a finished job.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tagplan.db.models import LIVE_STATUSES, Job, JobStatus, JobStep, Result, utcnow
from tagplan.db.session import insert_or_find

__all__ = [
    "FOLLOWING_STEP",
    "add_job",
    "as_utc",
    "begin_step",
    "cancel_job",
    "drop_following",
    "fail_following",
    "finish_job",
    "follow_answer",
    "following_steps",
    "is_finished",
    "live_job",
    "quiet_jobs",
    "record_progress",
    "redispatch",
    "redispatch_following",
    "save_step",
    "seconds_since",
    "step_output",
    "step_outputs",
]

_ACTIVE = (JobStatus.QUEUED, JobStatus.RUNNING)
FOLLOWING_STEP = "graphdef"
"""The step that follows a job's answer: its GraphDef, when the budget left the compile
out. Its row exists while the step is owed (``output``: ``{"dispatches": n}``, the times
it was sent) and is dropped when the GraphDef is attached or its failure recorded."""
MAX_HISTORY = 500
"""Points of a job's progress history kept (the latest)."""


def live_job(session: Session, tenant: str, key: str) -> Job | None:
    """The job of ``tenant`` queued, running or succeeded for ``key``, if any (there is at
    most one)."""
    return session.scalar(
        select(Job).where(Job.tenant == tenant, Job.key == key, Job.status.in_(LIVE_STATUSES))
    )


def add_job(session: Session, job: Job) -> tuple[Job, bool]:
    """Insert ``job`` unless a live job of its tenant has its key; the live job and whether
    it existed. Identical submissions arriving together miss each other's job on a read;
    the unique index on live tenants and keys (``uq_jobs_live_tenant_key``) lets one insert
    win."""
    return insert_or_find(session, job, lambda: live_job(session, job.tenant, job.key))


def is_finished(session: Session, job_id: str) -> bool:
    """True when the job is gone or succeeded, failed or was cancelled."""
    status = session.scalar(select(Job.status).where(Job.id == job_id))
    return status is None or JobStatus(status).finished


def begin_step(session: Session, *, job_id: str, step: str, phase: str) -> int:
    """Mark the job running in ``phase`` and count one more attempt of ``step``."""
    now = utcnow()
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(_ACTIVE))
        .values(status=JobStatus.RUNNING, phase=phase, updated_at=now)
    )
    session.execute(
        update(Job).where(Job.id == job_id, Job.started_at.is_(None)).values(started_at=now)
    )
    row = session.get(JobStep, (job_id, step))
    if row is None:
        row = JobStep(job_id=job_id, step=step, attempts=0)
        session.add(row)
    row.attempts += 1
    row.updated_at = now
    session.flush()
    return row.attempts


def record_progress(
    session: Session,
    *,
    job_id: str,
    phase: str,
    iterations: int,
    best_step_time_s: float | None,
    best_speedup: float | None,
) -> None:
    """Phase and progress of a running job (the best figures only ever improve); each
    improvement of the best step adds a point to the job's history."""
    job = session.get(Job, job_id)
    if job is None or job.status != JobStatus.RUNNING:
        return
    job.phase = phase
    job.iterations = max(job.iterations, iterations)
    if best_speedup is not None and (job.best_speedup is None or best_speedup > job.best_speedup):
        job.best_speedup = best_speedup
    if best_step_time_s is not None and (
        job.best_step_time_s is None or best_step_time_s < job.best_step_time_s
    ):
        job.best_step_time_s = best_step_time_s
        since = seconds_since(job.started_at) if job.started_at is not None else 0.0
        point = [round(since, 3), job.iterations, best_step_time_s]
        job.history = [*(job.history or [])[-(MAX_HISTORY - 1) :], point]
    job.updated_at = utcnow()


def step_output(session: Session, *, job_id: str, step: str) -> dict[str, Any] | None:
    """The stored output of ``step``, None when it has not completed."""
    return session.scalar(
        select(JobStep.output).where(JobStep.job_id == job_id, JobStep.step == step)
    )


def step_outputs(session: Session, *, job_id: str, prefix: str) -> dict[str, dict[str, Any]]:
    """Completed outputs of the steps whose name starts with ``prefix``, by step name."""
    rows = session.execute(
        select(JobStep.step, JobStep.output).where(
            JobStep.job_id == job_id, JobStep.step.startswith(prefix), JobStep.output.is_not(None)
        )
    )
    return {step: output for step, output in rows}


def save_step(session: Session, *, job_id: str, step: str, output: dict[str, Any]) -> None:
    """Upsert ``step``'s output (a rerun overwrites it with the same content)."""
    row = session.get(JobStep, (job_id, step))
    if row is None:
        row = JobStep(job_id=job_id, step=step, attempts=1)
        session.add(row)
    row.output = output
    row.updated_at = utcnow()


def finish_job(
    session: Session, *, job_id: str, status: JobStatus, error: str | None = None
) -> bool:
    """Move an active job to a final status; False when it had already finished."""
    job = session.get(Job, job_id, with_for_update=True)
    if job is None or JobStatus(job.status).finished:
        return False
    now = utcnow()
    created = as_utc(job.created_at)
    job.status, job.finished_at, job.updated_at = status, now, now
    job.latency_s = (now - created).total_seconds()
    if error is not None:
        job.error = error
    session.flush()
    return True


def cancel_job(session: Session, *, job_id: str) -> bool:
    """Cancel a queued or running job; its worker notices at the next progress check."""
    return finish_job(
        session, job_id=job_id, status=JobStatus.CANCELLED, error="cancelled by request"
    )


def quiet_jobs(session: Session, *, quiet_since: datetime) -> list[Job]:
    """Queued and running jobs nothing of which has reported since ``quiet_since``."""
    return list(
        session.scalars(
            select(Job)
            .where(Job.status.in_(_ACTIVE), Job.updated_at < quiet_since)
            .order_by(Job.created_at)
        )
    )


def redispatch(session: Session, *, job_id: str, seen_updated_at: datetime) -> bool:
    """Count one more dispatch of the job and restart its quiet time, unless it reported or
    finished since it was seen quiet (or another sweeper took it): True when the caller
    should send it to the broker."""
    return bool(
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status.in_(_ACTIVE), Job.updated_at == seen_updated_at)
            .values(dispatches=Job.dispatches + 1, updated_at=utcnow())
        ).rowcount
    )


def as_utc(moment: datetime) -> datetime:
    """``moment`` as an aware UTC time (SQLite gives stored UTC times back naive)."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def seconds_since(moment: datetime) -> float:
    """Seconds from ``moment`` to now."""
    return (utcnow() - as_utc(moment)) / timedelta(seconds=1)


def follow_answer(session: Session, *, job_id: str) -> None:
    """Record, with the job's answer, that its GraphDef step is owed and sent once."""
    session.add(JobStep(job_id=job_id, step=FOLLOWING_STEP, attempts=0, output={"dispatches": 1}))


def drop_following(session: Session, *, job_id: str) -> None:
    """The job's GraphDef step is no longer owed (done, or its failure recorded)."""
    row = session.get(JobStep, (job_id, FOLLOWING_STEP))
    if row is not None:
        session.delete(row)


def fail_following(session: Session, *, job_id: str, reason: str) -> None:
    """The job's GraphDef step failed for good: its result says why in ``graphdef_error``
    (the answer stands) and the step is no longer owed."""
    row = session.get(Result, job_id)
    if row is not None and row.graphdef_digest is None:
        row.summary = {**row.summary, "graphdef_error": reason}
    drop_following(session, job_id=job_id)


def following_steps(session: Session, *, quiet_since: datetime | None = None) -> list[JobStep]:
    """The GraphDef steps owed, those nothing of which happened since ``quiet_since`` when
    given (begun, sent), oldest first."""
    query = select(JobStep).where(JobStep.step == FOLLOWING_STEP)
    if quiet_since is not None:
        query = query.where(JobStep.updated_at < quiet_since)
    return list(session.scalars(query.order_by(JobStep.updated_at)))


def redispatch_following(session: Session, *, job_id: str, seen_updated_at: datetime) -> int:
    """Count one more sending of the job's owed GraphDef step and restart its quiet time,
    unless it began or was sent since it was seen quiet: the sendings so far, 0 when the
    caller should not send it."""
    row = session.get(JobStep, (job_id, FOLLOWING_STEP), with_for_update=True)
    if row is None or as_utc(row.updated_at) != as_utc(seen_updated_at):
        return 0
    dispatches = int((row.output or {}).get("dispatches", 1)) + 1
    row.output = {"dispatches": dispatches}
    row.updated_at = utcnow()
    return dispatches
