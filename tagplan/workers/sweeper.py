"""Recovery of lost jobs from the database, whatever the broker forgot (docs/design.md §9).

The database is the record of every job; the broker only carries messages, and a message
can be lost: Redis restarted without persistence (the queue, the unacknowledged set and
the shards' chord counter with it), a Redis replaced by an empty one, a message between a
worker's pop and its acknowledgement. Nothing of such a job reports again, and it would
stay queued or running for ever.

A job is **lost** when both hold:

* nothing of it has reported (a step began, progress, a phase) for its *quiet window*:
  its Celery soft time limit (budget plus ``time_limit_margin_s``) plus ``stall_grace_s``.
  No step of the job can still be running then: a step ends by its soft limit, and one that
  ignores it is killed a minute later, within the grace;
* the broker holds no waiting message: a job whose next step merely waits behind others in
  the queue is not lost, and a queue that drains lets lost jobs be found.

A job's **GraphDef step** (the compile its budget left out of the answer) is lost the same
way when it was owed, neither begun nor sent, for its own soft time limit
(``graphdef_time_limit_s``) plus ``stall_grace_s``, nothing waiting in the queue: it is
sent again, and when it has been sent ``max_dispatches`` times its result says so
(``graphdef_error``); the answer stands either way.

The sweeper re-sends a lost job's workflow from its first step. Every step is idempotent
per ``(job, step)``, so the rerun skips what finished (analysis, the shards that stored
their outcome) and redoes only the rest; a duplicate message, should the original still
turn up, does the same. A job dispatched ``max_dispatches`` times fails with the reason
when it is lost again, so a job that keeps getting lost cannot loop for ever. Each API
process runs a :class:`Sweeper` thread; a database lease lets one of them sweep at a time.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from datetime import timedelta

from celery import Celery
from kombu.exceptions import OperationalError as BrokerError
from sqlalchemy.exc import DBAPIError as DatabaseError

from tagplan.db import job_state
from tagplan.db.leases import take_lease
from tagplan.db.models import JobStatus, utcnow
from tagplan.db.session import session_scope
from tagplan.settings import Settings
from tagplan.workers.app import QUEUE
from tagplan.workers.pipeline import enqueue_job, send_graphdef

__all__ = [
    "LEASE",
    "SweepReport",
    "Sweeper",
    "graphdef_window_s",
    "quiet_window_s",
    "sweep_once",
    "waiting_messages",
]

log = logging.getLogger(__name__)

LEASE = "job-sweeper"


@dataclass
class SweepReport:
    """What one sweep did: jobs re-sent, jobs failed, or why it swept nothing."""

    redispatched: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: str | None = None
    graphdefs_resent: list[str] = field(default_factory=list)
    graphdefs_failed: list[str] = field(default_factory=list)


def quiet_window_s(settings: Settings, options: dict) -> float:
    """How long a job may go without reporting before it counts as lost (module docstring)."""
    return float(options["budget_s"]) + settings.time_limit_margin_s + settings.stall_grace_s


def graphdef_window_s(settings: Settings) -> float:
    """How long an owed GraphDef step may go neither begun nor sent before it counts as
    lost (module docstring)."""
    return settings.graphdef_time_limit_s + settings.stall_grace_s


def waiting_messages(app: Celery) -> int:
    """Messages waiting in the job queue of ``app``'s broker (raises when it is unreachable)."""
    with app.connection_for_write() as connection:
        return connection.default_channel.queue_declare(QUEUE).message_count


def sweep_once(settings: Settings, app: Celery, *, holder: str) -> SweepReport:
    """Find the lost jobs and re-send (or fail) them, if ``holder`` holds the sweeper's lease."""
    url = settings.sqlalchemy_url
    with session_scope(url) as session:
        lease_s = 3 * settings.sweep_interval_s
        if not take_lease(session, name=LEASE, holder=holder, ttl_s=lease_s):
            return SweepReport(skipped="another process holds the sweeper's lease")
        quiet_since = utcnow() - timedelta(seconds=settings.stall_grace_s)
        candidates = [
            (job.id, job.updated_at, job.options, job.dispatches)
            for job in job_state.quiet_jobs(session, quiet_since=quiet_since)
            if job_state.seconds_since(job.updated_at) > quiet_window_s(settings, job.options)
        ]
        owed_since = utcnow() - timedelta(seconds=graphdef_window_s(settings))
        owed = [
            (step.job_id, step.updated_at, int((step.output or {}).get("dispatches", 1)))
            for step in job_state.following_steps(session, quiet_since=owed_since)
        ]
    if not candidates and not owed:
        return SweepReport()
    waiting = waiting_messages(app)
    if waiting:
        return SweepReport(skipped=f"{waiting} messages wait in the queue")
    report = SweepReport()
    for job_id, updated_at, options, dispatches in candidates:
        with session_scope(url) as session:
            if dispatches >= settings.max_dispatches:
                reason = (
                    f"lost {dispatches} times: no step reported for "
                    f"{quiet_window_s(settings, options):.0f} s with nothing left in the queue; "
                    "giving up"
                )
                failed = JobStatus.FAILED
                if job_state.finish_job(session, job_id=job_id, status=failed, error=reason):
                    report.failed.append(job_id)
                continue
            taken = job_state.redispatch(session, job_id=job_id, seen_updated_at=updated_at)
        if taken:
            enqueue_job(app, job_id, options, margin_s=settings.time_limit_margin_s)
            report.redispatched.append(job_id)
    for job_id, updated_at, dispatches in owed:
        with session_scope(url) as session:
            if dispatches >= settings.max_dispatches:
                reason = (
                    f"the GraphDef step was lost {dispatches} times: not begun for "
                    f"{graphdef_window_s(settings):.0f} s with nothing left in the queue"
                )
                job_state.fail_following(session, job_id=job_id, reason=reason)
                report.graphdefs_failed.append(job_id)
                continue
            taken = job_state.redispatch_following(
                session, job_id=job_id, seen_updated_at=updated_at
            )
        if taken:
            send_graphdef(app, job_id, settings.graphdef_time_limit_s)
            report.graphdefs_resent.append(job_id)
    if report.redispatched or report.failed:
        log.warning("lost jobs re-sent: %s; failed: %s", report.redispatched, report.failed)
    if report.graphdefs_resent or report.graphdefs_failed:
        log.warning(
            "lost GraphDef steps re-sent: %s; failed: %s",
            report.graphdefs_resent,
            report.graphdefs_failed,
        )
    return report


class Sweeper:
    """A daemon thread that sweeps every ``sweep_interval_s`` until :meth:`stop`."""

    def __init__(self, settings: Settings, app: Celery) -> None:
        self.settings = settings
        self.app = app
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tagplan-sweeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.wait(self.settings.sweep_interval_s):
            interval_s = self.settings.sweep_interval_s
            try:
                sweep_once(self.settings, self.app, holder=self.holder)
            except (DatabaseError, BrokerError) as exc:  # down for now: one line a round
                log.warning("no job sweep (%s); again in %.0f s", type(exc).__name__, interval_s)
            except Exception:
                log.exception("the job sweep failed; again in %.0f s", interval_s)
