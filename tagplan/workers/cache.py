"""The strategy cache as jobs use it (docs/design.md §9, "Repeat jobs and warm starts").

A finished plan answers a new job of the same tenant when it was made for the same graph
content, batch inputs, loss and batch size, on a cluster with the same canonical
fingerprint, with the same **cost inputs**: the planner's version, the job's profiles (by
content digest), the search's prior (its name: ``gnn:<digest>`` of the checkpoint that
guided the search, or ``uniform``) and whether sufficient-factor broadcast may be used. A
plan made with other cost inputs never answers; one of another planner version is listed
by ``GET /v1/strategies`` as stale. Plans of the same graph on a cluster a machine larger
or smaller, or at another batch size, are **near misses**: they seed the search instead of
answering (:func:`find_plans` finds both with one query).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session, defer

from tagplan.db.models import ClusterRow, Job, JobStatus, Result
from tagplan.planner.version import planner_version

if TYPE_CHECKING:
    from tagplan.planner.topology import Cluster

__all__ = ["CachedPlan", "cost_inputs", "cost_key", "find_plans"]

_MAX_NEAR_CANDIDATES = 50
# machines (GPU type, count) that may differ between a near miss and the job's cluster
_MAX_MACHINE_CHANGES = 2


def cost_inputs(options: dict[str, Any], prior: str) -> dict[str, Any]:
    """What a plan's numbers depend on besides graph, cluster and batch size; ``prior`` is
    the name of the prior the job's search uses (:mod:`~.priors`)."""
    return {
        "planner": planner_version(),
        "profiles": sorted(options.get("profiles", [])),
        "prior": prior,
        "sfb": bool(options.get("sfb", True)),
    }


def cost_key(options: dict[str, Any], prior: str) -> str:
    """Digest of :func:`cost_inputs`."""
    inputs = cost_inputs(options, prior)
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class CachedPlan:
    """A finished plan and the cluster spec it was made for."""

    job_id: str
    summary: dict[str, Any]
    spec: dict[str, Any]
    cluster_fingerprint: str
    batch_size: int
    step_time_s: float
    graphdef_digest: str | None
    device_map: dict[str, Any] | None


def _candidates(
    session: Session, job: Job, graph_fingerprint: str, key: str
) -> list[tuple[Result, dict[str, Any]]]:
    """Finished plans of the job's tenant for the same graph, inputs, loss and cost key,
    fastest first, with their cluster specs; searched ones only (an answer from the cache
    copies one of them). Their summaries and device maps load only when read."""
    rows = session.execute(
        select(Result, Job.batch_inputs, Job.loss, ClusterRow.spec)
        .join(Job, Job.id == Result.job_id)
        .join(ClusterRow, ClusterRow.id == Job.cluster_id)
        .where(
            Result.graph_fingerprint == graph_fingerprint,
            Result.cost_key == key,
            Result.source == "search",  # a cache answer is a copy: answer from the original
            Job.tenant == job.tenant,
            Job.status == JobStatus.SUCCEEDED,
            Job.id != job.id,
        )
        .options(defer(Result.summary), defer(Result.device_map))
        .order_by(Result.step_time_s, Result.created_at)
    )
    return [
        (result, spec)
        for result, batch_inputs, loss, spec in rows
        if batch_inputs == job.batch_inputs and loss == job.loss
    ]


def _plan(result: Result, spec: dict[str, Any]) -> CachedPlan:
    return CachedPlan(
        job_id=result.job_id,
        summary=result.summary,
        spec=spec,
        cluster_fingerprint=result.cluster_fingerprint,
        batch_size=result.batch_size,
        step_time_s=result.step_time_s,
        graphdef_digest=result.graphdef_digest,
        device_map=result.device_map,
    )


def _machines(cluster: Cluster) -> Counter[tuple[str, int]]:
    """The cluster's machines as (GPU types, GPU count) signatures."""
    signatures: Counter[tuple[str, int]] = Counter()
    for m in range(cluster.num_machines):
        types = cluster.device_type[cluster.device_machine == m]
        kinds = "+".join(sorted({cluster.type_names[int(t)] for t in types}))
        signatures[(kinds, len(types))] += 1
    return signatures


def find_plans(
    session: Session,
    job: Job,
    cluster: Cluster,
    *,
    graph_fingerprint: str,
    cluster_fingerprint: str,
    batch_size: int,
    key: str,
) -> tuple[CachedPlan | None, tuple[CachedPlan, str] | None]:
    """The fastest plan that answers ``job`` (module docstring) and, when there is none,
    a plan to warm-start it from with how near it is: ``"batch size"`` (the same cluster at
    another batch size) or ``"machines"`` (a cluster with at most ``_MAX_MACHINE_CHANGES``
    machines more, fewer or different), the nearest first, fastest among equals."""
    from tagplan.planner.topology import load_cluster

    candidates = _candidates(session, job, graph_fingerprint, key)
    same_cluster = [c for c in candidates if c[0].cluster_fingerprint == cluster_fingerprint]
    for result, spec in same_cluster:
        if result.batch_size == batch_size and result.graphdef_digest is not None:
            return _plan(result, spec), None
    if same_cluster:
        return None, (_plan(*same_cluster[0]), "batch size")
    mine = _machines(cluster)
    nearest: tuple[int, Result, dict[str, Any]] | None = None
    for result, spec in candidates[:_MAX_NEAR_CANDIDATES]:
        theirs = _machines(load_cluster(spec))
        changes = sum(((mine - theirs) + (theirs - mine)).values())
        if changes <= _MAX_MACHINE_CHANGES and (nearest is None or changes < nearest[0]):
            nearest = (changes, result, spec)
    return None, (None if nearest is None else (_plan(nearest[1], nearest[2]), "machines"))
