"""Request and response bodies of the REST API (pydantic v2), apart from the tables.

Every number a request carries is bounded here, below what its column holds (``Integer``
is int32 on PostgreSQL) and finite, so out-of-range input is a 422 naming the field and
never reaches the database; SQLite, which stores any integer, would hide the difference.
"""

from __future__ import annotations

from dataclasses import fields
from datetime import datetime
from typing import Annotated, Any, Literal, get_type_hints

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model, model_validator

from tagplan.planner.options import PlanOptions

__all__ = [
    "INT32_MAX",
    "MAX_BUDGET_S",
    "MAX_GROUPS",
    "MAX_NAME_CHARS",
    "MAX_NODE_NAME_CHARS",
    "MAX_SHARDS",
    "SERVER_SIDE_OPTIONS",
    "ActivePriorPublic",
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
    "plan_option_fields",
]

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]

INT32_MAX = 2**31 - 1
"""The largest value of an ``Integer`` column on PostgreSQL."""
MAX_BUDGET_S = 7 * 24 * 3600.0
"""A week: the schema's bound; the service's ``max_budget_s`` setting is usually lower."""
MAX_SHARDS = 4096
"""The schema's bound; the service's ``max_shards`` setting is usually lower."""
MAX_GROUPS = 100_000
MAX_NAME_CHARS = 200
"""Names: clusters (``random:SEED``: a seed of at most this many digits), zoo models."""
MAX_NODE_NAME_CHARS = 500
"""Graph node names (the loss node's column holds this many)."""


def _no_nul(text: str) -> str:
    """Refuse a NUL character, which no text column stores."""
    if "\x00" in text:
        raise ValueError("must not contain a NUL character")
    return text


Digest = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_no_nul)]
"""An id of a content-addressed row: the hex SHA-256 of its content."""
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS), AfterValidator(_no_nul)]
NodeName = Annotated[
    str, Field(min_length=1, max_length=MAX_NODE_NAME_CHARS), AfterValidator(_no_nul)
]


class GraphInput(BaseModel):
    """Exactly one of ``id`` (from ``POST /v1/graphs``), ``base64`` or ``zoo``."""

    model_config = ConfigDict(extra="forbid")

    id: Digest | None = Field(default=None, description="id of a graph uploaded earlier")
    base64: str | None = Field(
        default=None, description="GraphDef (binary or text, optionally gzip) or graph JSON"
    )
    zoo: Name | None = Field(default=None, description="name of a model-zoo graph, e.g. vgg19")
    batch_inputs: list[NodeName] | None = Field(
        default=None,
        max_length=1000,
        description="nodes feeding training data (default: rank >= 1 placeholders)",
    )
    loss: NodeName | None = Field(default=None, description="loss node (default: 'loss')")

    @model_validator(mode="after")
    def _exactly_one(self) -> GraphInput:
        given = [k for k in ("id", "base64", "zoo") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of graph.id, graph.base64, graph.zoo")
        return self


_REQUEST_BOUNDS: dict[str, dict[str, Any]] = {
    "budget_s": {
        "gt": 0,
        "le": MAX_BUDGET_S,
        "allow_inf_nan": False,
        "description": "the whole plan's budget, every phase included",
    },
    "iterations": {"gt": 0, "le": INT32_MAX, "description": "search iteration cap"},
    "seed": {"ge": 0, "le": INT32_MAX},
    "sfb": {"description": "sufficient-factor broadcast on/off"},
    "pipeline": {"description": "weigh pipelined strategies (stages over micro-batches) too"},
    "every_baseline": {
        "description": "simulate every baseline, also those a bound shows slower than one "
        "simulated before (they cannot be the plan)"
    },
    "max_groups": {"ge": 1, "le": MAX_GROUPS},
    "shards": {"ge": 1, "le": MAX_SHARDS, "description": "root-parallel search trees (workers)"},
}
"""The bounds and descriptions of the planner options a request may set."""
SERVER_SIDE_OPTIONS = frozenset({"max_actions", "patience", "by_class"})
"""Planner options a request may not set: search tuning every job runs with at the
planner's defaults (and out of the job's identity, so resubmissions still match)."""


def plan_option_fields(options: type[PlanOptions] = PlanOptions) -> dict[str, Any]:
    """Request fields for the planner ``options`` a request may set: each with the
    planner's type and default and the bounds of ``_REQUEST_BOUNDS``.

    Every option must be either bounded there or listed in ``SERVER_SIDE_OPTIONS``, so a
    new planner option cannot silently be missing from the API (``TypeError`` otherwise).
    """
    names = {option.name for option in fields(options)}
    unplaced = names - _REQUEST_BOUNDS.keys() - SERVER_SIDE_OPTIONS
    stale = (_REQUEST_BOUNDS.keys() | SERVER_SIDE_OPTIONS) - names
    if unplaced or stale:
        raise TypeError(
            f"planner options {sorted(unplaced)} need request bounds or a place in "
            f"SERVER_SIDE_OPTIONS; {sorted(stale)} are no planner options"
        )
    types = get_type_hints(options)
    return {
        option.name: (types[option.name], Field(default=option.default, **bounds))
        for option in fields(options)
        if (bounds := _REQUEST_BOUNDS.get(option.name)) is not None
    }


_PlannerOptionsIn = create_model(
    "_PlannerOptionsIn", __config__=ConfigDict(extra="forbid"), **plan_option_fields()
)


class PlanOptionsIn(_PlannerOptionsIn):
    """The planner's options a request may set (types and defaults those of
    :class:`~tagplan.planner.options.PlanOptions`), bounded for the database, and the
    stored profiles the job's cost model uses."""

    profiles: list[Digest] = Field(
        default_factory=list,
        max_length=100,
        description="ids of stored profiles the cost model uses (op profiles, at most one comm)",
    )
    fresh: bool = Field(
        default=False,
        description="search even when a cached plan answers the job; the search starts "
        "from that plan, so the answer is never slower",
    )
    deadline_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_BUDGET_S,
        allow_inf_nan=False,
        description="anytime: answer with the best plan found by then (complete: false "
        "when the search had not finished)",
    )
    refine_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_BUDGET_S,
        allow_inf_nan=False,
        description="with deadline_s: search this much longer in the background after an "
        "incomplete answer, improving the cached plan (the job's refined_by)",
    )


class JobCreate(BaseModel):
    """``POST /v1/jobs``: a graph, the allocated cluster, batch size and options."""

    model_config = ConfigDict(extra="forbid")

    graph: GraphInput
    cluster: Name | dict[str, Any] = Field(
        description="a named cluster (testbed, cloud, random:SEED), a stored cluster id, "
        "or an inline cluster spec"
    )
    batch_size: int | None = Field(default=None, gt=0, le=INT32_MAX)
    options: PlanOptionsIn = Field(default_factory=PlanOptionsIn)


class Progress(BaseModel):
    iterations: int
    best_speedup: float | None
    best_step_time_s: float | None
    history: list[list[float]] = Field(
        default_factory=list,
        description="[seconds since the job started, iterations, best step time in "
        "seconds] at each improvement of the best step",
    )


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
    dispatches: int = Field(
        description="times the job's workflow was sent to the workers: 1, plus one for each "
        "recovery after the broker lost it"
    )
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    links: JobLinks
    existing: bool = Field(default=False, description="an identical job was submitted before")
    submitted_by: str | None = Field(default=None, description="the submitting key's name")
    label: str | None = Field(default=None, description="the graph's label (zoo:NAME, upload)")
    refines: str | None = Field(
        default=None, description="the anytime job whose answer this job improves"
    )
    refined_by: str | None = Field(
        default=None, description="the job improving this job's answer in the background"
    )


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
    comm_bound_s: float | None = Field(
        default=None,
        description="the step no strategy of the search's actions beats, counting communication",
    )
    speedup_vs_dp_nccl: float | None
    best_data_parallel: str | None = Field(
        default=None, description="the fastest data-parallel baseline that fits"
    )
    speedup_vs_best_data_parallel: float | None = Field(
        default=None, description="the headline: the margin over that baseline"
    )
    peak_memory_bytes: dict[str, int]
    estimated: dict[str, Any]
    strategy: dict[str, Any]
    plan_time_s: float | None = Field(
        default=None, description="wall time from the job's start to its result"
    )
    queued_s: float | None = Field(default=None, description="time queued before it started")
    phases: dict[str, Any] = Field(
        default_factory=dict, description="per phase: status, seconds, note"
    )
    source: Literal["search", "cache"] = Field(
        default="search", description="planned by a search, or answered from the cache"
    )
    cached_from: str | None = Field(
        default=None, description="the job whose cached plan answered this one"
    )
    warm_start: dict[str, Any] | None = Field(
        default=None,
        description="the cached plan the search started from: its job and how near it was "
        "(same plan, batch size, machines)",
    )
    complete: bool = Field(
        default=True, description="false for an anytime job's best plan at its deadline"
    )
    prior: str = Field(
        default="uniform",
        description="the search's prior: gnn:<digest> of the checkpoint that guided it, or uniform",
    )
    prior_note: str | None = Field(
        default=None,
        description="why the prior is not the checkpoint the job recorded (a worker "
        "without torch searches with the uniform prior)",
    )
    graphdef_deferred: bool = Field(
        default=False,
        description="the GraphDef's compile did not fit in the budget: the answer came "
        "first and a step of its own compiles it (the GraphDef and device map answer 409 "
        "with Retry-After until then)",
    )
    graphdef_error: str | None = Field(
        default=None,
        description="why the GraphDef compiled after the answer is missing (that step "
        "failed: its time limit, its worker lost); the answer stands",
    )


class StrategyPublic(BaseModel):
    job_id: str
    graph_fingerprint: str
    cluster_fingerprint: str
    cluster_id: str
    batch_size: int
    step_time_s: float
    speedup_vs_dp_nccl: float | None
    speedup_vs_best_data_parallel: float | None = None
    peak_memory_bytes: dict[str, int]
    strategy: dict[str, Any]
    remapped: bool = Field(description="rewritten from an isomorphic cluster's numbering")
    source: Literal["search", "cache"] = "search"
    prior: str = Field(default="uniform", description="the prior of the search that made it")
    stale: bool = Field(
        default=False,
        description="made by another planner version: listed, never used to answer a job",
    )
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
    example: str = Field(description="a name a job can give (random:SEED as random:0)")
    summary: dict[str, Any]


class CheckpointPublic(BaseModel):
    id: str
    name: str
    meta: dict[str, Any]
    created_at: datetime
    active: bool = Field(
        default=False, description="the checkpoint guiding the searches of new jobs"
    )


class ActivePriorPublic(BaseModel):
    """The prior that guides the searches of jobs submitted now (``/v1/checkpoints/active``)."""

    prior: str = Field(
        description="what a job submitted now records as options.prior: "
        "'checkpoint:<id>' of the active checkpoint, or 'shipped'"
    )
    checkpoint: CheckpointPublic | None = Field(
        default=None,
        description="the active checkpoint (null: none is active, or the caller's tenant "
        "does not hold it)",
    )
    activated_at: datetime | None = None
    activated_by: str | None = Field(
        default=None, description="the id of the key that activated it (tagplan keys list)"
    )
    shipped: str = Field(
        description="the prior of the checkpoint the package ships (gnn:<first 12 hex digits "
        "of its weights' sha256>), used while none is active"
    )


class ProfilePublic(BaseModel):
    id: str
    name: str
    kind: Literal["op", "comm"]
    meta: dict[str, Any]
    created_at: datetime
