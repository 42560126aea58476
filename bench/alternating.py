"""Plans of one zoo model and cluster made in two or more ways, the ways alternating from
run to run so that a machine's drift over the runs weighs on each way alike."""

from __future__ import annotations

import argparse
from unittest import mock

from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.options import PlanOptions
from tagplan.planner.plan import plan
from tagplan.planner.result import PlanResult
from tagplan.planner.topology import load_cluster


def plans_each_way(
    model: str,
    cluster_name: str,
    patches: dict[str, tuple[str, object]],
    budget_s: float,
    runs: int,
) -> dict[str, list[PlanResult]]:
    """``runs`` plans of the zoo ``model`` on ``cluster_name`` per way (the uniform prior,
    the convergence stop off, ``budget_s``); each way is ``(target, value)`` patched
    (:func:`unittest.mock.patch`) while its plans run."""
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    results: dict[str, list[PlanResult]] = {way: [] for way in patches}
    ways = list(patches.items())
    for run in range(runs):
        for way, (target, value) in ways if run % 2 == 0 else ways[::-1]:
            with mock.patch(target, value):
                options = PlanOptions(budget_s=budget_s, patience=None)
                results[way].append(plan(ir, load_cluster(cluster_name), options=options))
    return results


def way_arguments(description: str) -> argparse.Namespace:
    """The command line of such a comparison: ``--budget-s`` and ``--runs`` per way."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--budget-s", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    return parser.parse_args()
