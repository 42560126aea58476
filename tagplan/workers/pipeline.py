"""The workflow of one job as a Celery canvas, built from task names.

``analyze -> chord(search_shard x k) -> finish``. Signatures are made by name, so the API
process enqueues without importing the tasks (and with them the planner).
"""

from __future__ import annotations

from typing import Any

from celery import Celery, chain, chord

__all__ = ["enqueue_job", "shard_seeds"]


def shard_seeds(seed: int, shards: int) -> list[int]:
    """Seeds of the root-parallel trees: the job's seed, then the next ones."""
    return [seed + k for k in range(shards)]


def enqueue_job(app: Celery, job_id: str, options: dict[str, Any], *, margin_s: float) -> None:
    """Send the job's workflow to the broker.

    Each task's soft time limit is the search budget plus ``margin_s`` (the hard limit a
    minute more): a runaway step fails its job instead of holding a worker.
    """
    soft = float(options["budget_s"]) + margin_s
    limits = {"soft_time_limit": soft, "time_limit": soft + 60}
    shards = int(options.get("shards", 1))
    header = [
        app.signature("tagplan.search_shard", args=(job_id, k, s), options=limits, immutable=True)
        for k, s in enumerate(shard_seeds(int(options.get("seed", 0)), shards))
    ]
    body = app.signature("tagplan.finish", args=(job_id, shards), options=limits)
    analyze = app.signature("tagplan.analyze", args=(job_id,), options=limits, immutable=True)
    chain(analyze, chord(header, body)).apply_async()
