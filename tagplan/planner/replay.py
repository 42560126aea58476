"""A plan answered from the strategy cache (docs/design.md §9, "Repeat jobs and warm
starts").

A cached plan for the same graph, batch size and cost inputs on an isomorphic cluster
answers a new job without a search: its strategy, remapped to the job's numbering
(:class:`~tagplan.planner.strategy_remap.ClusterMapping`), is simulated once more on the
job's cluster — the step time, memory per GPU and trace are those of this numbering, not
copied — and the numbers that do not depend on the numbering (every baseline's step, the
lower bound) come from the cached plan, which computed them with the same cost inputs.
The distributed GraphDef is the cached one renumbered
(:func:`~tagplan.planner.compile.renumber.renumber_graph`).
"""

from __future__ import annotations

import time
from typing import Any

from tagplan.planner.cost.comm import CommModel
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.cost.profile import ProfileSource
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.result import PlanResult, estimated_inputs
from tagplan.planner.strategy import Strategy
from tagplan.planner.topology import Cluster

__all__ = ["replay_plan"]


def replay_plan(
    ir: GraphIR,
    cluster: Cluster,
    strategy: Strategy,
    cached: dict[str, Any],
    *,
    profiles: ProfileSource | None = None,
    comm: CommModel | None = None,
    started_at_s: float | None = None,
) -> PlanResult:
    """``strategy`` (in ``cluster``'s numbering) re-simulated, with the baselines and lower
    bound of the ``cached`` plan's summary; ``chosen_from`` is ``"cache"``.
    ``started_at_s`` (epoch seconds) starts the plan's clock; default: now."""
    started = time.time() if started_at_s is None else started_at_s
    simulate_started = time.perf_counter()
    evaluator = Evaluator(ir, cluster, costs=OpCostModel(ir, cluster, profiles=profiles), comm=comm)
    evaluation = evaluator.evaluate(strategy, by_class=False)
    seconds = time.perf_counter() - simulate_started
    return PlanResult(
        strategy=evaluation.strategy,
        evaluation=evaluation,
        baselines=dict(cached["baselines"]),
        lower_bound_s=float(cached["lower_bound_s"]),
        comm_bound_s=cached.get("comm_bound_s"),
        chosen_from="cache",
        plan_time_s=time.time() - started,
        iterations=0,
        evaluations=1,
        first_better_iteration=None,
        estimated=estimated_inputs(evaluation, evaluator.comm),
        phases={"compile": {"status": "done", "seconds": seconds, "note": "re-simulated"}},
        stop_reason="cache",
        prior=str(cached.get("prior", "uniform")),
    )
