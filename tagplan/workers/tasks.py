"""Celery tasks: thin wrappers over :mod:`tagplan.workers.steps` (docs/design.md §9).

A task gets the job id (and shard, seed), never the inputs. Outcomes:

* the job already finished (cancelled, failed, or done by an earlier delivery): nothing;
* bad input or an infeasible job (:class:`~tagplan.planner.errors.PlannerError`): the job
  fails with the planner's message, no retry;
* database or broker trouble (:class:`sqlalchemy.exc.OperationalError`): retried later;
* anything else, a time limit included: the job fails with the reason and the worker keeps
  serving. A step whose worker died ``task_max_attempts`` times fails its job too, so a
  graph that kills workers cannot loop through the fleet forever.

The GraphDef step that follows an answer (when the budget left the GraphDef's compile
out) runs for a finished job, and where the policy would fail the job it leaves the answer
as it is and records the reason in the result instead.

Tasks always return normally (chord bodies run only when every shard returned).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_process_init
from sqlalchemy.exc import OperationalError

from tagplan.db import job_state
from tagplan.db.models import JobStatus
from tagplan.db.session import session_scope
from tagplan.planner.errors import Cancelled, PlannerError
from tagplan.settings import get_settings
from tagplan.workers import steps
from tagplan.workers.app import app
from tagplan.workers.pipeline import enqueue_job, launch_search, send_graphdef
from tagplan.workers.priors import preload

__all__ = ["analyze_job", "attach_graphdef", "finish_job", "search_shard"]

log = logging.getLogger(__name__)
RETRY_DELAY_S = 5
MAX_RETRIES = 10


@worker_process_init.connect
def _warm_up(**_: object) -> None:
    """Each worker process compiles the simulator and loads the shipped prior before its
    first job (see :func:`~tagplan.planner.evaluate.warm_up`,
    :func:`~tagplan.workers.priors.preload`); a warm-up that fails is logged, not fatal."""
    from tagplan.planner.evaluate import warm_up

    try:
        log.info("simulator warmed up in %.2f s", warm_up())
    except Exception:
        log.exception("the simulator's warm-up failed; serving anyway")
    preload()


def _run(
    task: Task,
    job_id: str,
    step: str,
    phase: str,
    work: Callable[[], None],
    *,
    fail: Callable[[str, str], None] | None = None,
) -> bool:
    """Run one step of a job with the error policy of the module docstring; True when the
    step's work completed (the job goes on). ``fail`` (job id, reason) takes the place of
    failing the job for a step that follows its answer: it runs for a finished job."""
    settings = get_settings()
    url = settings.sqlalchemy_url
    follows_answer = fail is not None
    fail = fail or (lambda failed_id, reason: _fail(url, failed_id, reason))
    try:
        with session_scope(url) as session:
            if not follows_answer and job_state.is_finished(session, job_id):
                return False
            attempts = job_state.begin_step(session, job_id=job_id, step=step, phase=phase)
        if attempts > settings.task_max_attempts:
            reason = f"step {step} was interrupted {attempts - 1} times (worker lost); giving up"
            fail(job_id, reason)
            return False
        work()
        return True
    except Cancelled:
        log.info("job %s cancelled during %s", job_id, step)
    except PlannerError as exc:
        fail(job_id, str(exc))
    except OperationalError as exc:
        raise task.retry(exc=exc, countdown=RETRY_DELAY_S, max_retries=MAX_RETRIES) from exc
    except SoftTimeLimitExceeded:
        fail(job_id, f"step {step} exceeded its time limit")
    except Exception as exc:
        log.exception("job %s failed in %s", job_id, step)
        fail(job_id, f"internal error in step {step}: {type(exc).__name__}: {exc}")
    return False


def _fail(url: str, job_id: str, reason: str) -> None:
    with session_scope(url) as session:
        job_state.finish_job(session, job_id=job_id, status=JobStatus.FAILED, error=reason)


@app.task(name="tagplan.analyze", bind=True)
def analyze_job(self: Task, job_id: str) -> None:
    """Parse and analyze the graph (a bad graph fails the job here, before any search);
    answer from the strategy cache, or group it, score the baselines once and start the
    search shards."""
    settings = get_settings()
    search: list[bool] = []
    if _run(
        self,
        job_id,
        "analyze",
        "analyze",
        lambda: search.append(steps.analyze_step(settings, job_id)),
    ) and all(search):
        options = steps.job_options(settings, job_id)
        launch_search(app, job_id, options, margin_s=settings.time_limit_margin_s)


@app.task(name="tagplan.search_shard", bind=True)
def search_shard(self: Task, job_id: str, shard: int, seed: int) -> None:
    """One root-parallel search tree (TAG §4.2.2) with its own seed."""
    _run(
        self,
        job_id,
        steps.shard_step(shard),
        "search",  # grouping and baselines come prepared by the analyze step
        lambda: steps.search_step(get_settings(), job_id, shard, seed),
    )


@app.task(name="tagplan.finish", bind=True)
def finish_job(self: Task, _shard_results: list[None] | None, job_id: str, shards: int) -> None:
    """Chord body: merge the shards, SFB, compile, store the result; then send what follows
    the answer: the GraphDef step when the budget left the compile out, the refinement of
    an anytime job answered before its search was done."""
    settings = get_settings()
    finished: list[steps.Finished] = []

    def work() -> None:
        finished.append(steps.finish_step(settings, job_id, shards))

    if not _run(self, job_id, "finish", "sfb", work):
        return
    refinement, graphdef_owed = finished[0]
    if graphdef_owed:
        send_graphdef(app, job_id, settings.graphdef_time_limit_s)
    if refinement is not None:
        options = steps.job_options(settings, refinement)
        enqueue_job(app, refinement, options, margin_s=settings.time_limit_margin_s)


@app.task(name="tagplan.graphdef", bind=True)
def attach_graphdef(self: Task, job_id: str) -> None:
    """After the answer: compile and attach the GraphDef its budget left out, under a time
    limit of its own (``graphdef_time_limit_s``). A failure leaves the answer as it is and
    says why in the result (``graphdef_error``)."""
    settings = get_settings()
    soft_limit_s = (self.request.timelimit or (None, None))[1]
    deadline = time.monotonic() + (soft_limit_s or settings.graphdef_time_limit_s)
    _run(
        self,
        job_id,
        job_state.FOLLOWING_STEP,
        "compile",
        lambda: steps.graphdef_step(settings, job_id, deadline=deadline),
        fail=lambda failed_id, reason: steps.graphdef_failed(settings, failed_id, reason),
    )
