"""The workflow of one job: ``analyze``, then ``chord(search_shard x k) -> finish``, then
``graphdef`` when the budget left the GraphDef's compile out of the answer.

The API sends only the ``analyze`` task (by name, so it imports neither the tasks nor the
planner) and never waits for a result. The analyze task starts the chord when the graph
is good: building the chord where it runs keeps result-backend bookkeeping (Redis
subscriptions for the chord's results) out of the API process, so a broker or backend
outage cannot wedge the API and it holds no per-job state.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, chord

__all__ = ["enqueue_job", "launch_search", "send_graphdef", "shard_seeds", "time_limits"]


def shard_seeds(seed: int, shards: int) -> list[int]:
    """Seeds of the root-parallel trees: the job's seed, then the next ones."""
    return [seed + k for k in range(shards)]


def time_limits(options: dict[str, Any], margin_s: float) -> dict[str, float]:
    """Celery limits of every task of a job: the search budget plus ``margin_s`` (soft), a
    minute more (hard). A runaway step fails its job instead of holding a worker."""
    soft = float(options["budget_s"]) + margin_s
    return {"soft_time_limit": soft, "time_limit": soft + 60}


def enqueue_job(app: Celery, job_id: str, options: dict[str, Any], *, margin_s: float) -> None:
    """Send the job's first task to the broker."""
    app.send_task(
        "tagplan.analyze", args=(job_id,), ignore_result=True, **time_limits(options, margin_s)
    )


def launch_search(app: Celery, job_id: str, options: dict[str, Any], *, margin_s: float) -> None:
    """Start the root-parallel search shards with the finish step as their chord body."""
    limits = time_limits(options, margin_s)
    shards = int(options.get("shards", 1))
    header = [
        app.signature("tagplan.search_shard", args=(job_id, k, s), options=limits, immutable=True)
        for k, s in enumerate(shard_seeds(int(options.get("seed", 0)), shards))
    ]
    body = app.signature("tagplan.finish", args=(job_id, shards), options=limits)
    chord(header, body).apply_async()


def send_graphdef(app: Celery, job_id: str, time_limit_s: float) -> None:
    """Send the step that compiles the job's GraphDef after its answer, with a soft time
    limit of its own (``time_limit_s``) and a hard one a minute more."""
    app.send_task(
        "tagplan.graphdef",
        args=(job_id,),
        ignore_result=True,
        soft_time_limit=time_limit_s,
        time_limit=time_limit_s + 60,
    )
