"""Request and response bodies of the REST API (pydantic v2), apart from the tables."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "CheckpointPublic",
    "ClusterPublic",
    "GraphInput",
    "GraphPublic",
    "JobCreate",
    "JobLinks",
    "JobPublic",
    "JobsPublic",
    "NamedClusterPublic",
    "PlanOptionsIn",
    "ProfilePublic",
    "Progress",
    "ResultPublic",
    "Status",
    "StrategiesPublic",
    "StrategyPublic",
]

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class GraphInput(BaseModel):
    """Exactly one of ``id`` (from ``POST /v1/graphs``), ``base64`` or ``zoo``."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, description="id of a graph uploaded earlier")
    base64: str | None = Field(
        default=None, description="GraphDef (binary or text, optionally gzip) or graph JSON"
    )
    zoo: str | None = Field(default=None, description="name of a model-zoo graph, e.g. vgg19")
    batch_inputs: list[str] | None = Field(
        default=None, description="nodes feeding training data (default: rank >= 1 placeholders)"
    )
    loss: str | None = Field(default=None, description="loss node (default: 'loss')")

    @model_validator(mode="after")
    def _exactly_one(self) -> GraphInput:
        given = [k for k in ("id", "base64", "zoo") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of graph.id, graph.base64, graph.zoo")
        return self


class PlanOptionsIn(BaseModel):
    """Planner options (see ``tagplan.planner.plan.PlanOptions``)."""

    model_config = ConfigDict(extra="forbid")

    budget_s: float = Field(default=60.0, gt=0, description="wall-clock search budget")
    iterations: int | None = Field(default=None, gt=0, description="search iteration cap")
    seed: int = Field(default=0, ge=0)
    sfb: bool = Field(default=True, description="sufficient-factor broadcast on/off")
    shards: int = Field(default=1, ge=1, description="root-parallel search trees (workers)")
    max_groups: int = Field(default=60, ge=1)
    profiles: list[str] = Field(
        default_factory=list,
        description="ids of stored profiles the cost model uses (op profiles, at most one comm)",
    )


class JobCreate(BaseModel):
    """``POST /v1/jobs``: a graph, the allocated cluster, batch size and options."""

    model_config = ConfigDict(extra="forbid")

    graph: GraphInput
    cluster: str | dict[str, Any] = Field(
        description="a named cluster (testbed, cloud, random:SEED), a stored cluster id, "
        "or an inline cluster spec"
    )
    batch_size: int | None = Field(default=None, gt=0)
    options: PlanOptionsIn = Field(default_factory=PlanOptionsIn)


class Progress(BaseModel):
    iterations: int
    best_speedup: float | None
    best_step_time_s: float | None


class JobLinks(BaseModel):
    self: str
    result: str
    graphdef: str
    device_map: str
    trace: str


class JobPublic(BaseModel):
    id: str
    status: Status
    phase: str | None
    progress: Progress
    graph_id: str
    cluster_id: str
    batch_size: int | None
    options: dict[str, Any]
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    links: JobLinks
    existing: bool = Field(default=False, description="an identical job was submitted before")


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int
    limit: int
    offset: int


class ResultPublic(BaseModel):
    """The plan: strategy, predicted step, every baseline, lower bound, memory per GPU."""

    model_config = ConfigDict(extra="allow")

    job_id: str
    graph_fingerprint: str
    cluster_fingerprint: str
    batch_size: int
    step_time_s: float
    baselines: dict[str, float | None]
    lower_bound_s: float
    speedup_vs_dp_nccl: float | None
    peak_memory_bytes: dict[str, int]
    estimated: dict[str, Any]
    strategy: dict[str, Any]


class StrategyPublic(BaseModel):
    job_id: str
    graph_fingerprint: str
    cluster_fingerprint: str
    cluster_id: str
    batch_size: int
    step_time_s: float
    speedup_vs_dp_nccl: float | None
    peak_memory_bytes: dict[str, int]
    strategy: dict[str, Any]
    remapped: bool = Field(description="rewritten from an isomorphic cluster's numbering")
    created_at: datetime


class StrategiesPublic(BaseModel):
    data: list[StrategyPublic]
    count: int


class GraphPublic(BaseModel):
    id: str
    fingerprint: str
    num_nodes: int
    size_bytes: int
    label: str
    created_at: datetime


class ClusterPublic(BaseModel):
    id: str
    fingerprint: str
    num_gpus: int
    spec: dict[str, Any]


class NamedClusterPublic(BaseModel):
    name: str
    description: str
    summary: dict[str, Any]


class CheckpointPublic(BaseModel):
    id: str
    name: str
    meta: dict[str, Any]
    created_at: datetime


class ProfilePublic(BaseModel):
    id: str
    name: str
    kind: Literal["op", "comm"]
    meta: dict[str, Any]
    created_at: datetime
