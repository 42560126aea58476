"""``/v1/strategies``: the strategy cache, across renumbered clusters.

A caller gets only strategies of its tenant's jobs (operators: every tenant's): a graph
fingerprint names content, and knowing it is no proof of having planned that graph.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Query, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from tagplan.db.models import ClusterRow, Job, Result
from tagplan.db.session import session_scope
from tagplan.planner.strategy_remap import ClusterMapping
from tagplan.planner.version import planner_version
from tagplan.service.auth import Principal
from tagplan.service.deps import ReadKey
from tagplan.service.intake import cluster_from_input
from tagplan.service.memo import TtlCache
from tagplan.service.remap import cluster_from_spec_json
from tagplan.service.schemas import (
    INT32_MAX,
    MAX_NAME_CHARS,
    StrategiesPublic,
    StrategyPublic,
)
from tagplan.service.tenancy import holds, job_filter
from tagplan.settings import Settings

router = APIRouter(prefix="/v1/strategies", tags=["strategies"])

_HEX = frozenset("0123456789abcdef")


def _spec_json(spec: dict[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True)


def _target(
    session: Session, settings: Settings, caller: Principal, cluster: str
) -> tuple[str | None, str]:
    """The numbering to answer in (a spec as JSON, or None) and the canonical fingerprint."""
    stored = (
        session.get(ClusterRow, cluster) if holds(session, caller, "cluster", cluster) else None
    )
    if stored is not None:
        return _spec_json(stored.spec), stored.fingerprint
    if len(cluster) == 64 and set(cluster) <= _HEX:
        return None, cluster
    loaded = cluster_from_input(settings, cluster)
    return _spec_json(loaded.spec), loaded.fingerprint


def _strategies(
    session: Session,
    settings: Settings,
    caller: Principal,
    *,
    graph: str,
    cluster: str,
    batch_size: int | None,
    limit: int,
) -> list[StrategyPublic]:
    target, fingerprint = _target(session, settings, caller, cluster)
    query = (
        select(Result, ClusterRow)
        .join(Job, Job.id == Result.job_id)
        .join(ClusterRow, ClusterRow.id == Job.cluster_id)
        .where(Result.graph_fingerprint == graph, Result.cluster_fingerprint == fingerprint)
        .where(*job_filter(caller))
        .order_by(Result.step_time_s)
        .limit(limit)
    )
    if batch_size is not None:
        query = query.where(Result.batch_size == batch_size)
    data = []
    for result, source in session.execute(query):
        summary = result.summary
        strategy, memory = summary["strategy"], summary["peak_memory_bytes"]
        source_json = _spec_json(source.spec)
        remapped = target is not None and target != source_json
        if remapped:
            mapping = ClusterMapping(
                cluster_from_spec_json(source_json), cluster_from_spec_json(target)
            )
            strategy, memory = mapping.strategy(strategy), mapping.per_device(memory)
        data.append(
            StrategyPublic(
                job_id=result.job_id,
                graph_fingerprint=result.graph_fingerprint,
                cluster_fingerprint=result.cluster_fingerprint,
                cluster_id=source.id,
                batch_size=result.batch_size,
                step_time_s=result.step_time_s,
                speedup_vs_dp_nccl=summary.get("speedup_vs_dp_nccl"),
                speedup_vs_best_data_parallel=summary.get("speedup_vs_best_data_parallel"),
                peak_memory_bytes=memory,
                strategy=strategy,
                remapped=remapped,
                source=result.source,
                prior=summary.get("prior", "uniform"),
                stale=result.planner_version != planner_version(),
                created_at=result.created_at,
            )
        )
    return data


@router.get("", response_model=StrategiesPublic)
async def list_strategies(
    request: Request,
    caller: ReadKey,
    graph: str = Query(max_length=64, description="graph fingerprint"),
    cluster: str = Query(
        max_length=MAX_NAME_CHARS,
        description="canonical cluster fingerprint, a stored cluster id, or a named cluster; "
        "with an id or a name the strategies come in that cluster's numbering",
    ),
    batch_size: int | None = Query(default=None, gt=0, le=INT32_MAX),
    limit: int = Query(default=10, ge=1, le=100),
) -> StrategiesPublic:
    """Cached strategies of the tenant's jobs for a graph on a cluster, fastest first.

    A cluster equal up to renaming and renumbering of machines and GPUs has the same
    fingerprint and hits the cache; given as an id or a name, every strategy is remapped
    to its numbering.
    """
    settings: Settings = request.app.state.settings
    memo: TtlCache = request.app.state.strategy_cache

    def lookup() -> list[StrategyPublic]:
        with session_scope(settings.sqlalchemy_url) as session:
            return _strategies(
                session,
                settings,
                caller,
                graph=graph,
                cluster=cluster,
                batch_size=batch_size,
                limit=limit,
            )

    view = None if caller.sees_all else caller.tenant
    data = await memo.get((view, graph, cluster, batch_size, limit), lookup)
    if data:
        request.app.state.metrics.cache_hits.labels("strategy").inc()
    return StrategiesPublic(data=data, count=len(data))
