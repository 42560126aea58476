"""``/v1/gpu-types`` and ``/v1/clusters``: what clusters can be made of, and stored ones."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from tagplan.db.models import ClusterRow
from tagplan.planner.topology import Cluster, builtin_catalog, describe, list_named_clusters
from tagplan.planner.topology import named_cluster_spec as named_spec
from tagplan.service.deps import ReadKey, SessionDep, SettingsDep, SubmitKey
from tagplan.service.intake import cluster_from_input, store_cluster
from tagplan.service.problems import Problem
from tagplan.service.schemas import ClusterPublic, NamedClusterPublic

router = APIRouter(prefix="/v1", tags=["catalog"])


@router.get("/gpu-types")
def gpu_types(_: ReadKey) -> list[dict[str, Any]]:
    """The built-in GPU catalog with public peak figures (a spec may add its own types)."""
    return [spec.model_dump(mode="json") for spec in builtin_catalog().values()]


@router.get("/clusters/named", response_model=list[NamedClusterPublic])
def named_clusters(_: ReadKey) -> list[NamedClusterPublic]:
    """Built-in clusters (``random:SEED`` shown for seed 0)."""
    out = []
    for entry in list_named_clusters():
        example = entry.name.replace("SEED", "0")
        summary = describe(Cluster.from_spec(named_spec(example)))
        out.append(
            NamedClusterPublic(name=entry.name, description=entry.description, summary=summary)
        )
    return out


@router.post("/clusters", status_code=201, response_model=ClusterPublic)
def create_cluster(
    session: SessionDep,
    settings: SettingsDep,
    _: SubmitKey,
    spec: Annotated[dict[str, Any], Body(description="a cluster spec: machines, network")],
) -> ClusterPublic:
    """Store a cluster spec; its id can stand for the cluster in jobs and strategy queries."""
    row = store_cluster(session, cluster_from_input(settings, spec))
    return ClusterPublic.model_validate(row, from_attributes=True)


@router.get("/clusters/{cluster_id}", response_model=ClusterPublic)
def get_cluster(cluster_id: str, session: SessionDep, _: ReadKey) -> ClusterPublic:
    """A stored cluster with its canonical fingerprint."""
    row = session.get(ClusterRow, cluster_id)
    if row is None:
        raise Problem(404, f"cluster {cluster_id} does not exist")
    return ClusterPublic.model_validate(row, from_attributes=True)
