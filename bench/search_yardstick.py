"""The search against a yardstick: how close the tree search comes, for the same number of
simulated strategies, to an independent local search over the same op groups, actions and
simulator, and to the best *uniform* strategy (every op group taking one action).

Three searchers, each a :class:`~tagplan.planner.search.mcts.StrategySearch` of its own
over the same inputs, from the same first strategy (every op group replicated with
AllReduce on every GPU, the candidate generator's first action): the uniform-prior MCTS
alone for the whole budget (``mcts``); the same MCTS as the planner runs it
(``mcts+refine``: it stops at the default convergence rule and refines its best by
single-group moves, which may end before the budget); and simulated annealing, whose
move changes one op group's action
(a group drawn in proportion to its compute time, an action drawn uniformly) or, one move
in five, gives every group one action drawn uniformly (single-group moves alone cannot
cross from one placement to another without passing through slow or overflowing mixes),
accepts a worse reward with probability ``exp(-loss / T)``, ``T`` falling geometrically
from 0.05 to 0.0005 of the current reward over its evaluations, and keeps the best it
saw. The best uniform strategy (every op group taking one action, all of them tried) is
reported beside them, outside their budgets.

Budgets are counted in simulated strategies, not seconds, so the comparison does not
depend on how loaded the machine is. The clusters are random ones of seeds the suite's
benchmarks do not use (TAG §5.2's generator), four and eight machines. For each case:
the best step each searcher reached, relative to the best known (the best of all of
them), and the strategies each simulated before it came within 1% of that.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time

import numpy as np

from bench.plan_quality import analyzed
from bench.report import write_section
from tagplan.planner.errors import Cancelled
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.options import DEFAULT_PATIENCE
from tagplan.planner.search.actions import ActionSpace
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.search.grouping import cluster_mean_op_time_s, group_ops
from tagplan.planner.search.mcts import SearchProgress, StrategySearch
from tagplan.planner.topology import load_cluster

MODELS = ["vgg19", "inception_v3", "bert_small", "wide_deep"]
CLUSTERS = ["random:901:4", "random:903:8"]
SEARCHERS = ("mcts", "mcts+refine", "annealing")
_UNIFORM_MOVES = 0.2  # the annealer's share of moves that give every group one action


class _Trace:
    """Best step time (a plan that fits) after each simulated strategy."""

    def __init__(self) -> None:
        self.best_s: list[float] = []

    def record(self, step_s: float | None) -> None:
        previous = self.best_s[-1] if self.best_s else math.inf
        self.best_s.append(min(previous, math.inf if step_s is None else step_s))

    def first_within(self, target_s: float) -> int | None:
        for count, best in enumerate(self.best_s, start=1):
            if best <= target_s:
                return count
        return None


def _searcher(evaluator, grouping, space, reference_s: float) -> StrategySearch:
    return StrategySearch(evaluator, grouping, space, reference_step_s=reference_s)


def run_mcts(search: StrategySearch, evaluations: int, patience: int | None = None) -> _Trace:
    """The tree search until it has simulated ``evaluations`` distinct strategies (or
    run 20 times as many iterations); with ``patience``, the planner's convergence rule,
    the refinement after it, and a search that may end before the budget."""
    trace = _Trace()

    def watch(p: SearchProgress) -> None:
        while len(trace.best_s) < p.evaluations:
            trace.record(p.best_step_time_s)

    with contextlib.suppress(Cancelled):  # cancelled once the budget is reached
        search.run(
            iterations=20 * evaluations,
            patience=patience,
            progress=watch,
            cancel=lambda: len(trace.best_s) >= evaluations,
        )
    return trace


def best_uniform(search: StrategySearch) -> _Trace:
    """Every uniform strategy once: the trace of their steps."""
    trace = _Trace()
    for action in range(len(search.space)):
        scored = search.score((action,) * search.grouping.num_groups)
        trace.record(None if scored.oom else scored.step_time_s)
    return trace


def run_annealing(
    search: StrategySearch, start: tuple[int, ...], evaluations: int, seed: int
) -> _Trace:
    """Simulated annealing from ``start`` until ``evaluations`` distinct strategies."""
    rng = np.random.default_rng(seed)
    weights = search.grouping.group_time_s / search.grouping.group_time_s.sum()
    trace = _Trace()
    current = start
    scored = search.score(current)
    current_reward = scored.reward
    seen = {current}
    trace.record(None if scored.oom else scored.step_time_s)
    steps = 0
    while len(seen) < evaluations and steps < 50 * evaluations:
        steps += 1
        fraction = len(seen) / evaluations
        temperature = abs(current_reward) * 0.05 * (0.01**fraction)
        action = int(rng.integers(len(search.space)))
        if rng.random() < _UNIFORM_MOVES:
            key = (action,) * len(current)
        else:
            changed = list(current)
            changed[int(rng.choice(len(changed), p=weights))] = action
            key = tuple(changed)
        scored = search.score(key)
        if key not in seen:
            seen.add(key)
            trace.record(None if scored.oom else scored.step_time_s)
        loss = current_reward - scored.reward
        if loss <= 0 or rng.random() < math.exp(-loss / max(temperature, 1e-12)):
            current, current_reward = key, scored.reward
    return trace


def case(model: str, cluster_name: str, evaluations: int) -> dict:
    ir = analyzed(model)
    cluster = load_cluster(cluster_name)
    evaluator = Evaluator(ir, cluster)
    reference_s = evaluator.evaluate(
        baseline_strategy("dp-nccl", ir, cluster, evaluator.costs)
    ).step_time_s
    grouping = group_ops(ir, cluster_mean_op_time_s(ir, cluster, evaluator.costs))
    space = ActionSpace(ir, cluster, evaluator.costs)
    started = time.perf_counter()
    uniform = best_uniform(_searcher(evaluator, grouping, space, reference_s))
    data_parallel = (0,) * grouping.num_groups
    traces = {
        "mcts": run_mcts(_searcher(evaluator, grouping, space, reference_s), evaluations),
        "mcts+refine": run_mcts(
            _searcher(evaluator, grouping, space, reference_s), evaluations, DEFAULT_PATIENCE
        ),
        "annealing": run_annealing(
            _searcher(evaluator, grouping, space, reference_s), data_parallel, evaluations, 0
        ),
    }
    known_s = min(min(t.best_s) for t in (*traces.values(), uniform))
    return {
        "model": model,
        "cluster": cluster_name,
        "groups": grouping.num_groups,
        "actions": len(space),
        "known_s": known_s,
        "uniform_s": min(uniform.best_s),
        "best_s": {name: min(t.best_s) for name, t in traces.items()},
        "within_1pct": {name: t.first_within(known_s * 1.01) for name, t in traces.items()},
        "wall_s": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--clusters", nargs="*", default=CLUSTERS)
    parser.add_argument("--evaluations", type=int, default=150)
    args = parser.parse_args()
    header = (
        "| model | cluster | op groups | actions | best uniform / best known | "
        + " | ".join(f"{s}: best / known, to 1%" for s in SEARCHERS)
        + " |"
    )
    lines = [header, "|" + " --- |" * 2 + " ---: |" * (3 + len(SEARCHERS))]
    results = []
    for model in args.models:
        for cluster_name in args.clusters:
            found = case(model, cluster_name, args.evaluations)
            results.append(found)
            known = found["known_s"]
            cells = [
                f"{found['best_s'][s] / known:.3f}, {found['within_1pct'][s] or 'never'}"
                for s in SEARCHERS
            ]
            line = (
                f"| {model} | {cluster_name} | {found['groups']} | {found['actions']} | "
                f"{found['uniform_s'] / known:.3f} | " + " | ".join(cells) + " |"
            )
            lines.append(line)
            print(line, f"({found['wall_s']:.0f} s)", flush=True)
    summary = []
    for searcher in SEARCHERS:
        gaps = [r["best_s"][searcher] / r["known_s"] for r in results]
        reached = [r["within_1pct"][searcher] for r in results]
        hits = [n for n in reached if n is not None]
        summary.append(
            f"{searcher}: geometric-mean best / known "
            f"{math.exp(statistics.fmean(map(math.log, gaps))):.3f}, within 1% in "
            f"{len(hits)} of {len(results)} cases"
            + (f" (median {statistics.median(hits):.0f} strategies)" if hits else "")
        )
    uniform_best = [r for r in results if r["uniform_s"] <= r["known_s"] * 1.005]
    mixed = [
        f"{r['model']} on {r['cluster']} ({r['uniform_s'] / r['known_s']:.2f}x)"
        for r in results
        if r not in uniform_best
    ]
    summary.append(
        f"the best uniform strategy is within 0.5% of the best known in {len(uniform_best)} "
        f"of {len(results)} cases; a strategy mixing decisions is faster in "
        + ("; ".join(mixed) if mixed else "none")
        + " (best uniform / best known)"
    )
    body = "\n".join(
        [
            __doc__.split("\n\n", 1)[1].replace("\n", " ").strip(),
            "",
            f"Budget: {args.evaluations} simulated strategies per searcher; cells are "
            "*best step / best known step, strategies simulated until within 1% of the "
            "best known* (`never`: not within the budget).",
            "",
            *lines,
            "",
            *(f"- {line}" for line in summary),
        ]
    )
    write_section(
        "search-yardstick",
        "The search against a local-search yardstick",
        "python -m bench.search_yardstick",
        body,
    )


if __name__ == "__main__":
    main()
