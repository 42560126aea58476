"""SQLAlchemy 2 tables (docs/design.md §9). The database is the source of truth for job state.

Large payloads (graphs, distributed GraphDefs, traces, profiles, checkpoints) live once in
``blobs``, keyed by the SHA-256 of their content; rows refer to them by digest.

Ownership: every API key belongs to a tenant. A job carries its submitter's tenant (its
result, GraphDef and trace go with it). Graphs, clusters, profiles and checkpoints are
stored once by content, so two tenants uploading the same bytes share one row: who holds
a row is the separate relation ``holdings`` (tenant, kind, id), with each tenant's own
label for it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    text,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "PRIOR_SLOT",
    "ActiveCheckpoint",
    "ApiKey",
    "Base",
    "Blob",
    "Checkpoint",
    "ClusterRow",
    "GraphRow",
    "Holding",
    "Job",
    "JobStatus",
    "JobStep",
    "Profile",
    "Result",
    "utcnow",
]


def utcnow() -> datetime:
    """Timezone-aware now; stored as UTC."""
    return datetime.now(UTC)


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)


LIVE_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.SUCCEEDED)
"""A job in these answers its key; a failed or cancelled one is retried by a new job."""
LIVE = text("status IN ('queued', 'running', 'succeeded')")

TENANT_CHARS = 80
"""A tenant: a name given to ``tagplan keys create --tenant`` (64 characters at most) or
``key:<key id>`` for a key created without one."""


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: JSON,
        datetime: DateTime(timezone=True),
    }


class Blob(Base):
    """Content-addressed bytes (zlib-compressed in ``data``)."""

    __tablename__ = "blobs"
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    size_bytes: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class GraphRow(Base):
    """An uploaded training graph; ``id`` is the digest of its bytes."""

    __tablename__ = "graphs"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    blob_digest: Mapped[str] = mapped_column(ForeignKey("blobs.digest"))
    num_nodes: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(Integer)
    label: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ClusterRow(Base):
    """A cluster spec; ``id`` hashes the spec as given, ``fingerprint`` is canonical."""

    __tablename__ = "clusters"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), index=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    num_gpus: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    """An API key: only the SHA-256 of its secret is stored."""

    __tablename__ = "api_keys"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    secret_hash: Mapped[str] = mapped_column(String(64))
    scopes: Mapped[str] = mapped_column(String(200))
    """Space-separated scopes."""
    rate_limit_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tenant: Mapped[str] = mapped_column(String(TENANT_CHARS))
    """Whose jobs and uploads the key's requests make and (without ``operate``) see."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)


class Holding(Base):
    """A tenant holds a content-addressed row: it uploaded it or a job of its stored it.

    ``kind`` names the table (``graph``, ``cluster``, ``profile``, ``checkpoint``) and
    ``ref`` its id; no foreign key, as ``ref`` points into one of four tables (whose rows
    are never deleted). ``label`` is the tenant's own name for the row (a graph's label, a
    profile's or checkpoint's name), so one tenant never sees another's.
    """

    __tablename__ = "holdings"
    tenant: Mapped[str] = mapped_column(String(TENANT_CHARS), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    ref: Mapped[str] = mapped_column(String(64), primary_key=True)
    label: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Job(Base):
    """A planning job; status, phase and progress are written by the workers."""

    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    key: Mapped[str] = mapped_column(String(64), index=True)
    """Hash of everything that determines the answer: identical submissions share it."""
    graph_id: Mapped[str] = mapped_column(ForeignKey("graphs.id"))
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id"))
    batch_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    batch_inputs: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    loss: Mapped[str | None] = mapped_column(String(500), nullable=True)
    options: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED, index=True)
    phase: Mapped[str | None] = mapped_column(String(16), nullable=True)
    iterations: Mapped[int] = mapped_column(Integer, default=0)
    best_step_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    best_speedup: Mapped[float | None] = mapped_column(Float, nullable=True)
    history: Mapped[list[list[float]] | None] = mapped_column(JSON, nullable=True)
    """The search's progress over time: ``[seconds since start, iterations, best step
    time in seconds]`` at each improvement (``workers/monitor.py``)."""
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    refines: Mapped[str | None] = mapped_column(String(36), nullable=True)
    """The anytime job whose answer this job goes on improving (its ``refine_s``)."""
    refined_by: Mapped[str | None] = mapped_column(String(36), nullable=True)
    """The job improving this one's answer in the background."""
    dispatches: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    """Times the job's workflow was sent to the broker: 1, plus one per recovery of a lost
    job (:mod:`tagplan.workers.sweeper`)."""
    api_key_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    tenant: Mapped[str] = mapped_column(String(TENANT_CHARS), index=True)
    """The submitting key's tenant: only it (and operators) see the job and its result."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True)
    latency_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    """Seconds from submission to the final status (the plan latency metric)."""
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (
        # one live job per tenant and key: identical submissions of one tenant arriving
        # together get one job
        Index(
            "uq_jobs_live_tenant_key",
            "tenant",
            "key",
            unique=True,
            sqlite_where=LIVE,
            postgresql_where=LIVE,
        ),
    )


class JobStep(Base):
    """A step's output keyed by ``(job_id, step)``: a rerun finds it and does nothing."""

    __tablename__ = "job_steps"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    step: Mapped[str] = mapped_column(String(32), primary_key=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    output: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Result(Base):
    """A finished plan; with its job's graph and cluster it is the strategy cache."""

    __tablename__ = "results"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    graph_fingerprint: Mapped[str] = mapped_column(String(64))
    cluster_fingerprint: Mapped[str] = mapped_column(String(64))
    batch_size: Mapped[int] = mapped_column(Integer)
    step_time_s: Mapped[float] = mapped_column(Float)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON)
    device_map: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    graphdef_digest: Mapped[str | None] = mapped_column(ForeignKey("blobs.digest"), nullable=True)
    trace_digest: Mapped[str | None] = mapped_column(ForeignKey("blobs.digest"), nullable=True)
    lanes_digest: Mapped[str | None] = mapped_column(ForeignKey("blobs.digest"), nullable=True)
    """The trace per GPU and link (:mod:`tagplan.planner.trace_lanes`), for the dashboard."""
    cost_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """Digest of the cost inputs the plan was computed with (``workers/cache.py``); a
    result answers another job only under the same key. None: made before keys existed."""
    planner_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    source: Mapped[str] = mapped_column(String(16), default="search", server_default="search")
    """``search`` (planned) or ``cache`` (answered from ``cached_from``'s result)."""
    cached_from: Mapped[str | None] = mapped_column(String(36), nullable=True)
    complete: Mapped[bool] = mapped_column(default=True, server_default=true())
    """False for an anytime job's answer at its deadline, before the search had finished."""
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    __table_args__ = (Index("ix_results_cache", "graph_fingerprint", "cluster_fingerprint"),)


class Analysis(Base):
    """An analyzed graph (a pickled :class:`~tagplan.planner.graph.ir.GraphIR`) by the
    digest of what it was analyzed from, so a job's steps and repeat jobs skip the
    analysis (``workers/analyses.py``). Written and read by workers only."""

    __tablename__ = "analyses"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    blob_digest: Mapped[str] = mapped_column(ForeignKey("blobs.digest"))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Profile(Base):
    """A measured op-time or communication profile uploaded by an operator."""

    __tablename__ = "profiles"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))
    """``op`` (``tagplan profile``) or ``comm`` (``tagplan profile-comm``)."""
    blob_digest: Mapped[str] = mapped_column(ForeignKey("blobs.digest"))
    meta: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class Checkpoint(Base):
    """A GNN prior checkpoint (``state_dict`` + metadata) managed by operators."""

    __tablename__ = "checkpoints"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    blob_digest: Mapped[str] = mapped_column(ForeignKey("blobs.digest"))
    meta: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


PRIOR_SLOT = "prior"
"""The key of the one row of :class:`ActiveCheckpoint`."""


class ActiveCheckpoint(Base):
    """The checkpoint whose prior guides the searches of jobs submitted from now on, one for
    the whole service (at most one row, under :data:`PRIOR_SLOT`); none: the checkpoint the
    package ships. Switching rewrites the row, so two operators switching at once leave one
    of their choices, never two."""

    __tablename__ = "active_checkpoint"
    slot: Mapped[str] = mapped_column(String(16), primary_key=True)
    checkpoint_id: Mapped[str] = mapped_column(ForeignKey("checkpoints.id"))
    activated_by: Mapped[str | None] = mapped_column(String(32), nullable=True)
    """The id of the key that activated it."""
    activated_at: Mapped[datetime] = mapped_column(default=utcnow)


class Lease(Base):
    """A named lease that one process holds at a time until ``expires_at`` (the job sweeper's:
    every API process runs a sweeper, one sweeps)."""

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[datetime] = mapped_column()
