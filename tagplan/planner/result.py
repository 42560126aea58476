"""What a plan returns (docs/design.md §7): the strategy, its predicted step and memory, every
baseline on the same simulator, the lower bound, and which numbers were estimated."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from tagplan.planner.compile.graphdef import DistributedGraph, compile_graphdef
from tagplan.planner.cost.comm import CommModel
from tagplan.planner.evaluate import Evaluation
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.report import report_markdown
from tagplan.planner.search.baselines import DATA_PARALLEL_BASELINES
from tagplan.planner.search.sfb import SfbDecision
from tagplan.planner.sim.trace import chrome_trace
from tagplan.planner.strategy import Strategy
from tagplan.planner.topology import Cluster

__all__ = ["PlanResult", "estimated_inputs"]


def estimated_inputs(evaluation: Evaluation, comm: CommModel) -> dict[str, Any]:
    """Which of a plan's inputs were measured and which estimated: the share of compute
    time from measured profiles, and whether communication was fitted to a profile."""
    measured = evaluation.compiled.measured_fraction
    compute = "measured" if measured >= 1 else "estimated" if measured <= 0 else "partly measured"
    return {
        "compute_measured_fraction": measured,
        "compute": compute,
        "communication": "fitted" if comm.profile else "analytic",
    }


@dataclass(frozen=True, eq=False)
class PlanResult:
    """A plan for one graph on one cluster.

    ``baselines`` maps each baseline to its simulated step in seconds, ``None`` when it
    runs out of memory. ``chosen_from`` is ``"search"`` when the tree search found the
    strategy (a pipeline among them: ``strategy.pipeline`` says), else the name of the
    baseline that no strategy the search saw could beat.
    ``lower_bound_s`` is the step no strategy beats with free communication
    (:mod:`~.search.lower_bound`); ``comm_bound_s`` the step no strategy of the search's
    candidate actions beats counting communication (:mod:`~.search.comm_bound`), ``None``
    when the budget left no time to solve it.
    ``estimated`` says which inputs were analytic estimates rather than measurements.
    ``phases`` gives each phase's status (``done``, ``truncated``, ``skipped``), wall time
    and note (:class:`~tagplan.planner.budget.PhaseReport`); ``stop_reason`` why the
    search ended (``converged``, ``exhausted``, ``budget``, ``iterations``, ``target``,
    ``skipped``; several shards join theirs with ``+``).
    ``plan_time_s`` is the wall time from the start of planning to the result; ``prior``
    names the search's prior (``uniform`` or the GNN checkpoint, ``gnn:<digest>``).
    ``graphdef_deferred``: the distributed GraphDef was asked for but its compile did not
    fit in what the budget left, so the plan answered without it (``distributed`` is
    ``None`` until the caller compiles it after the answer, :meth:`with_graphdef`).
    """

    strategy: Strategy
    evaluation: Evaluation
    baselines: dict[str, float | None]
    lower_bound_s: float
    chosen_from: str
    plan_time_s: float
    iterations: int
    evaluations: int
    first_better_iteration: int | None
    estimated: dict[str, Any]
    sfb: tuple[SfbDecision, ...] = ()
    distributed: DistributedGraph | None = None
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    stop_reason: str = "budget"
    prior: str = "uniform"
    comm_bound_s: float | None = None
    graphdef_deferred: bool = False
    bounded: int = 0  # strategies the search did not simulate: their step bound lost
    transposed: int = 0  # nor these: each compiles as one it simulated
    refined: int = 0  # iterations spent moving the tree's best one op group at a time
    swept: int = 0  # iterations on uniform strategies, least step bound first

    def with_graphdef(self, graph_def: Any, ir: GraphIR, cluster: Cluster) -> PlanResult:
        """This result with its distributed GraphDef compiled over ``graph_def`` (the graph
        ``ir`` was analyzed from) for the chosen strategy: what a plan whose budget left
        the compile out (``graphdef_deferred``) answers after its answer."""
        compiled = compile_graphdef(graph_def, ir, cluster, self.evaluation.resolved)
        return replace(self, distributed=compiled)

    @property
    def phase_seconds(self) -> dict[str, float]:
        return {name: float(p["seconds"]) for name, p in self.phases.items()}

    @property
    def step_time_s(self) -> float:
        return self.evaluation.step_time_s

    @property
    def speedup_vs_dp_nccl(self) -> float | None:
        """Over TAG's reference, DP-NCCL (kept as the papers' column)."""
        reference = self.baselines.get("dp-nccl")
        return reference / self.step_time_s if reference else None

    @property
    def best_data_parallel(self) -> tuple[str, float] | None:
        """The fastest data-parallel baseline that fits, by name: what a user would run
        without a planner."""
        fitting = [
            (seconds, name)
            for name, seconds in self.baselines.items()
            if name in DATA_PARALLEL_BASELINES and seconds is not None
        ]
        return (min(fitting)[1], min(fitting)[0]) if fitting else None

    @property
    def speedup_vs_best_data_parallel(self) -> float | None:
        """The headline: the margin over the best data-parallel baseline."""
        best = self.best_data_parallel
        return best[1] / self.step_time_s if best else None

    @property
    def peak_memory_bytes(self) -> dict[str, int]:
        names = self.evaluation.compiled.task_graph.device_names
        peaks = self.evaluation.result.peak_memory_bytes
        return {str(n): int(b) for n, b in zip(names, peaks, strict=True)}

    def chrome_trace(self) -> dict[str, Any]:
        """The predicted step as a Chrome trace (opens in Perfetto)."""
        return chrome_trace(self.evaluation.compiled.task_graph, self.evaluation.result)

    def summary(self) -> dict[str, Any]:
        """Every number of the plan as one JSON-able document (no large blobs)."""
        result = self.evaluation.result
        names = self.evaluation.compiled.task_graph.device_names
        return {
            "step_time_s": self.step_time_s,
            "oom": bool(result.oom),
            "baselines": self.baselines,
            "lower_bound_s": self.lower_bound_s,
            "speedup_vs_dp_nccl": self.speedup_vs_dp_nccl,
            "best_data_parallel": self.best_data_parallel[0] if self.best_data_parallel else None,
            "speedup_vs_best_data_parallel": self.speedup_vs_best_data_parallel,
            "ratio_to_lower_bound": self.step_time_s / self.lower_bound_s
            if self.lower_bound_s > 0
            else None,
            "comm_bound_s": self.comm_bound_s,
            "ratio_to_comm_bound": self.step_time_s / self.comm_bound_s
            if self.comm_bound_s
            else None,
            "chosen_from": self.chosen_from,
            "graphdef_deferred": self.graphdef_deferred,
            "plan_time_s": self.plan_time_s,
            "phase_seconds": self.phase_seconds,
            "phases": self.phases,
            "stop_reason": self.stop_reason,
            "prior": self.prior,
            "iterations": self.iterations,
            "evaluations": self.evaluations,
            "bounded": self.bounded,
            "transposed": self.transposed,
            "refined": self.refined,
            "swept": self.swept,
            "first_better_iteration": self.first_better_iteration,
            "peak_memory_bytes": self.peak_memory_bytes,
            "device_busy_fraction": {
                str(n): float(1 - f)
                for n, f in zip(names, result.device_idle_fraction, strict=True)
            },
            "sfb": [
                {
                    "parameter": d.parameter,
                    "applied": d.applied,
                    "duplicated_ops": len(d.duplicate_ops),
                    "saving_s": d.saving_s,
                    "solve_time_s": d.solve_time_s,
                }
                for d in self.sfb
            ],
            "estimated": self.estimated,
            "strategy": self.strategy.model_dump(mode="json", exclude_none=True),
        }

    def report_markdown(self, title: str = "tagplan plan") -> str:
        """A human-readable report (:func:`report_markdown` of :meth:`summary`)."""
        return report_markdown(self.summary(), title)
