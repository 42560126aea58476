"""From a graph and a cluster to a deployment plan (docs/design.md §7, TAG §4).

:func:`plan` runs the phases in order, reporting each through ``progress``:

* **group**: METIS op groups (TAG §4.1.1), compute time averaged over the cluster's GPU
  types;
* **baselines**: every baseline strategy through the same compiler and simulator; DP-NCCL's
  step is the reference the search's rewards are measured against; a baseline that a
  bound shows no faster than one simulated before is left out (``every_baseline``
  simulates it anyway: :meth:`Planner._bounded_out`);
* **search**: MCTS (TAG §4.2.2) over the groups' decisions, ``shards`` trees with seeds
  ``seed, seed + 1, ...`` (root parallelism), merged by best result; the first tree
  breaks ties in the candidate generator's order, the others shuffle them; the trees
  take turns in one process, or run at once in processes forked after the phases before
  (``processes``: :meth:`Planner.search_shards`). On an allocation of several machines
  (or device groups) the tree's root first decides the layout: TAG's per-group decisions
  or one of tagplan's pipelines (:mod:`~.search.pipeline_stages`: stage counts and cuts
  sized by the GPUs' speeds), below which it decides the micro-batches and each stage's
  gradient synchronization (:mod:`~.search.layout_branches`; pipelines take at most a
  fifth of its simulation time while a plan of TAG's fits); the layouts are cut once,
  after the baselines, while that share of the search's budget lasts, and a micro-batch
  count whose busiest GPU computes for longer than the best step of the baselines
  simulated before the search is left out
  (:meth:`~.evaluate.Evaluator.compute_bound_s`: it cannot win);
* **sfb**: sufficient-factor broadcast decided by TAG's ILP for every replicated gradient
  (TAG §4.2.3), kept only when the simulator says it helps, for both the search's best
  strategy and the fastest baseline (SFB can turn the order around);
* **compile**: the final simulation per GPU (with its trace; the search simulates by
  symmetry class, :mod:`~.compile.symmetry`) and, when the GraphDef is given, the placed
  distributed GraphDef and device map;
* **bound**: the step bound counting communication (:mod:`~.search.comm_bound`), in the
  time the budget leaves, its LP solved in a process forked for it (on a thread where the
  planner may not fork) from the start of the search (:meth:`Planner.start_comm_bound`).

The plan is the fastest strategy that fits in memory among what the search found and the
baselines (every baseline is a strategy of the same space, so no plan is ever worse than
one of them; ``PlanResult.chosen_from`` says which won). When nothing fits, op groups move
to model parallelism until the step fits (:func:`~.search.mcts.make_feasible`), and the
baselines that spread memory most (DP-PS's sharded parameters, m-TOPO's memory-capped
placement) are tried if the budget had skipped them; when none fits,
:class:`~.errors.Infeasible` names the overflow.

:class:`Planner` exposes the phases one by one so a job can be spread over workers: each
worker builds a ``Planner`` for the same inputs (everything is deterministic), runs
:meth:`Planner.search_shard` for its seed, and one of them calls :meth:`Planner.finish`
with every shard's :class:`~.search.mcts.SearchOutcome`.

Budgets (:mod:`~.budget`): ``budget_s`` bounds the whole plan, every phase included, as
one :class:`~.budget.Deadline` fixed when planning starts (a job's workers share it).
DP-NCCL, the reference, always runs; the other baselines share a quarter of the budget
and a baseline whose evaluation would not fit what is left is skipped (m-SCT's LP stops
at its share). The search gets what is left less a reserve for SFB (a share of the
budget), the final simulations (each timed like DP-NCCL's evaluation), the distributed
GraphDef and the plan's per-GPU simulation for its timeline (both scaled by the GPUs per
symmetry class, as their cost grows with the GPUs; the timeline only while it takes at
most a tenth of the budget, past which the search comes first and the timeline is
simulated per GPU only with time left over); a pipeline it has no time left to simulate is
not simulated; it also stops once it has converged (:mod:`~.search.mcts`). SFB stops at
its share. The distributed GraphDef is compiled only when its estimate ends within a
tenth of the budget past the deadline: otherwise the plan answers without it
(``graphdef_deferred``) and the caller compiles it after the answer, so the GraphDef of a
large allocation (seconds per 64 GPUs) never holds the answer past its budget. Every
phase's status (``done``, ``truncated``, ``skipped``) and wall time are in the result.
``iterations`` bounds each tree; with an iteration budget that neither the time budget
nor convergence cuts, a seed always gives the same plan.

The expensive work shared by a job's steps (grouping, baselines, the reference's step)
is done once: :meth:`Planner.prepared` gives it as JSON and a ``Planner`` built with
``prepared=`` starts from it instead of redoing it.

Why one module: the phases share one deadline, one evaluator, the phase log and the state
a job's workers hand to each other (``prepared``); split, each phase would take the whole
planner as its argument.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial

from tagplan.planner.background import BackgroundWork
from tagplan.planner.budget import Deadline, PhaseLog, PhaseReport
from tagplan.planner.compile.graphdef import compile_graphdef
from tagplan.planner.cost.comm import CommModel
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.cost.profile import ProfileSource
from tagplan.planner.errors import BudgetExhausted, Cancelled, Infeasible, InvalidInput
from tagplan.planner.evaluate import Evaluator, warm_up
from tagplan.planner.forked import can_fork, run_forked
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.options import PlanOptions
from tagplan.planner.result import PlanResult, estimated_inputs
from tagplan.planner.search.actions import ActionSpace
from tagplan.planner.search.baselines import (
    BASELINES,
    DATA_PARALLEL_BASELINES,
    baseline_strategy,
)
from tagplan.planner.search.comm_bound import CommBound, comm_bound
from tagplan.planner.search.grouping import cluster_mean_op_time_s, group_ops, grouping_of
from tagplan.planner.search.layout_branches import (
    PIPELINE_SHARE,
    LayoutBranches,
    bounded_layouts,
)
from tagplan.planner.search.lower_bound import lower_bound, model_parallel_bound_s
from tagplan.planner.search.mcts import (
    SearchOutcome,
    SearchProgress,
    StrategySearch,
    best_outcome,
    make_feasible,
)
from tagplan.planner.search.pipeline_stages import StageLayout, pipeline_layouts
from tagplan.planner.search.prior import Prior, UniformPrior
from tagplan.planner.search.sfb import SfbDecision, apply_sfb
from tagplan.planner.search.warm_start import start_actions
from tagplan.planner.strategy import Strategy, load_strategy
from tagplan.planner.strategy_remap import pin_numbering
from tagplan.planner.topology import Cluster

__all__ = [
    "PHASES",
    "BaselineScore",
    "PlanOptions",
    "PlanProgress",
    "PlanResult",
    "Planner",
    "SearchOutcome",
    "plan",
]

PHASES = ("analyze", "group", "baselines", "search", "sfb", "compile", "bound")
REFERENCE = "dp-nccl"
# baselines that spread memory, tried when nothing else fits and the budget skipped them
_MEMORY_SPREADING = ("dp-ps", "m-topo")
# share of the budget the baselines after DP-NCCL may take
_BASELINE_SHARE = 0.25
# share of the budget SFB's ILPs may take after the search
_SFB_SHARE = 0.08
# simulations after the search: its plan and up to two baselines, and SFB's checks
_FINISH_EVALUATIONS = 5
# time is kept for the plan's own simulation per GPU (its timeline) only while that takes
# at most this share of the budget: on a short budget over many GPUs the search gets the
# time, and the timeline shows each symmetry class's first GPU unless time is left over
_TIMELINE_SHARE = 0.1
# the distributed GraphDef costs about this many per-GPU evaluations to compile (a per-GPU
# evaluation estimated as the by-class one times CompiledTasks.per_gpu_factor; measured
# on one machine: ResNet-101 on scale:64 5.9 and on cloud 5.0, BERT-Large on scale:128
# 3.4). An estimate too low makes a plan overrun its budget, one too high only sends the
# GraphDef after the answer: the highest seen. Faster evaluations raise the ratio: the
# plan-latency bench's budget rows show when it needs measuring again.
_GRAPHDEF_EVALUATIONS = 6
# a plan may end this share of its budget late rather than answer without its GraphDef
_GRAPHDEF_OVERRUN_SHARE = 0.1
# how much longer than its typical figure a GraphDef's compile may take: the compile and
# the evaluation it is estimated from both vary from run to run (ResNet-101 on scale:64:
# 6.0-7.3 s on one machine, typically estimated at 6.6-7.2 s); the time kept for it and
# whether it fits count with the longer figure
_GRAPHDEF_SPREAD = 1.25
# baselines whose task graph is as large as the reference's: their evaluation times it
_LIKE_REFERENCE = frozenset({"dp-nccl-p", "horovod"})
# baselines simulated per GPU (a parameter server on every GPU leaves no two alike; a
# pipeline's micro-batches are compiled per GPU)
_PER_GPU_BASELINES = frozenset({"dp-ps", "pipeline"})
# Baechi's placers: every op whole on one GPU (model_parallel_bound_s bounds them before
# their placement, which costs more than their simulation)
_MODEL_PARALLEL_BASELINES = frozenset({"m-topo", "m-etf", "m-sct"})
# baselines simulated beside the search where the planner can fork: each costs seconds on a
# large allocation (a per-GPU evaluation, a placer), and the search reads none of them
_BESIDE_BASELINES = _PER_GPU_BASELINES | _MODEL_PARALLEL_BASELINES
# the processes forked beside the search yield to it where cores are fewer than processes
_BESIDE_NICENESS = 5


@dataclass(frozen=True)
class PlanProgress:
    phase: str  # one of PHASES
    iterations: int
    best_step_time_s: float | None
    best_speedup: float | None  # over DP-NCCL
    elapsed_s: float


@dataclass
class _BaselineRun:
    """What scoring baselines found: their scores, and the baselines skipped at the
    budget, refused by the graph or bounded out (by their bound)."""

    scores: dict[str, BaselineScore]
    skipped: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    ruled_out: dict[str, list[str]] = field(default_factory=dict)

    def merge(self, other: _BaselineRun) -> None:
        self.scores.update(other.scores)
        self.skipped += other.skipped
        self.refused += other.refused
        for why, names in other.ruled_out.items():
            self.ruled_out.setdefault(why, []).extend(names)


@dataclass(frozen=True)
class BaselineScore:
    """A baseline's strategy and its simulated step, as JSON travels between steps."""

    strategy_json: str
    step_time_s: float
    oom: bool
    overflow_bytes: int

    @property
    def strategy(self) -> Strategy:
        return load_strategy(self.strategy_json)


class Planner:
    """The phases of :func:`plan` for one graph and cluster (module docstring).

    Construction runs the group and baseline phases, or takes them from ``prepared``
    (what :meth:`prepared` returned for the same inputs). ``deadline`` defaults to
    ``options.budget_s`` from now; ``graphdef`` says whether :meth:`finish` will be
    given the GraphDef to compile, so the search leaves time for it (none when, timed
    from DP-NCCL's evaluation, the compile would not fit in the budget: the plan then
    answers without it, ``graphdef_deferred``). ``start`` (a strategy
    found before, in this cluster's device groups) warm-starts every search tree
    (:mod:`~.search.warm_start`) and is a contender of :meth:`finish` as itself
    (``chosen_from="start"``), so the plan is never slower than it.
    """

    def __init__(
        self,
        ir: GraphIR,
        cluster: Cluster,
        *,
        options: PlanOptions | None = None,
        profiles: ProfileSource | None = None,
        comm: CommModel | None = None,
        prior: Prior | None = None,
        progress: Callable[[PlanProgress], None] | None = None,
        cancel: Callable[[], bool] | None = None,
        deadline: Deadline | None = None,
        prepared: dict | None = None,
        graphdef: bool = True,
        start: Strategy | None = None,
    ) -> None:
        self.ir, self.cluster = ir, cluster
        self.options = options or PlanOptions()
        self.deadline = deadline or Deadline.after(self.options.budget_s)
        self.prior, self.graphdef, self.start = prior, graphdef, start
        self._progress, self._cancel = progress, cancel
        self.phases = PhaseLog()
        self.reference_step_s: float | None = None
        self.per_gpu_factor = 1.0  # a per-GPU evaluation over one by symmetry class
        self.evaluation_s = 0.0  # one evaluation of the reference, measured
        self._lower_bound_s: float | None = None
        self._model_parallel_bound_s: float | None = None
        self._comm_bound: BackgroundWork[CommBound | None] | None = None
        self._beside: BackgroundWork[_BaselineRun] | None = None  # baselines beside the search
        self._beside_names: list[str] = []
        self._baseline_run = _BaselineRun({})
        costs = OpCostModel(ir, cluster, profiles=profiles)
        self.evaluator = Evaluator(
            ir, cluster, costs=costs, comm=comm, by_class=self.options.by_class
        )
        self.space = ActionSpace(ir, cluster, costs, max_actions=self.options.max_actions)
        self.op_time_s = op_time_s = cluster_mean_op_time_s(ir, cluster, costs)
        if prepared is not None:
            self.grouping = grouping_of(ir, op_time_s, prepared["op_group"])
            self._baselines = {
                name: BaselineScore(**score) for name, score in prepared["baselines"].items()
            }
            self.evaluation_s = float(prepared["evaluation_s"])
            self.per_gpu_factor = float(prepared.get("per_gpu_factor", 1.0))
            self.graphdef = graphdef and prepared.get("graphdef", True)
            self.phases = PhaseLog(
                {k: PhaseReport.from_dict(v) for k, v in prepared["phases"].items()}
            )
            self.reference_step_s = self._baselines[REFERENCE].step_time_s
            self._lower_bound_s = prepared.get("lower_bound_s")
            self.layouts = self._branches(  # a job prepared by an older planner: none
                [StageLayout.from_dict(d) for d in prepared.get("layouts", [])],
                prepared.get("layout_bound_s", []),
                float(prepared.get("layout_cut_s", 0.0)),
            )
        else:
            self._enter("group")
            self.grouping = group_ops(
                ir, op_time_s, max_groups=self.options.max_groups, seed=self.options.seed
            )
            self.phases.leave()
            self._score_baselines()  # sets the reference's step
            self.layouts = self._cut_layouts()

    @property
    def baselines(self) -> dict[str, BaselineScore]:
        """Every baseline's score, those simulated beside the search waited for (at most
        until the deadline; skipped when they are not done by then)."""
        self._gather_baselines(self.deadline.left_s())
        return self._baselines

    def prepared(self) -> dict:
        """The group and baseline phases' results and the lower bound as JSON, for
        ``Planner(prepared=...)``."""
        return {
            "op_group": self.grouping.op_group.tolist(),
            "baselines": {name: asdict(score) for name, score in self.baselines.items()},
            "evaluation_s": self.evaluation_s,
            "per_gpu_factor": self.per_gpu_factor,
            "graphdef": self.graphdef,
            "phases": self.phases.to_dict(),
            "lower_bound_s": self.lower_bound_s(),
            "layouts": [] if self.layouts is None else [x.to_dict() for x in self.layouts.layouts],
            "layout_bound_s": [] if self.layouts is None else self.layouts.bound_s,
            "layout_cut_s": 0.0 if self.layouts is None else self.layouts.cut_s,
        }

    def lower_bound_s(self) -> float:
        """The step no strategy beats (:func:`~.search.lower_bound.lower_bound`), computed
        once."""
        if self._lower_bound_s is None:
            bound = lower_bound(self.ir, self.cluster, self.evaluator.costs)
            self._lower_bound_s = bound.step_time_s
        return self._lower_bound_s

    def start_comm_bound(self) -> None:
        """Start solving the bound counting communication over the search's actions
        (:func:`~.search.comm_bound.comm_bound`) beside the planner, until the deadline
        (once; :meth:`finish` starts it if nobody did): in a process forked for it where
        this one can fork, else on a thread. Building its LP runs Python for seconds on a
        large allocation, which on a thread takes the GIL from the search's evaluations
        for as long (BENCHMARKS.md, *The communication bound beside a plan*); where a
        core is free, the phases that run meanwhile hide it. Its value does not depend on
        when it runs."""
        if self._comm_bound is not None:
            return
        free_s = self.lower_bound_s()  # computed here: the planner keeps it
        self._comm_bound = BackgroundWork(
            lambda: comm_bound(
                self.ir,
                self.cluster,
                self.evaluator.costs,
                self.grouping.op_group,
                self.space,
                free_s=free_s,
                time_limit_s=self.deadline.left_s(),
            ),
            name="tagplan-comm-bound",
            fork=True,
            niceness=_BESIDE_NICENESS,
        )

    def _comm_bound_s(self) -> float | None:
        """The communication bound of :meth:`start_comm_bound`, waited for until the
        deadline; ``None`` (phase ``bound`` skipped) when its LP was not solved by then."""
        self._enter("bound")
        self.start_comm_bound()
        bound = self._comm_bound.result(self.deadline.left_s())
        if bound is None:
            self._comm_bound.stop()
            self.phases.mark("bound", "skipped", "the budget ran out before its LP was solved")
        else:
            self._note(
                "bound", f"solved beside the other phases in {self._comm_bound.seconds:.2f} s"
            )
        return None if bound is None else bound.step_time_s

    # phases ---------------------------------------------------------------------------

    def _enter(self, phase: str) -> None:
        self.phases.enter(phase)
        self._report(phase, 0, None)

    def _elapsed_s(self) -> float:
        return time.time() - (self.deadline.at_s - self.deadline.budget_s)

    def _report(self, phase: str, iterations: int, best_step_s: float | None) -> None:
        if self._progress is None:
            return
        self._progress(
            PlanProgress(
                phase=phase,
                iterations=iterations,
                best_step_time_s=best_step_s,
                best_speedup=self.reference_step_s / best_step_s
                if best_step_s and self.reference_step_s
                else None,
                elapsed_s=self._elapsed_s(),
            )
        )

    def _check_cancel(self) -> None:
        if self._cancel is not None and self._cancel():
            raise Cancelled("planning was cancelled")

    def _score_baselines(self) -> None:
        """DP-NCCL, then the other baselines while the baselines' share of the budget
        lasts (m-SCT's LP stops at it) and no later than the steps every plan runs must
        start (:meth:`_unskippable_s`). Where the planner can fork, the baselines that
        cost seconds on a large allocation (:data:`_BESIDE_BASELINES`) are simulated in a
        child forked for them while the search runs, and gathered by :meth:`finish`."""
        self._enter("baselines")
        warm_up()  # the reference's time is then an evaluation's, not the kernels' compile
        ends_at = time.time() + self.deadline.share_s(_BASELINE_SHARE)
        names = [
            n for n in BASELINES if n != REFERENCE and (n != "pipeline" or self.options.pipeline)
        ]
        beside = [n for n in names if n in _BESIDE_BASELINES] if can_fork() else []
        run = self._baseline_run
        here = [REFERENCE, *(n for n in names if n not in beside)]
        ends_at = self._score_each(here, run, ends_at, cancel=True)
        if beside:
            self._beside_names = beside
            self._beside = BackgroundWork(
                partial(self._score_beside, beside, dict(run.scores), ends_at),
                name="tagplan-baselines",
                fork=True,
                niceness=_BESIDE_NICENESS,
            )
        self._record_baselines()
        self.reference_step_s = self._baselines[REFERENCE].step_time_s
        # the best to beat
        best_s = _best_fitting_s(self._baselines.values())
        self._report("baselines", 0, best_s if best_s < math.inf else None)
        self.phases.leave()

    def _score_beside(
        self, names: list[str], scores: dict[str, BaselineScore], ends_at: float
    ) -> _BaselineRun:
        """In the child forked for them: ``names`` scored after the baselines of
        ``scores`` (which bound Baechi's placers), never asking the caller's ``cancel``."""
        run = _BaselineRun(dict(scores))
        self._score_each(names, run, ends_at, cancel=False)
        return _BaselineRun(
            {n: run.scores[n] for n in names if n in run.scores},
            run.skipped,
            run.refused,
            run.ruled_out,
        )

    def _score_each(
        self, names: Sequence[str], run: _BaselineRun, ends_at: float, *, cancel: bool
    ) -> float:
        """Score ``names`` in turn into ``run`` while the time before ``ends_at`` lasts
        (the reference whatever the time); the end, moved up once the reference has
        measured an evaluation."""
        ir, cluster, costs = self.ir, self.cluster, self.evaluator.costs
        for name in names:
            if cancel:
                self._check_cancel()
            left_s = ends_at - time.time()
            expected_s = self.evaluation_s * (
                self.per_gpu_factor if name in _PER_GPU_BASELINES else 1.0
            )
            if name != REFERENCE and left_s < expected_s:
                run.skipped.append(name)
                continue
            bar_s = _best_fitting_s(run.scores.values())
            if self._bounded_out(name, None, bar_s, run.ruled_out):
                continue
            started = time.perf_counter()
            try:
                strategy = baseline_strategy(
                    name, ir, cluster, costs, time_limit_s=None if name == REFERENCE else left_s
                )
                if self._bounded_out(name, strategy, bar_s, run.ruled_out):
                    continue
                evaluation = self.evaluator.evaluate(strategy)
            except BudgetExhausted:
                run.skipped.append(name)
                continue
            except InvalidInput as exc:  # a pipeline this graph cannot run
                if name == REFERENCE:
                    raise
                run.refused.append(f"{name} ({exc})")
                continue
            seconds = time.perf_counter() - started
            if name == REFERENCE:
                self.evaluation_s = seconds
                self.per_gpu_factor = evaluation.compiled.per_gpu_factor
                finish_s = _FINISH_EVALUATIONS * self.evaluation_s
                if self.graphdef and not self._graphdef_fits(self.deadline.left_s() - finish_s):
                    self.graphdef = False  # compiled after the answer: no time kept for it
                # the other baselines end where the steps every plan runs must start
                ends_at = min(ends_at, self.deadline.at_s - self._unskippable_s())
            elif name in _LIKE_REFERENCE:  # as large, with the simulator's kernels loaded
                self.evaluation_s = min(self.evaluation_s, seconds)
            result = evaluation.result
            run.scores[name] = BaselineScore(
                strategy_json=strategy.to_json(),
                step_time_s=float(evaluation.step_time_s),
                oom=bool(result.oom),
                overflow_bytes=int(result.overflow_bytes.sum()),
            )
        return ends_at

    def _gather_baselines(self, wait_s: float) -> None:
        """The baselines simulated beside the search, waited for at most ``wait_s``
        seconds (stopped and counted as skipped at the budget when not done by then), in
        what the phase reports."""
        if self._beside is None:
            return
        beside, self._beside = self._beside, None
        found = beside.result(wait_s)
        answered = found is not None
        if found is None:
            beside.stop()
            found = _BaselineRun({}, list(self._beside_names))
        self._baseline_run.merge(found)
        self._record_baselines(beside_s=beside.seconds if answered else None)

    def _record_baselines(self, *, beside_s: float | None = None) -> None:
        """The baselines' scores and what the phase reports, from what was scored so far
        (``beside_s``: how long the baselines beside the search took)."""
        run = self._baseline_run
        self._baselines = {name: run.scores[name] for name in BASELINES if name in run.scores}
        report = self.phases.reports.setdefault("baselines", PhaseReport())
        report.status, report.note = "done", ""
        if run.skipped:
            self.phases.mark(
                "baselines", "truncated", f"skipped at the budget: {', '.join(run.skipped)}"
            )
        if run.refused:
            self._note("baselines", f"not applicable: {', '.join(run.refused)}")
        best_s = _best_fitting_s(self._baselines.values())
        if run.ruled_out:
            self._note(
                "baselines",
                f"not simulated, bounded at or above the best baseline's {best_s * 1e3:.1f} ms: "
                + "; ".join(f"{', '.join(names)} ({why})" for why, names in run.ruled_out.items()),
            )
        if beside_s is not None:
            self._note("baselines", f"simulated beside the search in {beside_s:.2f} s")

    def _bounded_out(
        self, name: str, strategy: Strategy | None, bar_s: float, ruled_out: dict[str, list[str]]
    ) -> bool:
        """Whether baseline ``name`` cannot be faster than ``bar_s``, the best step that
        fits so far (then named in ``ruled_out`` under its bound, and not simulated): Baechi's
        placers before their placement (``strategy`` not built yet), which costs more than
        their simulation, by model parallelism's critical path
        (:func:`~.search.lower_bound.model_parallel_bound_s`); the baselines simulated per
        GPU once built, by their busiest GPU's compute
        (:meth:`~.evaluate.Evaluator.compute_bound_s`). Never with ``every_baseline``."""
        if bar_s == math.inf or self.options.every_baseline:
            return False
        if strategy is None and name in _MODEL_PARALLEL_BASELINES:
            if self._model_parallel_bound_s is None:
                self._model_parallel_bound_s = model_parallel_bound_s(
                    self.ir, self.cluster, self.evaluator.costs
                )
            what, bound_s = "model parallelism's critical path", self._model_parallel_bound_s
        elif strategy is not None and name in _PER_GPU_BASELINES:
            what, bound_s = "busiest GPU's compute", self.evaluator.compute_bound_s(strategy)
        else:
            return False
        if bound_s < bar_s:
            return False
        ruled_out.setdefault(f"{what} {bound_s * 1e3:.1f} ms", []).append(name)
        return True

    def _cut_layouts(self) -> LayoutBranches | None:
        """tagplan's stage layouts as branches of the search (module docstring), bounded by
        the best step that fits of the baselines simulated before the search (not
        those beside it, so that a planner that cannot fork cuts the same); ``None`` when
        pipelines are turned off, the allocation is one unit, or the search has no time to
        simulate a pipeline of two micro-batches. Cutting a large graph takes a fraction
        of a second per layout: the layouts are cut while the pipelines' share of the
        search's time lasts (all of it when no baseline fits), and what the cut took
        counts against that share."""
        if not self.options.pipeline:
            return None
        self._enter("search")
        search_s = self.search_budget_s()
        if search_s < 2 * self.evaluation_s * self.per_gpu_factor:
            self._note("search", "pipelines not cut: no time left in the budget")
            self.phases.leave()
            return None
        started = time.perf_counter()
        fitting = [  # the same in a planner that can fork and in one that cannot
            b.step_time_s
            for name, b in self._baselines.items()
            if not b.oom and name not in _BESIDE_BASELINES
        ]
        bounded = bounded_layouts(
            self.evaluator,
            pipeline_layouts(self.ir, self.cluster, self.evaluator.costs),
            self.space.device_speed,
            min(fitting, default=math.inf),
            until=started + search_s * (PIPELINE_SHARE if fitting else 1.0),
        )
        notes = [
            f"{n} {why}"
            for n, why in (
                (bounded.ruled_out, "ruled out by their busiest GPU's compute"),
                (bounded.refused, "refused by the graph"),
            )
            if n
        ]
        if notes:
            notes = [f"pipelines (layout and micro-batches): {', '.join(notes)}"]
        if not bounded.complete:
            notes.append(f"{bounded.cut} layouts cut before the pipelines' share ran out")
        if notes:
            self._note("search", "; ".join(notes))
        self.phases.leave()
        return self._branches(bounded.layouts, bounded.bound_s, time.perf_counter() - started)

    def _branches(
        self, layouts: Sequence[StageLayout], bound_s: Sequence[Sequence[float]], cut_s: float
    ) -> LayoutBranches | None:
        if not layouts:
            return None
        return LayoutBranches(
            self.ir,
            self.cluster,
            layouts,
            self.space.device_speed,  # the GPUs' speeds on the model, as the actions' shares
            bound_s=bound_s,
            micro_batch_s=self.evaluation_s * self.per_gpu_factor,
            evaluation_s=self.evaluation_s,
            cut_s=cut_s,
        )

    def _search(self, seed: int) -> StrategySearch:
        return StrategySearch(
            self.evaluator,
            self.grouping,
            self.space,
            reference_step_s=self.reference_step_s,
            prior=self.prior,
            seed=seed,
            shuffle_ties=seed != self.options.seed,
            layouts=self.layouts,
            bar_s=self._bar_s(),
            sweep=seed == self.options.seed,
        )

    def _bar_s(self) -> float | None:
        """The best step that fits among the baselines scored before the search (those
        simulated beside it are not waited for): the search simulates no strategy whose
        step bound is no less (:class:`~.search.mcts.StrategySearch`)."""
        best_s = _best_fitting_s(self._baselines.values())
        return best_s if best_s < math.inf else None

    def _finish_reserve_s(self) -> float:
        """Seconds to keep for SFB, the last simulations and the distributed GraphDef."""
        sfb = self.options.budget_s * _SFB_SHARE if self.options.sfb else 0.0
        return sfb + self._last_steps_s(self.graphdef)

    def _note(self, phase: str, note: str) -> None:
        """Add ``note`` to what ``phase`` reports."""
        report = self.phases.reports.setdefault(phase, PhaseReport())
        report.note = "; ".join(n for n in (report.note, note) if n)

    def _graphdef_s(self, graphdef: bool) -> float:
        """The distributed GraphDef's compile, when there is one, at the longest it is
        expected to take (:data:`_GRAPHDEF_SPREAD`): it grows with the GPUs as a per-GPU
        simulation does."""
        if not graphdef:
            return 0.0
        per_gpu_s = self.per_gpu_factor * self.evaluation_s
        return _GRAPHDEF_SPREAD * _GRAPHDEF_EVALUATIONS * per_gpu_s

    def _graphdef_fits(self, left_s: float) -> bool:
        """Whether the distributed GraphDef's compile, started with ``left_s`` left in the
        budget, makes the answer at most :data:`_GRAPHDEF_OVERRUN_SHARE` of the budget
        late (as estimated, :meth:`_graphdef_s`; a plan already late compiles a GraphDef
        that takes no more than that): the compile cannot stop part way, and a plan
        answers without it rather than later (``graphdef_deferred``)."""
        overrun_s = _GRAPHDEF_OVERRUN_SHARE * self.options.budget_s
        return self._graphdef_s(True) <= max(left_s, 0.0) + overrun_s

    def _unskippable_s(self) -> float:
        """What a plan runs however late it is: the finish's simulations of its
        contenders and the distributed GraphDef (the per-GPU timeline can be left out)."""
        return _FINISH_EVALUATIONS * self.evaluation_s + self._graphdef_s(self.graphdef)

    def _last_steps_s(self, graphdef: bool) -> float:
        """The time kept after the search: its simulations, the distributed GraphDef and,
        while it takes at most :data:`_TIMELINE_SHARE` of the budget, the plan's per-GPU
        simulation (past that, the search comes first: the timeline is simulated per GPU
        only when the other steps leave it time)."""
        timeline_s = self._timeline_s()
        kept_s = timeline_s if timeline_s <= _TIMELINE_SHARE * self.options.budget_s else 0.0
        return _FINISH_EVALUATIONS * self.evaluation_s + kept_s + self._graphdef_s(graphdef)

    def _per_gpu_steps_s(self, graphdef: bool) -> float:
        """The plan's own simulation per GPU (for its timeline) and the distributed
        GraphDef, whose compile grows with the GPUs as that simulation does."""
        return self._timeline_s() + self._graphdef_s(graphdef)

    def _timeline_s(self) -> float:
        """The plan's own simulation per GPU, for its timeline, as estimated."""
        return self.per_gpu_factor * self.evaluation_s

    def search_budget_s(self) -> float:
        """The search's seconds: what the deadline leaves after the finish's reserve
        (:meth:`search_shards` shares it among trees that take turns; shards on separate
        workers each get all of it)."""
        return max(self.deadline.left_s() - self._finish_reserve_s(), 0.0)

    def search_shard(self, seed: int, *, budget_s: float | None = None) -> SearchOutcome:
        """Run one tree (one root-parallel shard) with ``seed``; a shard left no time
        returns an outcome with no iterations and ``stop_reason="skipped"``."""
        self._enter("search")
        budget = budget_s if budget_s is not None else self.search_budget_s()
        if budget < self.evaluation_s and self.options.iterations is None:
            self.phases.leave()
            return SearchOutcome.skipped(seed)

        def report(p: SearchProgress) -> None:
            self._report("search", p.iterations, p.best_step_time_s)

        search = self._search(seed)
        try:
            outcome = search.run(
                iterations=self.options.iterations,
                budget_s=max(budget, 1e-3),
                patience=self.options.patience,
                progress=report,
                cancel=self._cancel,
                start=None
                if self.start is None
                else start_actions(self.start, search, self.op_time_s),
            )
        except BudgetExhausted:  # the deadline passed before the first iteration
            outcome = SearchOutcome.skipped(seed)
        self.phases.leave()
        return outcome

    def search_shards(
        self, seeds: Sequence[int], *, processes: int = 1, budget_s: float | None = None
    ) -> list[SearchOutcome]:
        """A tree per seed (root parallelism): one after another in this process, each for
        its share of the search budget; or, with ``processes`` above 1 where this process
        can fork (:mod:`~.forked`), that many at once in children forked from the planner
        as the phases before the search left it, each searching for the whole budget
        divided by the rounds the trees need. ``budget_s`` is the search's seconds
        (default: what the deadline leaves after the finish's reserve). The children's
        progress is merged here (iterations summed over the trees, the best step of any)
        and ``cancel`` polled here; a child touches nothing of the caller's."""
        workers = min(processes, len(seeds))
        in_turn = workers <= 1 or not can_fork()
        rounds = len(seeds) if in_turn else math.ceil(len(seeds) / workers)
        budget = (self.search_budget_s() if budget_s is None else budget_s) / rounds
        if in_turn:
            return [self.search_shard(seed, budget_s=budget) for seed in seeds]
        latest: dict[int, tuple[int, float | None]] = {}

        def merged(seed: int, progress: tuple[int, float | None]) -> None:
            latest[seed] = progress
            bests = [best for _, best in latest.values() if best is not None]
            iterations = sum(done for done, _ in latest.values())
            self._report("search", iterations, min(bests, default=None))

        self._enter("search")
        try:
            return run_forked(
                seeds,
                partial(self._forked_shard, budget_s=budget),
                processes=workers,
                on_report=merged,
                cancel=self._cancel,
            )
        finally:
            self.phases.leave()

    def _forked_shard(
        self,
        seed: int,
        report: Callable[[tuple[int, float | None]], None],
        cancelled: Callable[[], bool],
        *,
        budget_s: float,
    ) -> SearchOutcome:
        """In a forked child: one tree, its progress sent to the parent."""

        def progress(p: PlanProgress) -> None:
            if p.phase == "search":
                report((p.iterations, p.best_step_time_s))

        self._progress, self._cancel = progress, cancelled
        return self.search_shard(seed, budget_s=budget_s)

    def finish(
        self, outcomes: Sequence[SearchOutcome], *, graph_def: object | None = None
    ) -> PlanResult:
        """Decide SFB for the search's best strategy and the fastest baseline, keep the
        faster, simulate it for the trace and compile it."""
        self.start_comm_bound()  # solved beside SFB and the compile, if not yet started
        searched = [o for o in outcomes if o.iterations]
        self._record_search(outcomes, searched)
        reserve_graphdef = graph_def is not None and self.graphdef
        reserve_s = self._last_steps_s(reserve_graphdef)
        self._gather_baselines(self.deadline.left_s() - reserve_s)
        self._enter("sfb")
        contenders = self._contenders(best_outcome(searched) if searched else None)
        sfb_s = min(self.options.budget_s * _SFB_SHARE, self.deadline.left_s() - reserve_s)
        if not self.options.sfb:
            self.phases.mark("sfb", "skipped", "turned off")
        elif sfb_s <= 0:
            self.phases.mark("sfb", "skipped", "no time left in the budget")
        finals = []
        for rank, (name, strategy) in enumerate(contenders):
            decisions: tuple[SfbDecision, ...] = ()
            evaluation = None
            if self.options.sfb and sfb_s > 0:
                self._check_cancel()
                strategy, found, evaluation = apply_sfb(
                    strategy,
                    self.ir,
                    self.cluster,
                    self.evaluator.costs,
                    self.evaluator.comm,
                    time_budget_s=sfb_s / len(contenders),
                    evaluator=self.evaluator,  # holds what the search compiled
                )
                decisions = tuple(found)
            if evaluation is None:  # SFB's check simulated none of it
                evaluation = self.evaluator.evaluate(strategy)
            finals.append(
                (evaluation.result.oom, evaluation.step_time_s, rank, name, decisions, evaluation)
            )
        _, _, _, chosen_from, sfb_decisions, evaluation = min(finals, key=lambda f: f[:3])
        strategy = evaluation.strategy
        answer = pin_numbering(evaluation.resolved, self.ir, self.cluster)
        if evaluation.compiled.symmetry is not None:  # every GPU's timeline, same step
            if self.deadline.left_s() > self._per_gpu_steps_s(reserve_graphdef):
                evaluation = self.evaluator.evaluate(strategy, by_class=False)
            else:
                self.phases.mark(
                    "compile",
                    "truncated",
                    "the timeline shows the first GPU of each symmetry class: the budget "
                    "left no time to simulate every GPU",
                )
        self._enter("compile")
        if evaluation.result.oom:
            overflow = int(evaluation.result.overflow_bytes.sum())
            tried = (
                "with op groups moved to model parallelism until the budget ran out "
                "(a larger budget_s tries more)"
                if self.deadline.left_s() <= 0
                else "even with every op group model-parallel"
            )
            raise Infeasible(
                f"no strategy fits in the GPUs' memory: {overflow / 2**30:.2f} GiB over {tried}",
                overflow_bytes=overflow,
            )
        distributed, deferred = None, False
        if graph_def is not None:
            if self._graphdef_fits(self.deadline.left_s()):
                distributed = compile_graphdef(
                    graph_def,
                    self.ir,
                    self.cluster,
                    evaluation.resolved,
                    walk=self.evaluator.compiler.walk,  # cut for the evaluations already
                )
            else:  # the answer keeps its budget; the caller compiles the GraphDef after it
                deferred = True
                self.phases.reports["compile"].status = "truncated"
                self._note(
                    "compile",
                    f"the distributed GraphDef (about {self._graphdef_s(True):.1f} s to "
                    "compile) did not fit in the budget: it is compiled after the answer",
                )
        comm_bound_s = self._comm_bound_s()
        self.phases.leave()
        baselines = {name: None if b.oom else b.step_time_s for name, b in self.baselines.items()}
        return PlanResult(
            strategy=answer,
            evaluation=evaluation,
            baselines=baselines,
            lower_bound_s=self.lower_bound_s(),
            comm_bound_s=comm_bound_s,
            chosen_from=chosen_from,
            plan_time_s=self._elapsed_s(),
            iterations=sum(o.iterations for o in outcomes),
            evaluations=sum(o.evaluations for o in outcomes),
            bounded=sum(o.bounded for o in outcomes),
            transposed=sum(o.transposed for o in outcomes),
            refined=sum(o.refined for o in outcomes),
            swept=sum(o.swept for o in outcomes),
            first_better_iteration=min(
                (o.first_better_iteration for o in outcomes if o.first_better_iteration),
                default=None,
            ),
            estimated=estimated_inputs(evaluation, self.evaluator.comm),
            sfb=sfb_decisions,
            distributed=distributed,
            graphdef_deferred=deferred,
            phases=self.phases.to_dict(),
            stop_reason=_stop_reason(outcomes),
            prior=(self.prior or UniformPrior()).name,
        )

    def _record_search(
        self, outcomes: Sequence[SearchOutcome], searched: Sequence[SearchOutcome]
    ) -> None:
        """The search phase as the shards ran it (in this process or on other workers)."""
        report = self.phases.reports.setdefault("search", PhaseReport())
        if len(searched) < len(outcomes) or not outcomes:
            report.status = "skipped" if not searched else "truncated"
            report.note = f"{len(outcomes) - len(searched)} of {len(outcomes)} trees had no time"
        if not report.seconds:
            report.seconds = sum(o.elapsed_s for o in outcomes)

    def _contenders(self, best: SearchOutcome | None) -> list[tuple[str, Strategy]]:
        """The search's strategy and the fastest baseline that fits, search first, and,
        with SFB on, the fastest data-parallel baseline that fits when that is another
        one: SFB rebuilds replicated gradients from factors, so such a baseline can win
        with it where another won without (TAG Table 5's setting). When nothing fits, the
        search's (or, without a search, DP over every GPU's) made feasible by more model
        parallelism, and the memory-spreading baselines the budget skipped."""
        fitting = {name: b.step_time_s for name, b in self.baselines.items() if not b.oom}
        contenders = [] if best is None or best.oom else [("search", best.strategy)]
        data_parallel = fitting.keys() & DATA_PARALLEL_BASELINES if self.options.sfb else set()
        for names in (fitting.keys(), data_parallel):
            if not names:
                continue
            name = min(names, key=lambda n: (fitting[n], n))
            if all(name != taken for taken, _ in contenders):
                contenders.append((name, self.baselines[name].strategy))
        if not contenders:
            search = self._search(best.seed if best else self.options.seed)
            start = best.actions if best and not best.pipelined else search.complete([0])
            _, evaluation = make_feasible(search, start, time_left_s=self.deadline.left_s)
            contenders.append(("search", evaluation.strategy))
            costs = search.evaluator.costs
            contenders += [
                (name, baseline_strategy(name, self.ir, self.cluster, costs))
                for name in _MEMORY_SPREADING
                if name not in self.baselines
            ]
        if self.start is not None:
            contenders.append(("start", self.start))
        return contenders


def _best_fitting_s(scores: Iterable[BaselineScore]) -> float:
    """The fastest step among ``scores`` that fit in memory (infinite when none does)."""
    return min((s.step_time_s for s in scores if not s.oom), default=math.inf)


def _stop_reason(outcomes: Sequence[SearchOutcome]) -> str:
    """Why the search ended: one reason, or the shards' reasons joined."""
    reasons = sorted({o.stop_reason for o in outcomes})
    return "+".join(reasons) if reasons else "skipped"


def plan(
    ir: GraphIR,
    cluster: Cluster,
    *,
    graph_def: object | None = None,
    options: PlanOptions | None = None,
    profiles: ProfileSource | None = None,
    comm: CommModel | None = None,
    prior: Prior | None = None,
    progress: Callable[[PlanProgress], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    deadline: Deadline | None = None,
    processes: int = 1,
) -> PlanResult:
    """Plan ``ir`` on ``cluster`` (module docstring); ``graph_def`` (the graph ``ir`` was
    analyzed from) adds the distributed GraphDef to the result, unless its compile does
    not fit in what the budget leaves (``result.graphdef_deferred``: compile it then with
    ``result.with_graphdef``). ``deadline`` (default:
    ``options.budget_s`` from now) lets a caller count work done before, such as reading
    and analyzing the graph. ``processes`` above 1 runs that many of the ``shards`` trees
    at once in forked processes (:meth:`Planner.search_shards`): a machine's spare cores
    search for the whole budget instead of the trees taking turns."""
    planner = Planner(
        ir,
        cluster,
        options=options,
        profiles=profiles,
        comm=comm,
        prior=prior,
        progress=progress,
        cancel=cancel,
        deadline=deadline,
        graphdef=graph_def is not None,
    )
    planner.start_comm_bound()  # solved while the search runs
    seeds = [planner.options.seed + k for k in range(planner.options.shards)]
    outcomes = planner.search_shards(seeds, processes=processes)
    return planner.finish(outcomes, graph_def=graph_def)
