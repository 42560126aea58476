"""From a graph and a cluster to a deployment plan (DESIGN.md §7, TAG §4).

:func:`plan` runs the phases in order, reporting each through ``progress``:

* **group**: METIS op groups (TAG §4.1.1), compute time averaged over the cluster's GPU
  types;
* **baselines**: every baseline strategy through the same compiler and simulator; DP-NCCL's
  step is the reference the search's rewards are measured against;
* **search**: MCTS (TAG §4.2.2) over the groups' decisions, ``shards`` trees with seeds
  ``seed, seed + 1, ...`` (root parallelism), merged by best result; the first tree
  breaks ties in the candidate generator's order, the others shuffle them;
* **sfb**: sufficient-factor broadcast decided by TAG's ILP for every replicated gradient
  (TAG §4.2.3), kept only when the simulator says it helps, for both the search's best
  strategy and the fastest baseline (SFB can turn the order around);
* **compile**: the final simulation (with its trace) and, when the GraphDef is given, the
  placed distributed GraphDef and device map.

The plan is the fastest strategy that fits in memory among what the search found and the
baselines (every baseline is a strategy of the same space, so no plan is ever worse than
one of them; ``PlanResult.chosen_from`` says which won). When nothing fits, op groups move
to model parallelism until the step fits (:func:`~.search.mcts.make_feasible`), else
:class:`~.errors.Infeasible` names the overflow.

:class:`Planner` exposes the phases one by one so a job can be spread over workers: each
worker builds a ``Planner`` for the same inputs (everything is deterministic), runs
:meth:`Planner.search_shard` for its seed, and one of them calls :meth:`Planner.finish`
with every shard's :class:`~.search.mcts.SearchOutcome`.

Budgets: ``budget_s`` bounds the whole plan's wall time (the search gets what the other
phases leave, SFB's ILPs a share of it); ``iterations`` bounds each tree. Compiling the
distributed GraphDef comes on top. With an iteration budget that the time
budget does not cut, a seed always gives the same plan.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tagplan.planner.compile.graphdef import compile_graphdef
from tagplan.planner.cost.comm import CommModel
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.cost.profile import ProfileSource
from tagplan.planner.errors import Cancelled, Infeasible, InvalidInput
from tagplan.planner.evaluate import Evaluation, Evaluator
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.result import PlanResult
from tagplan.planner.search.actions import DEFAULT_MAX_ACTIONS, ActionSpace
from tagplan.planner.search.baselines import BASELINES, baseline_strategy
from tagplan.planner.search.grouping import (
    DEFAULT_MAX_GROUPS,
    cluster_mean_op_time_s,
    group_ops,
)
from tagplan.planner.search.lower_bound import lower_bound
from tagplan.planner.search.mcts import (
    SearchOutcome,
    SearchProgress,
    StrategySearch,
    best_outcome,
    make_feasible,
)
from tagplan.planner.search.prior import Prior
from tagplan.planner.search.sfb import SfbDecision, apply_sfb
from tagplan.planner.strategy import Strategy
from tagplan.planner.topology import Cluster

__all__ = [
    "PHASES",
    "PlanOptions",
    "PlanProgress",
    "PlanResult",
    "Planner",
    "SearchOutcome",
    "plan",
]

PHASES = ("analyze", "group", "baselines", "search", "sfb", "compile")
REFERENCE = "dp-nccl"
# share of the budget SFB's ILPs may take after the search
_SFB_SHARE = 0.08
# simulations after the search: the search's plan and the best baseline, SFB's checks
_FINISH_EVALUATIONS = 4


@dataclass(frozen=True)
class PlanOptions:
    budget_s: float = 60.0
    iterations: int | None = None
    seed: int = 0
    sfb: bool = True
    max_groups: int = DEFAULT_MAX_GROUPS
    shards: int = 1
    max_actions: int = DEFAULT_MAX_ACTIONS

    def __post_init__(self) -> None:
        if not self.budget_s > 0:
            raise InvalidInput(f"budget_s must be positive, got {self.budget_s}")
        if self.iterations is not None and self.iterations < 1:
            raise InvalidInput(f"iterations must be at least 1, got {self.iterations}")
        if self.shards < 1:
            raise InvalidInput(f"shards must be at least 1, got {self.shards}")


@dataclass(frozen=True)
class PlanProgress:
    phase: str  # one of PHASES
    iterations: int
    best_step_time_s: float | None
    best_speedup: float | None  # over DP-NCCL
    elapsed_s: float


class Planner:
    """The phases of :func:`plan` for one graph and cluster (module docstring).

    Construction runs the group and baseline phases.
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
    ) -> None:
        self.started = time.perf_counter()
        self.ir, self.cluster = ir, cluster
        self.options = options or PlanOptions()
        self.prior = prior
        self._progress, self._cancel = progress, cancel
        self.phase_seconds: dict[str, float] = {}
        self._phase: str | None = None
        self._phase_started = self.started
        self.reference_step_s: float | None = None
        costs = OpCostModel(ir, profiles=profiles, gpu_types=cluster.to_spec().type_table())
        self.evaluator = Evaluator(ir, cluster, costs=costs, comm=comm)

        self._enter("group")
        self.grouping = group_ops(
            ir,
            cluster_mean_op_time_s(ir, cluster, costs),
            max_groups=self.options.max_groups,
            seed=self.options.seed,
        )
        self.space = ActionSpace(ir, cluster, costs, max_actions=self.options.max_actions)

        self._enter("baselines")
        self.baseline_evaluations: dict[str, Evaluation] = {}
        for name in BASELINES:
            self._check_cancel()
            strategy = baseline_strategy(name, ir, cluster, costs)
            started = time.perf_counter()
            self.baseline_evaluations[name] = self.evaluator.evaluate(strategy)
            if name == REFERENCE:
                self.evaluation_s = time.perf_counter() - started
        self.reference_step_s = self.baseline_evaluations[REFERENCE].step_time_s
        self._leave()

    # phases ---------------------------------------------------------------------------

    def _enter(self, phase: str) -> None:
        self._leave()
        self._phase, self._phase_started = phase, time.perf_counter()
        self._report(phase, 0, None)

    def _leave(self) -> None:
        phase = self._phase
        if phase is not None:
            elapsed = time.perf_counter() - self._phase_started
            self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + elapsed
            self._phase = None

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
                elapsed_s=time.perf_counter() - self.started,
            )
        )

    def _check_cancel(self) -> None:
        if self._cancel is not None and self._cancel():
            raise Cancelled("planning was cancelled")

    def _search(self, seed: int) -> StrategySearch:
        return StrategySearch(
            self.evaluator,
            self.grouping,
            self.space,
            reference_step_s=self.reference_step_s,
            prior=self.prior,
            seed=seed,
            shuffle_ties=seed != self.options.seed,
        )

    def search_budget_s(self, shards: int = 1) -> float:
        """Seconds each of ``shards`` trees run in this process: the budget left after the
        phases so far, less what SFB and the last simulations (timed like DP-NCCL's) need."""
        finish = self.options.budget_s * _SFB_SHARE + _FINISH_EVALUATIONS * self.evaluation_s
        left = self.options.budget_s - finish - (time.perf_counter() - self.started)
        return max(left, 0.0) / shards

    def search_shard(self, seed: int, *, budget_s: float | None = None) -> SearchOutcome:
        """Run one tree (one root-parallel shard) with ``seed``."""
        self._enter("search")

        def report(p: SearchProgress) -> None:
            self._report("search", p.iterations, p.best_step_time_s)

        search = self._search(seed)
        outcome = search.run(
            iterations=self.options.iterations,
            budget_s=max(budget_s if budget_s is not None else self.search_budget_s(), 1e-3),
            progress=report,
            cancel=self._cancel,
        )
        self._leave()
        return outcome

    def finish(
        self, outcomes: Sequence[SearchOutcome], *, graph_def: object | None = None
    ) -> PlanResult:
        """Decide SFB for the search's best strategy and the fastest baseline, keep the
        faster, simulate it for the trace and compile it."""
        self._enter("sfb")
        contenders = self._contenders(best_outcome(outcomes))
        finals = []
        for rank, (name, strategy) in enumerate(contenders):
            decisions: tuple[SfbDecision, ...] = ()
            if self.options.sfb:
                self._check_cancel()
                strategy, found = apply_sfb(
                    strategy,
                    self.ir,
                    self.cluster,
                    self.evaluator.costs,
                    self.evaluator.comm,
                    time_budget_s=self.options.budget_s * _SFB_SHARE / len(contenders),
                )
                decisions = tuple(found)
            evaluation = self.evaluator.evaluate(strategy)
            finals.append(
                (evaluation.result.oom, evaluation.step_time_s, rank, name, decisions, evaluation)
            )
        _, _, _, chosen_from, sfb_decisions, evaluation = min(finals, key=lambda f: f[:3])
        strategy = evaluation.strategy
        self._enter("compile")
        if evaluation.result.oom:
            overflow = int(evaluation.result.overflow_bytes.sum())
            raise Infeasible(
                f"no strategy fits in the GPUs' memory: {overflow / 2**30:.2f} GiB over "
                "even with every op group model-parallel",
                overflow_bytes=overflow,
            )
        distributed = None
        if graph_def is not None:
            distributed = compile_graphdef(graph_def, self.ir, self.cluster, evaluation.resolved)
        bound = lower_bound(self.ir, self.cluster, self.evaluator.costs)
        self._leave()
        baselines = {
            name: None if e.result.oom else e.step_time_s
            for name, e in self.baseline_evaluations.items()
        }
        compute_measured = evaluation.compiled.measured_fraction
        return PlanResult(
            strategy=strategy,
            evaluation=evaluation,
            baselines=baselines,
            lower_bound_s=bound.step_time_s,
            chosen_from=chosen_from,
            plan_time_s=time.perf_counter() - self.started,
            iterations=sum(o.iterations for o in outcomes),
            evaluations=sum(o.evaluations for o in outcomes),
            first_better_iteration=min(
                (o.first_better_iteration for o in outcomes if o.first_better_iteration),
                default=None,
            ),
            estimated={
                "compute_measured_fraction": compute_measured,
                "compute": "measured"
                if compute_measured >= 1
                else "estimated"
                if compute_measured <= 0
                else "partly measured",
                "communication": "fitted" if self.evaluator.comm.profile else "analytic",
            },
            sfb=sfb_decisions,
            distributed=distributed,
            phase_seconds=dict(self.phase_seconds),
        )

    def _contenders(self, best: SearchOutcome) -> list[tuple[str, Strategy]]:
        """The search's strategy and the fastest baseline that fits, search first; when
        nothing fits, the search's made feasible by more model parallelism."""
        fitting = {
            name: e.step_time_s for name, e in self.baseline_evaluations.items() if not e.result.oom
        }
        contenders = [] if best.oom else [("search", best.strategy)]
        if fitting:
            name = min(fitting, key=lambda n: (fitting[n], n))
            contenders.append((name, self.baseline_evaluations[name].strategy))
        if not contenders:
            _, evaluation = make_feasible(self._search(best.seed), best.actions)
            contenders.append(("search", evaluation.strategy))
        return contenders


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
) -> PlanResult:
    """Plan ``ir`` on ``cluster`` (module docstring); ``graph_def`` (the graph ``ir`` was
    analyzed from) adds the distributed GraphDef to the result."""
    planner = Planner(
        ir,
        cluster,
        options=options,
        profiles=profiles,
        comm=comm,
        prior=prior,
        progress=progress,
        cancel=cancel,
    )
    shards = planner.options.shards
    budget = planner.search_budget_s(shards)
    outcomes = [
        planner.search_shard(planner.options.seed + k, budget_s=budget) for k in range(shards)
    ]
    return planner.finish(outcomes, graph_def=graph_def)
