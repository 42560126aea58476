"""What each task does, apart from Celery: read inputs by job id, run the planner, upsert.

Every step is idempotent: its output is stored under ``(job_id, step)`` and a rerun that
finds it does nothing, so a redelivered task (worker killed, visibility timeout) repeats
at most the unfinished work. The planning work (analysis, search, compile, simulation, and
with them numba, PuLP, METIS and TensorFlow) is imported here, lazily: the API process, which
only validates and enqueues, loads the planner's intake modules (graph parsing and analysis,
topology, profiles, options) and nothing of the search, the compiler or the simulator
(``tests/service/test_imports.py``).

Why one module: the steps are one job's stages and share its inputs (:class:`JobInputs`,
read and analyzed the same way by each), the planner built from them, and the one writer
of a job's result (:func:`_store_result`, with what follows an answer: its trace, its
GraphDef when the budget left it out, its refinement); split, each stage would import
the others' private helpers.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import select

from tagplan.db import job_state
from tagplan.db.blobs import get_blob, put_blob
from tagplan.db.models import ClusterRow, GraphRow, Job, JobStatus, Profile, Result
from tagplan.db.session import session_scope
from tagplan.planner.errors import InvalidInput
from tagplan.planner.strategy import load_strategy
from tagplan.planner.version import planner_version
from tagplan.settings import Settings
from tagplan.workers.analyses import analysis_key, stored_analysis
from tagplan.workers.cache import CachedPlan, cost_key, find_plans
from tagplan.workers.monitor import JobMonitor
from tagplan.workers.priors import SHIPPED, job_prior

if TYPE_CHECKING:  # the planner's types, without importing its modules at run time
    from tagplan.planner.budget import Deadline
    from tagplan.planner.cost.comm import CommModel
    from tagplan.planner.cost.profile import ProfileSource
    from tagplan.planner.graph.ir import GraphIR
    from tagplan.planner.options import PlanOptions
    from tagplan.planner.search.prior import Prior
    from tagplan.planner.strategy import Strategy
    from tagplan.planner.strategy_remap import ClusterMapping
    from tagplan.planner.topology import CanonicalOrder, Cluster

__all__ = [
    "Finished",
    "JobInputs",
    "add_refinement",
    "analyze_step",
    "finish_step",
    "graphdef_failed",
    "graphdef_step",
    "job_options",
    "load_inputs",
    "search_step",
    "shard_step",
]


@dataclass(frozen=True, eq=False)
class JobInputs:
    """A job's graph (parsed and analyzed), cluster, the options it was submitted with and
    the planner options they make, cost models, the deadline of its budget (fixed when the
    job started, shared by every step), its prior (:mod:`~.priors`) and what its analyze
    step prepared for the others (grouping, baselines, the cached plan the search starts
    from), if it has run."""

    graph_def: Any  # a GraphDef message of the planner's protobuf descriptors
    ir: GraphIR
    cluster: Cluster
    requested: dict[str, Any]  # the job's options as submitted
    options: PlanOptions
    profiles: ProfileSource | None
    comm: CommModel | None
    deadline: Deadline
    prior: Prior
    cost_key: str  # digest of the cost inputs, the prior's name included (:mod:`~.cache`)
    prior_note: str | None = None  # why ``prior`` is not the one the job recorded
    prepared: dict[str, Any] | None = None
    start: Strategy | None = None  # a cached plan's strategy the search starts from
    started_from: dict[str, Any] | None = None  # that plan's job_id and how near it was


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
        requested = dict(job.options)
        options = {k: v for k, v in requested.items() if k in option_names()}
        if requested.get("deadline_s") is not None:  # anytime: the answer is due then
            options["budget_s"] = min(options["budget_s"], requested["deadline_s"])
        documents = _profile_documents(session, requested.get("profiles", []))
        started_at = job.started_at or datetime.now(UTC)
        analyzed = job_state.step_output(session, job_id=job_id, step="analyze") or {}
    graph_def = loads_graph_def(data, max_bytes=settings.max_graph_bytes)
    ir = stored_analysis(
        settings.sqlalchemy_url,
        analysis_key(graph.blob_digest, batch_inputs, loss, batch_size),
        lambda: analyze(graph_def, batch_size=batch_size, batch_inputs=batch_inputs, loss=loss),
    )
    if ir.num_ops > settings.max_ops:
        raise InvalidInput(
            f"the graph has {ir.num_ops} ops after simplification; the limit is {settings.max_ops}"
        )
    cluster = load_cluster(spec)
    profiles, comm = _cost_models(cluster, documents)
    plan_options = PlanOptions(**options)
    prior, prior_note = job_prior(settings.sqlalchemy_url, requested.get("prior", SHIPPED))
    if started_at.tzinfo is None:  # stored as UTC; SQLite gives it back naive
        started_at = started_at.replace(tzinfo=UTC)
    deadline = Deadline.after(plan_options.budget_s, start_s=started_at.timestamp())
    start = analyzed.get("start")
    return JobInputs(
        graph_def,
        ir,
        cluster,
        requested,
        plan_options,
        profiles,
        comm,
        deadline,
        prior,
        cost_key(requested, prior.name),
        prior_note,
        analyzed.get("prepared"),
        load_strategy(start["strategy"]) if start else None,
        {"job_id": start["job_id"], "kind": start["kind"]} if start else None,
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


def analyze_step(settings: Settings, job_id: str) -> bool:
    """Check that the graph analyzes and fits the limits before any search starts; answer
    the job from the strategy cache when a plan for it exists (:mod:`~.cache`), else group
    it and score the baselines once for every later step, with a cached plan to start
    from when there is one. Returns whether the search is to run."""
    url = settings.sqlalchemy_url
    with session_scope(url) as session:
        done = job_state.step_output(session, job_id=job_id, step="analyze")
        if done is not None:
            return not done.get("cached_from")
    from tagplan.planner.topology import canonical_order

    inputs = load_inputs(settings, job_id)
    order = canonical_order(inputs.cluster)
    cached, start = _cached_plans(settings, job_id, inputs, order)
    if cached is not None:
        _answer_from_cache(settings, job_id, inputs, order, cached)
        return False
    if start is not None:
        inputs = replace(inputs, start=load_strategy(start["strategy"]))
    planner = _planner(inputs, JobMonitor(url, job_id))
    references = _references(planner)
    with session_scope(url) as session:
        job_state.save_step(session, job_id=job_id, step="references", output=references)
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
                "start": start,
            },
        )
    return True


def _references(planner: Any) -> dict[str, Any]:
    """What a running job's progress is measured against: every baseline's step (None:
    out of memory) and the lower bound, small enough to read at every poll."""
    return {
        "baselines": {
            name: None if score.oom else score.step_time_s
            for name, score in planner.baselines.items()
        },
        "lower_bound_s": planner.lower_bound_s(),
    }


def _cached_plans(
    settings: Settings, job_id: str, inputs: JobInputs, order: CanonicalOrder
) -> tuple[CachedPlan | None, dict[str, Any] | None]:
    """The cached plan that answers the job (None with ``fresh``), and the strategy its
    search starts from: that plan's (``fresh``) or a near miss's, adapted to the job's
    cluster (``order`` its canonical order), as ``{"strategy", "job_id", "kind"}``."""
    from tagplan.planner.search.warm_start import adapt_strategy
    from tagplan.planner.topology import load_cluster

    with session_scope(settings.sqlalchemy_url) as session:
        found, near = find_plans(
            session,
            session.get(Job, job_id),
            inputs.cluster,
            graph_fingerprint=inputs.ir.fingerprint,
            cluster_fingerprint=order.fingerprint,
            batch_size=inputs.ir.batch_size,
            key=inputs.cost_key,
        )
    if found is not None:
        if not inputs.requested.get("fresh", False):
            return found, None
        near = (found, "same plan")
    if near is None:
        return None, None
    plan, kind = near
    source = load_cluster(plan.spec)
    if plan.cluster_fingerprint == order.fingerprint:
        strategy = _mapping(source, inputs.cluster, order).strategy(plan.summary["strategy"])
    else:
        adapted = adapt_strategy(load_strategy(plan.summary["strategy"]), source, inputs.cluster)
        if adapted is None:
            return None, None
        strategy = adapted.model_dump(mode="json", exclude_none=True)
    return None, {"strategy": strategy, "job_id": plan.job_id, "kind": kind}


def _mapping(source: Cluster, target: Cluster, order: CanonicalOrder) -> ClusterMapping:
    """Source's numbering to the job's (``order``: the job cluster's canonical order)."""
    from tagplan.planner.strategy_remap import ClusterMapping
    from tagplan.planner.topology import canonical_order

    return ClusterMapping((source, canonical_order(source)), (target, order))


def _answer_from_cache(
    settings: Settings, job_id: str, inputs: JobInputs, order: CanonicalOrder, plan: CachedPlan
) -> None:
    """Complete the job from ``plan``: its strategy remapped to the job's numbering and
    re-simulated, its GraphDef renumbered (:mod:`tagplan.planner.replay`); the trace is
    written after the job has succeeded, so the answer does not wait for it."""
    from tagplan.planner.compile.renumber import renumber_graph
    from tagplan.planner.replay import replay_plan
    from tagplan.planner.topology import load_cluster

    source = load_cluster(plan.spec)
    mapping = _mapping(source, inputs.cluster, order)
    result = replay_plan(
        inputs.ir,
        inputs.cluster,
        mapping.remap(load_strategy(plan.summary["strategy"])),
        plan.summary,
        profiles=inputs.profiles,
        comm=inputs.comm,
        started_at_s=inputs.deadline.at_s - inputs.deadline.budget_s,
    )
    url = settings.sqlalchemy_url
    with session_scope(url) as session:
        compiled = get_blob(session, plan.graphdef_digest)
    device_map = plan.device_map
    if source.spec != inputs.cluster.spec:
        compiled, device_map = renumber_graph(
            compiled, device_map, source, inputs.cluster, mapping.devices
        )
    stored = StoredPlan(
        result.summary() | {"source": "cache", "cached_from": plan.job_id},
        device_map,
        compiled,
        source="cache",
        cached_from=plan.job_id,
    )
    with session_scope(url) as session:
        if not _store_result(session, job_id, inputs, stored):
            return
        job_state.save_step(
            session, job_id=job_id, step="analyze", output={"cached_from": plan.job_id}
        )
    trace, lanes = _trace_blobs(result)
    with session_scope(url) as session:
        row = session.get(Result, job_id)
        if row is not None:
            row.trace_digest, row.lanes_digest = put_blob(session, trace), put_blob(session, lanes)


def _trace_blobs(result: Any) -> tuple[bytes, bytes]:
    """The plan's Chrome trace (JSON) and its lanes for the dashboard."""
    from tagplan.planner.trace_lanes import dumps_lanes, lanes_from_trace

    trace = result.chrome_trace()
    return json.dumps(trace, separators=(",", ":")).encode(), dumps_lanes(lanes_from_trace(trace))


@dataclass(frozen=True)
class StoredPlan:
    """What a finished job stores: the plan's summary, device map and GraphDef bytes."""

    summary: dict[str, Any]
    device_map: dict[str, Any] | None
    graphdef: bytes | None
    source: str = "search"
    cached_from: str | None = None
    complete: bool = True


def _store_result(
    session: Any,
    job_id: str,
    inputs: JobInputs,
    plan: StoredPlan,
    trace: tuple[bytes, bytes] | None = None,
) -> bool:
    """Store the job's result and mark it succeeded; False (nothing stored) when the job
    had already finished (cancelled while planning); ``trace`` is the trace and its lanes
    (:func:`_trace_blobs`). ``plan_time_s`` is the job's wall
    time from its start to its end, across every worker, blobs stored included."""
    from tagplan.planner.topology import fingerprint

    if job_state.is_finished(session, job_id):
        return False
    graphdef_digest = put_blob(session, plan.graphdef) if plan.graphdef else None
    trace_digest, lanes_digest = (
        (put_blob(session, trace[0]), put_blob(session, trace[1])) if trace else (None, None)
    )
    if not job_state.finish_job(session, job_id=job_id, status=JobStatus.SUCCEEDED):
        return False
    job = session.get(Job, job_id)
    summary = json.loads(json.dumps(plan.summary))
    if inputs.prior_note:
        summary["prior_note"] = inputs.prior_note
    if job.started_at is not None:
        finished, started = job_state.as_utc(job.finished_at), job_state.as_utc(job.started_at)
        summary["plan_time_s"] = (finished - started).total_seconds()
    session.add(
        Result(
            job_id=job_id,
            graph_fingerprint=inputs.ir.fingerprint,
            cluster_fingerprint=fingerprint(inputs.cluster),
            batch_size=inputs.ir.batch_size,
            step_time_s=float(summary["step_time_s"]),
            summary=summary,
            device_map=json.loads(json.dumps(plan.device_map)) if plan.device_map else None,
            graphdef_digest=graphdef_digest,
            trace_digest=trace_digest,
            lanes_digest=lanes_digest,
            cost_key=inputs.cost_key,
            planner_version=planner_version(),
            source=plan.source,
            cached_from=plan.cached_from,
            complete=plan.complete,
        )
    )
    return True


FINISH_PHASES = frozenset({"sfb", "compile", "bound"})


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
        start=inputs.start,
        prior=inputs.prior,
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


class Finished(NamedTuple):
    """What follows a job's finish step: the refinement job it added (an anytime job
    answered before its search was done), and whether its GraphDef step is owed."""

    refinement: str | None = None
    graphdef_owed: bool = False


def finish_step(settings: Settings, job_id: str, shards: int) -> Finished:
    """Merge the shards, run SFB and compile, store the result and mark the job succeeded.

    A GraphDef whose compile did not fit in the budget is left to a step of its own
    (:func:`graphdef_step`, with a time limit of its own): the answer does not wait for it.
    An anytime job (``deadline_s``) whose search the deadline cut is answered with
    ``complete: false``; with ``refine_s`` a refinement job is added that searches on from
    the answer (:func:`add_refinement`). The caller sends what follows."""
    from tagplan.planner.plan import SearchOutcome

    url = settings.sqlalchemy_url
    with session_scope(url) as session:
        if session.get(Result, job_id) is not None:  # stored before this step stopped
            job_state.finish_job(session, job_id=job_id, status=JobStatus.SUCCEEDED)
            owed = job_state.step_output(session, job_id=job_id, step=job_state.FOLLOWING_STEP)
            return Finished(graphdef_owed=owed is not None)
        stored = job_state.step_outputs(session, job_id=job_id, prefix="shard:")
    if len(stored) < shards:
        raise RuntimeError(f"{shards - len(stored)} of {shards} search shards have no outcome")
    inputs = load_inputs(settings, job_id)
    outcomes = [SearchOutcome.from_dict(stored[name]) for name in sorted(stored)]
    monitor = JobMonitor(url, job_id, phases=FINISH_PHASES)
    result = _planner(inputs, monitor).finish(outcomes, graph_def=inputs.graph_def)
    trace = _trace_blobs(result)
    distributed = result.distributed
    summary = result.summary() | {"source": "search"}
    if inputs.started_from is not None:
        summary["warm_start"] = inputs.started_from
    options = inputs.requested
    cut = {"budget", "skipped"} & set(result.stop_reason.split("+"))
    complete = options.get("deadline_s") is None or not cut
    stored = StoredPlan(
        summary,
        distributed.device_map if distributed else None,
        distributed.graph_def_bytes if distributed else None,
        complete=complete,
    )
    with session_scope(url) as session:
        if not _store_result(session, job_id, inputs, stored, trace):
            return Finished()
        if result.graphdef_deferred:
            job_state.follow_answer(session, job_id=job_id)
        refinement = None
        if not complete and options.get("refine_s") is not None:
            refinement = add_refinement(session, job_id)
    return Finished(refinement, result.graphdef_deferred)


def graphdef_step(settings: Settings, job_id: str, *, deadline: float = math.inf) -> None:
    """Compile the GraphDef of a job answered without it (``graphdef_deferred``) for the
    strategy it stored, and attach it with its device map; nothing when it is attached or
    its failure recorded (a message delivered twice).

    A compile that ends after ``deadline`` (``time.monotonic()``: the step's soft time
    limit) is not attached: the step raises the limit's exception as the limit's signal
    would have. The signal can land where Python ignores exceptions (a weakref callback
    run by the garbage collector in the compile), and the step must still say it ran out
    of time."""
    from tagplan.planner.compile.graphdef import compile_graphdef
    from tagplan.planner.evaluate import resolve_planned

    url = settings.sqlalchemy_url
    with session_scope(url) as session:
        row = session.get(Result, job_id)
        owed = row is not None and row.graphdef_digest is None
        owed = owed and not row.summary.get("graphdef_error")  # a failure is for good
        strategy = row.summary["strategy"] if owed else None
        if strategy is None:
            job_state.drop_following(session, job_id=job_id)
    if strategy is None:
        return
    inputs = load_inputs(settings, job_id)
    resolved = resolve_planned(load_strategy(strategy), inputs.ir, inputs.cluster)
    compiled = compile_graphdef(inputs.graph_def, inputs.ir, inputs.cluster, resolved)
    if time.monotonic() > deadline:
        raise SoftTimeLimitExceeded()
    with session_scope(url) as session:
        row = session.get(Result, job_id)
        row.graphdef_digest = put_blob(session, compiled.graph_def_bytes)
        row.device_map = json.loads(json.dumps(compiled.device_map))
        job_state.drop_following(session, job_id=job_id)


def graphdef_failed(settings: Settings, job_id: str, reason: str) -> None:
    """The job's GraphDef step failed for good: its result says why (the answer stands)."""
    with session_scope(settings.sqlalchemy_url) as session:
        job_state.fail_following(session, job_id=job_id, reason=reason)


def add_refinement(session: Any, parent_id: str) -> str:
    """Add the job that goes on searching for anytime job ``parent_id`` after its answer:
    the same inputs, ``refine_s`` as its budget, ``fresh`` so it starts from the parent's
    plan (and never ends slower). Its result joins the cache, where repeats take the
    fastest plan. Returns its id."""
    parent = session.get(Job, parent_id)
    options = {
        **parent.options,
        "budget_s": parent.options["refine_s"],
        "deadline_s": None,
        "refine_s": None,
        "fresh": True,
    }
    child, _ = job_state.add_job(
        session,
        Job(
            id=str(uuid.uuid4()),
            key=hashlib.sha256(f"{parent.key}:refine".encode()).hexdigest(),
            graph_id=parent.graph_id,
            cluster_id=parent.cluster_id,
            batch_size=parent.batch_size,
            batch_inputs=parent.batch_inputs,
            loss=parent.loss,
            options=options,
            status=JobStatus.QUEUED,
            api_key_id=parent.api_key_id,
            tenant=parent.tenant,
            refines=parent.id,
        ),
    )
    parent.refined_by = child.id
    return child.id
