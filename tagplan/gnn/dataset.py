"""Training data for the prior: search states and the visit distributions the search
reached from them (TAG §4.2.2), generated case by case and stored as plain arrays.

A **case** is one graph on one cluster with a seed. :func:`generate_case` builds the
search exactly as a plan does (METIS groups, candidate actions, DP-NCCL as the
reference), runs it for a fixed number of iterations with the given prior (uniform in
the first round, the previous round's network after: AlphaZero's loop), and keeps every
vertex visited at least ``min_visits`` times with its visit distribution. An iteration
budget, never a time budget, bounds it, so a case gives the same examples on any machine.

Each case is one ``.npz`` file (no pickles) named by the case, written atomically, so
generation resumes by skipping files that exist.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tagplan.gnn.features import EDGE_FEATURES, StateGraph, state_graph, static_graph
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.actions import ActionSpace
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.search.grouping import cluster_mean_op_time_s, group_ops
from tagplan.planner.search.mcts import StrategySearch
from tagplan.planner.search.prior import Prior
from tagplan.planner.topology import load_cluster

__all__ = ["Case", "Example", "case_file", "generate_case", "load_case", "search_for"]

_EDGE_KEYS = {edge_type: "__".join(edge_type) for edge_type in EDGE_FEATURES}


@dataclass(frozen=True)
class Case:
    """One graph (``zoo:NAME`` or a file) on one cluster (a name or spec path), a seed."""

    graph: str
    cluster: str
    seed: int

    @property
    def slug(self) -> str:
        text = f"{self.graph}@{self.cluster}#{self.seed}"
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


@dataclass(frozen=True, eq=False)
class Example:
    """One search state and the target distribution over its actions."""

    graph: StateGraph
    target: np.ndarray  # float32 per action


def case_file(directory: Path, case: Case) -> Path:
    return directory / f"{case.slug}.npz"


_IR_CACHE: dict[str, GraphIR] = {}


def _ir(graph: str) -> GraphIR:
    found = _IR_CACHE.get(graph)
    if found is None:
        source = load_graph_source(graph)
        found = _IR_CACHE[graph] = analyze(
            source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss
        )
    return found


def search_for(
    case: Case, prior: Prior | None, *, scores: dict | None = None, shuffle_ties: bool = True
) -> StrategySearch:
    """The search a plan would run for ``case`` (module docstring), with ``prior``;
    ``scores`` shares simulations with other searches of the same case. Training breaks
    ties at random (TAG's pure MCTS), so the targets do not learn the candidate order;
    a plan's first tree breaks them in that order (``shuffle_ties=False``)."""
    ir, cluster = _ir(case.graph), load_cluster(case.cluster)
    evaluator = Evaluator(ir, cluster)
    grouping = group_ops(ir, cluster_mean_op_time_s(ir, cluster, evaluator.costs), seed=case.seed)
    space = ActionSpace(ir, cluster, evaluator.costs)
    reference = evaluator.evaluate(baseline_strategy("dp-nccl", ir, cluster, evaluator.costs))
    return StrategySearch(
        evaluator,
        grouping,
        space,
        reference_step_s=reference.step_time_s,
        prior=prior,
        seed=case.seed,
        shuffle_ties=shuffle_ties,
        scores=scores,
    )


def generate_case(
    case: Case, prior: Prior | None, *, iterations: int, min_visits: int
) -> tuple[list[Example], dict]:
    """The examples of one case and a summary of its search."""
    search = search_for(case, prior)
    outcome = search.run(iterations=iterations)
    static = static_graph(search.context)  # every vertex's query shares the search's context
    examples = [
        Example(state_graph(static, query), visits.astype(np.float32))
        for query, visits in search.visit_targets(min_visits)
    ]
    summary = {
        **asdict(case),
        "examples": len(examples),
        "groups": search.grouping.num_groups,
        "device_groups": search.space.cluster.num_groups,
        "actions": len(search.space),
        "reference_step_s": search.reference_step_s,
        "best_step_s": outcome.step_time_s,
        "evaluations": outcome.evaluations,
    }
    return examples, summary


def save_case(path: Path, examples: list[Example], summary: dict) -> None:
    """Write a case's examples and summary as one ``.npz`` (atomically)."""
    arrays: dict[str, np.ndarray] = {"summary": np.array(json.dumps(summary))}
    for i, example in enumerate(examples):
        g = example.graph
        arrays[f"{i}.op_x"], arrays[f"{i}.dev_x"], arrays[f"{i}.act_x"] = g.op_x, g.dev_x, g.act_x
        arrays[f"{i}.target"] = example.target
        for edge_type, (index, attr) in g.edges.items():
            arrays[f"{i}.{_EDGE_KEYS[edge_type]}.index"] = index
            arrays[f"{i}.{_EDGE_KEYS[edge_type]}.attr"] = np.asarray(attr, dtype=np.float32)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial.npz")
    np.savez_compressed(partial, **arrays)
    partial.replace(path)


def load_case(path: Path) -> tuple[list[Example], dict]:
    """A case file's examples and summary."""
    with np.load(path, allow_pickle=False) as data:
        summary = json.loads(str(data["summary"]))
        examples = []
        for i in range(summary["examples"]):
            edges = {
                edge_type: (data[f"{i}.{key}.index"], data[f"{i}.{key}.attr"])
                for edge_type, key in _EDGE_KEYS.items()
            }
            graph = StateGraph(
                op_x=data[f"{i}.op_x"],
                dev_x=data[f"{i}.dev_x"],
                act_x=data[f"{i}.act_x"],
                edges=edges,
            )
            examples.append(Example(graph, data[f"{i}.target"]))
    return examples, summary
