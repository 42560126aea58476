"""Celery tasks: thin wrappers over :mod:`tagplan.workers.steps` (docs/design.md §9).

A task gets the job id (and shard, seed), never the inputs. Outcomes:

* the job already finished (cancelled, failed, or done by an earlier delivery): nothing;
* bad input or an infeasible job (:class:`~tagplan.planner.errors.PlannerError`): the job
  fails with the planner's message, no retry;
* database or broker trouble (:class:`sqlalchemy.exc.OperationalError`): retried later;
* anything else, a time limit included: the job fails with the reason and the worker keeps
  serving. A step whose worker died ``task_max_attempts`` times fails its job too, so a
  graph that kills workers cannot loop through the fleet forever.

Tasks always return normally (chord bodies run only when every shard returned).
"""

from __future__ import annotations

import logging
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
from tagplan.workers.pipeline import enqueue_job, launch_search
from tagplan.workers.priors import preload

__all__ = ["analyze_job", "finish_job", "search_shard"]

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


def _run(task: Task, job_id: str, step: str, phase: str, work: Callable[[], None]) -> bool:
    """Run one step of a job with the error policy of the module docstring; True when the
    step's work completed (the job goes on)."""
    settings = get_settings()
    url = settings.sqlalchemy_url
    try:
        with session_scope(url) as session:
            if job_state.is_finished(session, job_id):
                return False
            attempts = job_state.begin_step(session, job_id=job_id, step=step, phase=phase)
        if attempts > settings.task_max_attempts:
            reason = f"step {step} was interrupted {attempts - 1} times (worker lost); giving up"
            _fail(url, job_id, reason)
            return False
        work()
        return True
    except Cancelled:
        log.info("job %s cancelled during %s", job_id, step)
    except PlannerError as exc:
        _fail(url, job_id, str(exc))
    except OperationalError as exc:
        raise task.retry(exc=exc, countdown=RETRY_DELAY_S, max_retries=MAX_RETRIES) from exc
    except SoftTimeLimitExceeded:
        _fail(url, job_id, f"step {step} exceeded its time limit")
    except Exception as exc:
        log.exception("job %s failed in %s", job_id, step)
        _fail(url, job_id, f"internal error in step {step}: {type(exc).__name__}: {exc}")
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
    """Chord body: merge the shards, SFB, compile, store the result; start the refinement
    of an anytime job answered before its search was done."""
    settings = get_settings()
    refinement: list[str | None] = []

    def work() -> None:
        refinement.append(steps.finish_step(settings, job_id, shards))

    if _run(self, job_id, "finish", "sfb", work) and refinement[0] is not None:
        options = steps.job_options(settings, refinement[0])
        enqueue_job(app, refinement[0], options, margin_s=settings.time_limit_margin_s)
