"""Pipelines as decisions of the search tree: the root chooses the layout.

On an allocation of several units (:func:`~.pipeline_stages.stage_units`) the root of
the MCTS (:mod:`.mcts`) decides the *layout* before any op group: edge 0 goes on to TAG's
per-op-group decisions, edge ``k + 1`` takes stage layout ``k``
(:class:`~.pipeline_stages.StageLayout`: where the model is cut and on which GPUs each
stage runs). Below a layout the tree decides, one level each,

1. the micro-batch count, fewest first (the cheapest to simulate, and the least
   per-micro-batch overhead);
2. every stage's gradient synchronization, in stage order: AllReduce or a parameter
   server over the stage's GPUs, TAG's per-group option at the granularity a pipeline
   keeps (every op group of a stage replicates over the stage's GPUs).

A vertex evaluated before all its levels are decided takes the first choice of each
level left (the fewest micro-batches, AllReduce). So the visits and the rewards weigh the
pipelines against TAG's strategies in one tree, and a pipeline is refined where it pays
off instead of being simulated once as a fixed candidate.

**Pruning.** A pipeline whose busiest GPU computes no less than a step that fits
(:meth:`~tagplan.planner.evaluate.Evaluator.compute_bound_s`: a lower bound on its step
whatever the synchronization) cannot be the plan. Before the search, the micro-batch
counts bounded at or above the best baseline's step are left out
(:func:`bounded_layouts`), and a layout with none left is not in the tree; during the
search, a branch whose pipelines are all bounded at or above the best step found so far
is closed (:meth:`LayoutBranches.least`). **Prior.** TAG's decisions keep three quarters
of the root's prior; the layouts share the rest in inverse proportion to their compute
bound at their fewest micro-batches, so the one whose busiest GPU computes least is
tried first among them; below a layout every choice is equally likely
(:meth:`LayoutBranches.prior`). A search prior with an opinion on these vertices (the
GNN's layout head, a :class:`~.prior.LayoutPrior`) replaces both. **Cost.** A pipeline
is simulated per GPU, its tasks growing with the micro-batches (``micro_batch_s`` each),
where TAG's strategies are simulated by symmetry class (``evaluation_s`` each): one
pipeline can cost as much as dozens of TAG's strategies. So the pipelines get at most a
fifth of the search's simulation time, counted with those two estimates and the seconds
cutting the layouts took (``cut_s``; all fixed for a job, so a seed and an iteration
budget still give the same search): past it, the root sends the search through TAG's
decisions until they have caught up (:meth:`LayoutBranches.may_simulate`; docs/design.md
§7 has the case that called for it). The share does not hold while nothing TAG's
decisions found fits in memory: there a pipeline may be the only plan. A branch whose
every pipeline would end after the search's deadline is closed, not simulated. The
layouts themselves are cut one at a time while the share of the search's budget lasts
(:func:`bounded_layouts`).

Keys: a pipelined strategy's key (in the search's score table and in
:attr:`~.mcts.SearchOutcome.actions`) is ``(-1 - layout, micro-batch choice, sync choice
of each stage...)``; a negative first entry tells it from TAG's per-group keys.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from tagplan.planner.errors import InvalidInput
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.search.pipeline_stages import StageLayout
from tagplan.planner.strategy import Option, Strategy
from tagplan.planner.topology import Cluster

__all__ = [
    "PIPELINE_SHARE",
    "SYNC_CHOICES",
    "BoundedLayouts",
    "LayoutBranches",
    "bounded_layouts",
    "is_pipelined_key",
]

SYNC_CHOICES = (Option.REPLICATE_ALLREDUCE, Option.REPLICATE_PS)
_FLAT_PRIOR = 0.75  # the root's prior on TAG's per-group decisions
PIPELINE_SHARE = 0.2  # of the search's simulation time, at most


def is_pipelined_key(key: Sequence[int]) -> bool:
    """Whether a search key stands for a pipelined strategy (module docstring)."""
    return len(key) > 0 and key[0] < 0


class LayoutBranches:
    """The pipelined branches of one search: ``layouts`` with their compute bounds
    (``bound_s[k][i]`` at layout ``k``'s ``i``-th micro-batch count), the per-GPU
    simulation's seconds per micro-batch (``micro_batch_s``), the seconds of one
    simulation of TAG's strategies (``evaluation_s``) and those cutting the layouts took
    (``cut_s``)."""

    def __init__(
        self,
        ir: GraphIR,
        cluster: Cluster,
        layouts: Sequence[StageLayout],
        device_speed: np.ndarray,
        *,
        bound_s: Sequence[Sequence[float]],
        micro_batch_s: float,
        evaluation_s: float,
        cut_s: float = 0.0,
    ) -> None:
        if not layouts or [len(b) for b in bound_s] != [len(x.micro_batches) for x in layouts]:
            raise InvalidInput("layout branches need layouts, a compute bound per micro-batches")
        self.ir, self.cluster = ir, cluster
        self.layouts = tuple(layouts)
        self.device_speed = device_speed
        self.bound_s = tuple(tuple(float(b) for b in bounds) for bounds in bound_s)
        self.micro_batch_s, self.evaluation_s = micro_batch_s, evaluation_s
        self.cut_s = cut_s

    def __len__(self) -> int:
        return len(self.layouts)

    def root_prior(self) -> np.ndarray:
        """Edge 0 (TAG's decisions) and one edge per layout (module docstring)."""
        inverse = 1.0 / np.maximum([bounds[0] for bounds in self.bound_s], 1e-12)
        return np.concatenate([[_FLAT_PRIOR], (1 - _FLAT_PRIOR) * inverse / inverse.sum()])

    def prior(self, path: Sequence[int]) -> np.ndarray:
        """The prior of the vertex ``path`` reaches (a :class:`~.prior.LayoutQuery`'s
        path) without a learned one: :meth:`root_prior` at the root, uniform below a
        layout."""
        if not path:
            return self.root_prior()
        count = self.choices(path)
        return np.full(count, 1.0 / count)

    def choices(self, path: Sequence[int]) -> int:
        """How many candidates the vertex ``path`` reaches offers: TAG's decisions and
        every layout at the root, a level's choices below a layout."""
        if not path:
            return 1 + len(self.layouts)
        return self.level_sizes(path[0] - 1)[len(path) - 1]

    def level_sizes(self, layout: int) -> tuple[int, ...]:
        """How many choices each level below ``layout`` offers."""
        found = self.layouts[layout]
        return (len(found.micro_batches),) + (len(SYNC_CHOICES),) * found.num_stages

    def key(self, layout: int, decided: Sequence[int]) -> tuple[int, ...]:
        """The key of ``layout`` with the choices ``decided`` so far, the levels left at
        their first choice."""
        levels = len(self.level_sizes(layout))
        return (-1 - layout, *decided, *([0] * (levels - len(decided))))

    def _parts(self, key: Sequence[int]) -> tuple[StageLayout, int, list[Option]]:
        layout = self.layouts[-1 - key[0]]
        return layout, layout.micro_batches[key[1]], [SYNC_CHOICES[c] for c in key[2:]]

    def strategy(self, key: Sequence[int]) -> Strategy:
        layout, micro_batches, sync = self._parts(key)
        return layout.strategy(self.ir, self.cluster, self.device_speed, micro_batches, sync)

    def cost_s(self, key: Sequence[int]) -> float:
        """The estimated seconds to simulate ``key``'s strategy, pipelined or not."""
        if not is_pipelined_key(key):
            return self.evaluation_s
        return self.micro_batch_s * self._parts(key)[1]

    @staticmethod
    def may_simulate(pipelines_s: float, tag_s: float) -> bool:
        """Whether the pipelines' estimated simulation seconds so far (``pipelines_s``)
        are within their share of all of them (``tag_s``: TAG's strategies')."""
        return pipelines_s <= PIPELINE_SHARE * (pipelines_s + tag_s)

    def least(self, layout: int, decided: Sequence[int]) -> tuple[float, float]:
        """The least compute bound and the least expected seconds to simulate among the
        strategies below ``layout`` with the choices ``decided``: no strategy there steps
        faster than the first, and none is simulated in less than the second."""
        found = self.layouts[layout]
        choices = range(len(found.micro_batches)) if not decided else [decided[0]]
        bound_s = min(self.bound_s[layout][i] for i in choices)
        return bound_s, self.micro_batch_s * min(found.micro_batches[i] for i in choices)


@dataclass(frozen=True)
class BoundedLayouts:
    """What :func:`bounded_layouts` kept, with each kept layout's compute bound at each of
    its micro-batch counts, and how many (layout, micro-batch count) pairs it left out."""

    layouts: list[StageLayout]
    bound_s: list[list[float]]
    ruled_out: int  # bounded at or above the bar
    refused: int  # the graph cannot keep the micro-batches apart on that cut
    cut: int  # layouts taken from the iterator
    complete: bool  # whether the iterator ran out before the deadline


def bounded_layouts(
    evaluator: Evaluator,
    layouts: Iterable[StageLayout],
    device_speed: np.ndarray,
    bar_s: float,
    *,
    until: float = math.inf,
) -> BoundedLayouts:
    """``layouts`` with only the micro-batch counts whose compute bound (AllReduce in every
    stage; the bound does not depend on the synchronization) is below ``bar_s``, the best
    step that fits so far; a layout left no count is dropped. No layout is taken from
    ``layouts`` (an iterator cuts each as it is asked for) once ``time.perf_counter()``
    has passed ``until``."""
    kept: list[StageLayout] = []
    bounds: list[list[float]] = []
    ruled_out = refused = cut = 0
    complete = False
    iterator = iter(layouts)
    while time.perf_counter() <= until:
        layout = next(iterator, None)
        if layout is None:
            complete = True
            break
        cut += 1
        counts: list[int] = []
        layout_bounds: list[float] = []
        for micro_batches in layout.micro_batches:
            strategy = layout.strategy(evaluator.ir, evaluator.cluster, device_speed, micro_batches)
            try:
                bound_s = evaluator.compute_bound_s(strategy)
            except InvalidInput:
                refused += 1
                continue
            if bound_s >= bar_s:
                ruled_out += 1
                continue
            counts.append(micro_batches)
            layout_bounds.append(bound_s)
        if counts:
            kept.append(replace(layout, micro_batches=tuple(counts)))
            bounds.append(layout_bounds)
    return BoundedLayouts(kept, bounds, ruled_out, refused, cut, complete)
