"""The embedded default: a Celery worker in a thread of the API process (docs/design.md §9).

It is a real :class:`celery.worker.WorkController` consuming kombu's in-memory broker, so
the embedded service runs exactly the task code, canvas (the shards' chord), acknowledgement
and error policy of a production worker; only the transport differs. ``task_always_eager``
would have run the tasks inline in the request and skipped all of that. The in-memory
queue does not survive the process, so on start :func:`requeue_unfinished` re-sends every
job the database still calls queued or running, and every GraphDef step still owed after an
answer; finished steps are skipped on rerun.
"""

from __future__ import annotations

import logging
import threading

from celery import Celery
from celery.worker import WorkController
from sqlalchemy import select

from tagplan.db import job_state
from tagplan.db.models import Job, JobStatus
from tagplan.db.session import session_scope
from tagplan.settings import Settings
from tagplan.workers.pipeline import enqueue_job, send_graphdef
from tagplan.workers.priors import preload

__all__ = ["EmbeddedWorker", "requeue_unfinished"]


log = logging.getLogger(__name__)


class EmbeddedWorker:
    """One solo-pool Celery worker running in a daemon thread."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._worker: WorkController | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import tagplan.workers.tasks  # noqa: F401  (registers the tasks with the app)

        # Canvas steps rebuilt in the worker thread resolve the app as the current one.
        self.app.set_default()
        self._worker = WorkController(
            app=self.app,
            pool="solo",
            concurrency=1,
            hostname="embedded@tagplan",
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
        )
        self._thread = threading.Thread(
            target=_warm_then_serve, args=(self._worker,), name="tagplan-worker"
        )
        self._thread.daemon = True
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the running task (the next start resumes unfinished jobs)."""
        if self._worker is not None:
            self._worker.stop(in_sighandler=False)
        if self._thread is not None:
            self._thread.join(timeout_s)


def _warm_then_serve(worker: WorkController) -> None:
    """Warm the simulator up and load the shipped prior, then serve (the first job's
    budget does not pay them); a warm-up that fails only costs the first job that time."""
    from tagplan.planner.evaluate import warm_up

    try:
        warm_up()
    except Exception:
        log.exception("the simulator's warm-up failed; serving anyway")
    preload()
    worker.start()


def requeue_unfinished(settings: Settings, app: Celery) -> int:
    """Re-send the workflows of queued and running jobs and the GraphDef steps owed after
    an answer; returns how many."""
    active = (JobStatus.QUEUED, JobStatus.RUNNING)
    with session_scope(settings.sqlalchemy_url) as session:
        pending = session.execute(
            select(Job.id, Job.options).where(Job.status.in_(active)).order_by(Job.created_at)
        ).all()
        owed = [step.job_id for step in job_state.following_steps(session)]
    for job_id, options in pending:
        enqueue_job(app, job_id, options, margin_s=settings.time_limit_margin_s)
    for job_id in owed:
        send_graphdef(app, job_id, settings.graphdef_time_limit_s)
    return len(pending) + len(owed)
