"""``/v1/gpu-types`` and ``/v1/clusters``: what clusters can be made of, and stored ones."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body

from tagplan.db.models import ClusterRow
from tagplan.planner.topology import (
    Cluster,
    builtin_catalog,
    describe,
    list_named_clusters,
    parse_cluster_spec,
)
from tagplan.planner.topology import named_cluster_spec as named_spec
from tagplan.service.deps import ReadKey, SessionDep, SettingsDep, SubmitKey
from tagplan.service.intake import cluster_from_input, store_cluster
from tagplan.service.schemas import ClusterPublic, NamedClusterPublic
from tagplan.service.tenancy import find_held

router = APIRouter(prefix="/v1", tags=["catalog"])


@router.get("/gpu-types")
def gpu_types(_: ReadKey) -> list[dict[str, Any]]:
    """The built-in GPU catalog with public peak figures (a spec may add its own types)."""
    return [spec.model_dump(mode="json") for spec in builtin_catalog().values()]


@router.get("/clusters/named", response_model=list[NamedClusterPublic])
def named_clusters(_: ReadKey) -> list[NamedClusterPublic]:
    """Built-in clusters, each summarized by its example (``random:SEED`` by seed 0)."""
    out = []
    for entry in list_named_clusters():
        summary = describe(Cluster.from_spec(named_spec(entry.example)))
        out.append(
            NamedClusterPublic(
                name=entry.name,
                description=entry.description,
                example=entry.example,
                summary=summary,
            )
        )
    return out


@router.post("/clusters", status_code=201, response_model=ClusterPublic)
def create_cluster(
    session: SessionDep,
    settings: SettingsDep,
    caller: SubmitKey,
    spec: Annotated[dict[str, Any], Body(description="a cluster spec: machines, network")],
) -> ClusterPublic:
    """Store a cluster spec; its id can stand for the cluster in the tenant's jobs and
    strategy queries."""
    row = store_cluster(session, cluster_from_input(settings, spec), tenant=caller.tenant)
    return ClusterPublic.model_validate(row, from_attributes=True)


@router.get("/clusters/{cluster_id}", response_model=ClusterPublic)
def get_cluster(cluster_id: str, session: SessionDep, caller: ReadKey) -> ClusterPublic:
    """A stored cluster with its canonical fingerprint (404 unless the tenant holds it)."""
    row, _ = find_held(session, caller, ClusterRow, "cluster", cluster_id)
    return ClusterPublic.model_validate(row, from_attributes=True)


def cluster_layout(cluster: Cluster) -> dict[str, Any]:
    """A cluster as the dashboard draws it: machines, device groups (indexed as strategies
    name them), GPUs with their memory, and the bandwidth between machines."""
    bandwidth = cluster.machine_bandwidth_bytes_per_s
    return {
        "machines": [
            {
                "name": name,
                "gpus": int((cluster.device_machine == m).sum()),
                "intra_gbps": float(cluster.machine_intra_bandwidth_bytes_per_s[m]) * 8e-9,
            }
            for m, name in enumerate(cluster.machine_names)
        ],
        "groups": [
            {
                "index": g,
                "name": cluster.group_names[g],
                "machine": int(cluster.group_machine[g]),
                "type": cluster.group_type_name(g),
                "gpus": int(cluster.group_size[g]),
            }
            for g in range(cluster.num_groups)
        ],
        "devices": [
            {
                "name": name,
                "machine": int(cluster.device_machine[d]),
                "type": cluster.type_names[int(cluster.device_type[d])],
                "memory_bytes": int(cluster.device_memory_bytes[d]),
            }
            for d, name in enumerate(cluster.device_names)
        ],
        "links": [
            {"between": [a, b], "gbps": float(bandwidth[a, b]) * 8e-9}
            for a in range(cluster.num_machines)
            for b in range(a + 1, cluster.num_machines)
        ],
    }


@router.get("/clusters/{cluster_id}/layout")
def get_cluster_layout(cluster_id: str, session: SessionDep, caller: ReadKey) -> dict[str, Any]:
    """The stored cluster's machines, device groups, GPUs and links (:func:`cluster_layout`)."""
    row, _ = find_held(session, caller, ClusterRow, "cluster", cluster_id)
    return cluster_layout(Cluster.from_spec(parse_cluster_spec(row.spec)))
