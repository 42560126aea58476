"""What each task does, apart from Celery: read inputs by job id, run the planner, upsert.

Every step is idempotent: its output is stored under ``(job_id, step)`` and a rerun that
finds it does nothing, so a redelivered task (worker killed, visibility timeout) repeats
at most the unfinished work. The planning work (analysis, search, compile, simulation, and
with them numba, PuLP, METIS and TensorFlow) is imported here, lazily: the API process, which
only validates and enqueues, loads the planner's intake modules (graph parsing and analysis,
topology, profiles, options) and nothing of the search, the compiler or the simulator
(``tests/service/test_imports.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from tagplan.db import job_state
from tagplan.db.blobs import get_blob, put_blob
from tagplan.db.models import ClusterRow, GraphRow, Job, JobStatus, Profile, Result
from tagplan.db.session import session_scope
from tagplan.planner.errors import InvalidInput
from tagplan.settings import Settings
from tagplan.workers.monitor import JobMonitor

if TYPE_CHECKING:  # the planner's types, without importing its modules at run time
    from tagplan.planner.budget import Deadline
    from tagplan.planner.cost.comm import CommModel
    from tagplan.planner.cost.profile import ProfileSource
    from tagplan.planner.graph.ir import GraphIR
    from tagplan.planner.options import PlanOptions
    from tagplan.planner.topology import Cluster

__all__ = [
    "JobInputs",
    "analyze_step",
    "finish_step",
    "job_options",
    "load_inputs",
    "search_step",
    "shard_step",
]


@dataclass(frozen=True, eq=False)
class JobInputs:
    """A job's graph (parsed and analyzed), cluster, planner options, cost models, the
    deadline of its budget (fixed when the job started, shared by every step) and what
    its analyze step prepared for the others (grouping, baselines), if it has run."""

    graph_def: Any  # a GraphDef message of the planner's protobuf descriptors
    ir: GraphIR
    cluster: Cluster
    options: PlanOptions
    profiles: ProfileSource | None
    comm: CommModel | None
    deadline: Deadline
    prepared: dict[str, Any] | None = None


def shard_step(shard: int) -> str:
    """Step name of root-parallel search shard ``shard`` (sortable)."""
    return f"shard:{shard:03d}"


def load_inputs(settings: Settings, job_id: str) -> JobInputs:
    """Read the job's graph and cluster from the database and analyze the graph."""
    from tagplan.planner.budget import Deadline
    from tagplan.planner.graph.analyzer import analyze
    from tagplan.planner.graph.load import loads_graph_def
    from tagplan.planner.options import PlanOptions, option_names
    from tagplan.planner.topology import load_cluster

    with session_scope(settings.sqlalchemy_url) as session:
        job = session.get(Job, job_id)
        if job is None:
            raise InvalidInput(f"job {job_id} does not exist")
        graph = session.get(GraphRow, job.graph_id)
        spec = session.get(ClusterRow, job.cluster_id).spec
        data = get_blob(session, graph.blob_digest)
        batch_inputs, loss, batch_size = job.batch_inputs, job.loss, job.batch_size
        options = {k: v for k, v in job.options.items() if k in option_names()}
        documents = _profile_documents(session, job.options.get("profiles", []))
        started_at = job.started_at or datetime.now(UTC)
        analyzed = job_state.step_output(session, job_id=job_id, step="analyze") or {}
    graph_def = loads_graph_def(data, max_bytes=settings.max_graph_bytes)
    ir = analyze(graph_def, batch_size=batch_size, batch_inputs=batch_inputs, loss=loss)
    if ir.num_ops > settings.max_ops:
        raise InvalidInput(
            f"the graph has {ir.num_ops} ops after simplification; the limit is {settings.max_ops}"
        )
    cluster = load_cluster(spec)
    profiles, comm = _cost_models(cluster, documents)
    plan_options = PlanOptions(**options)
    if started_at.tzinfo is None:  # stored as UTC; SQLite gives it back naive
        started_at = started_at.replace(tzinfo=UTC)
    deadline = Deadline.after(plan_options.budget_s, start_s=started_at.timestamp())
    return JobInputs(
        graph_def,
        ir,
        cluster,
        plan_options,
        profiles,
        comm,
        deadline,
        analyzed.get("prepared"),
    )


def _profile_documents(session: Any, ids: list[str]) -> list[tuple[str, bytes]]:
    """(kind, JSON bytes) of the stored profiles ``ids``."""
    rows = session.scalars(select(Profile).where(Profile.id.in_(ids))).all() if ids else []
    return [(row.kind, get_blob(session, row.blob_digest)) for row in rows]


def _cost_models(
    cluster: Cluster, documents: list[tuple[str, bytes]]
) -> tuple[ProfileSource | None, CommModel | None]:
    """The op-time source and communication model of the job's profiles (None: analytic)."""
    from tagplan.planner.cost.comm import CommModel
    from tagplan.planner.cost.comm_profile import loads_comm_profile
    from tagplan.planner.cost.profile import InMemoryProfileSource, load_profile

    ops = [load_profile(data) for kind, data in documents if kind == "op"]
    comm = [loads_comm_profile(data.decode()) for kind, data in documents if kind == "comm"]
    return (
        InMemoryProfileSource(ops) if ops else None,
        CommModel(cluster, comm[0]) if comm else None,
    )


def job_options(settings: Settings, job_id: str) -> dict[str, Any]:
    """The options the job was submitted with."""
    with session_scope(settings.sqlalchemy_url) as session:
        return dict(session.get(Job, job_id).options)


def analyze_step(settings: Settings, job_id: str) -> None:
    """Check that the graph analyzes and fits the limits before any search starts, then
    group it and score the baselines once for every later step."""
    url = settings.sqlalchemy_url
    with session_scope(url) as session:
        if job_state.step_output(session, job_id=job_id, step="analyze") is not None:
            return
    inputs = load_inputs(settings, job_id)
    planner = _planner(inputs, JobMonitor(url, job_id))
    with session_scope(url) as session:
        job_state.save_step(
            session,
            job_id=job_id,
            step="analyze",
            output={
                "ops": inputs.ir.num_ops,
                "parameters": len(inputs.ir.parameters),
                "batch_size": inputs.ir.batch_size,
                "graph_fingerprint": inputs.ir.fingerprint,
                "prepared": planner.prepared(),
            },
        )


FINISH_PHASES = frozenset({"sfb", "compile"})


def _planner(inputs: JobInputs, monitor: JobMonitor) -> Any:
    from tagplan.planner.plan import Planner

    return Planner(
        inputs.ir,
        inputs.cluster,
        options=inputs.options,
        profiles=inputs.profiles,
        comm=inputs.comm,
        progress=monitor.progress,
        cancel=monitor.cancelled,
        deadline=inputs.deadline,
        prepared=inputs.prepared,
    )


def search_step(settings: Settings, job_id: str, shard: int, seed: int) -> None:
    """One root-parallel search tree; its outcome is stored as the shard's step output."""
    url = settings.sqlalchemy_url
    step = shard_step(shard)
    with session_scope(url) as session:
        if job_state.step_output(session, job_id=job_id, step=step) is not None:
            return
    inputs = load_inputs(settings, job_id)
    outcome = _planner(inputs, JobMonitor(url, job_id)).search_shard(seed)
    with session_scope(url) as session:
        job_state.save_step(session, job_id=job_id, step=step, output=outcome.to_dict())


def finish_step(settings: Settings, job_id: str, shards: int) -> None:
    """Merge the shards, run SFB and compile, store the result and mark the job succeeded."""
    from tagplan.planner.plan import SearchOutcome
    from tagplan.planner.topology import fingerprint

    url = settings.sqlalchemy_url
    with session_scope(url) as session:
        if session.get(Result, job_id) is not None:
            job_state.finish_job(session, job_id=job_id, status=JobStatus.SUCCEEDED)
            return
        stored = job_state.step_outputs(session, job_id=job_id, prefix="shard:")
    if len(stored) < shards:
        raise RuntimeError(f"{shards - len(stored)} of {shards} search shards have no outcome")
    inputs = load_inputs(settings, job_id)
    outcomes = [SearchOutcome.from_dict(stored[name]) for name in sorted(stored)]
    monitor = JobMonitor(url, job_id, phases=FINISH_PHASES)
    result = _planner(inputs, monitor).finish(outcomes, graph_def=inputs.graph_def)
    summary = json.loads(json.dumps(result.summary()))
    trace = json.dumps(result.chrome_trace(), separators=(",", ":")).encode()
    distributed = result.distributed
    with session_scope(url) as session:
        if not job_state.finish_job(session, job_id=job_id, status=JobStatus.SUCCEEDED):
            return  # cancelled while compiling: keep nothing
        session.add(
            Result(
                job_id=job_id,
                graph_fingerprint=inputs.ir.fingerprint,
                cluster_fingerprint=fingerprint(inputs.cluster),
                batch_size=inputs.ir.batch_size,
                step_time_s=float(result.step_time_s),
                summary=summary,
                device_map=json.loads(json.dumps(distributed.device_map)) if distributed else None,
                graphdef_digest=(
                    put_blob(session, distributed.graph_def.SerializeToString())
                    if distributed
                    else None
                ),
                trace_digest=put_blob(session, trace),
            )
        )
