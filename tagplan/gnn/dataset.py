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
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tagplan.gnn.features import EDGE_FEATURES, StateGraph, state_graph, static_graph
from tagplan.planner.evaluate import Evaluation, Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.actions import ActionSpace
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.search.grouping import cluster_mean_op_time_s, group_ops
from tagplan.planner.search.layout_branches import LayoutBranches, bounded_layouts
from tagplan.planner.search.mcts import StrategySearch
from tagplan.planner.search.pipeline_stages import pipeline_layouts
from tagplan.planner.search.prior import Prior, PriorQuery
from tagplan.planner.topology import load_cluster

__all__ = [
    "Case",
    "Example",
    "case_file",
    "generate_case",
    "graph_arrays",
    "graph_from",
    "layout_branches_for",
    "load_case",
    "save_arrays",
    "search_for",
]

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
    case: Case,
    prior: Prior | None,
    *,
    scores: dict | None = None,
    shuffle_ties: bool = True,
    layouts: bool = False,
    sweep: bool = False,
) -> StrategySearch:
    """The search a plan would run for ``case`` (module docstring), with ``prior``;
    ``scores`` shares simulations with other searches of the same case. Training breaks
    ties at random (TAG's pure MCTS), so the targets do not learn the candidate order;
    a plan's first tree breaks them in that order (``shuffle_ties=False``). With
    ``layouts`` the tree holds the pipelines too (:func:`layout_branches_for`); with
    ``sweep`` it starts with the uniform strategies, as a plan's first tree does."""
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
        layouts=layout_branches_for(evaluator, space, reference) if layouts else None,
        sweep=sweep,
    )


def layout_branches_for(
    evaluator: Evaluator, space: ActionSpace, reference: Evaluation
) -> LayoutBranches | None:
    """The stage layouts a plan would put in its tree, bounded by the reference step
    where it fits (a plan bounds them by its best baseline), with simulation costs in
    units of one evaluation of the reference: what the pipelines' share of the search
    counts depends on their ratio only, so the search does not depend on the machine's
    speed. ``None`` where the allocation has one unit or no layout is left."""
    ir, cluster = evaluator.ir, evaluator.cluster
    bar_s = math.inf if reference.result.oom else reference.step_time_s
    bounded = bounded_layouts(
        evaluator, pipeline_layouts(ir, cluster, evaluator.costs), space.device_speed, bar_s
    )
    if not bounded.layouts:
        return None
    return LayoutBranches(
        ir,
        cluster,
        bounded.layouts,
        space.device_speed,
        bound_s=bounded.bound_s,
        micro_batch_s=reference.compiled.per_gpu_factor,
        evaluation_s=1.0,
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
        if isinstance(query, PriorQuery)
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


def graph_arrays(prefix: str, graph: StateGraph) -> dict[str, np.ndarray]:
    """``graph`` as named arrays (``prefix`` + a field), what :func:`graph_from` reads."""
    arrays = {f"{prefix}op_x": graph.op_x, f"{prefix}dev_x": graph.dev_x}
    arrays[f"{prefix}act_x"] = graph.act_x
    for edge_type, (index, attr) in graph.edges.items():
        arrays[f"{prefix}{_EDGE_KEYS[edge_type]}.index"] = index
        arrays[f"{prefix}{_EDGE_KEYS[edge_type]}.attr"] = np.asarray(attr, dtype=np.float32)
    return arrays


def graph_from(data: Mapping[str, np.ndarray], prefix: str) -> StateGraph:
    """The graph :func:`graph_arrays` stored under ``prefix``."""
    edges = {
        edge_type: (data[f"{prefix}{key}.index"], data[f"{prefix}{key}.attr"])
        for edge_type, key in _EDGE_KEYS.items()
    }
    return StateGraph(
        op_x=data[f"{prefix}op_x"],
        dev_x=data[f"{prefix}dev_x"],
        act_x=data[f"{prefix}act_x"],
        edges=edges,
    )


def save_arrays(path: Path, arrays: dict[str, np.ndarray], summary: dict) -> None:
    """Write ``arrays`` and a JSON ``summary`` as one ``.npz``, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial.npz")
    np.savez_compressed(partial, summary=np.array(json.dumps(summary)), **arrays)
    partial.replace(path)


def save_case(path: Path, examples: list[Example], summary: dict) -> None:
    """Write a case's examples and summary as one ``.npz`` (atomically)."""
    arrays: dict[str, np.ndarray] = {}
    for i, example in enumerate(examples):
        arrays.update(graph_arrays(f"{i}.", example.graph))
        arrays[f"{i}.target"] = example.target
    save_arrays(path, arrays, summary)


def load_case(path: Path) -> tuple[list[Example], dict]:
    """A case file's examples and summary."""
    with np.load(path, allow_pickle=False) as data:
        summary = json.loads(str(data["summary"]))
        examples = [
            Example(graph_from(data, f"{i}."), data[f"{i}.target"])
            for i in range(summary["examples"])
        ]
    return examples, summary
