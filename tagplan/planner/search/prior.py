"""Prior probabilities over a level's actions (TAG §4.2.2's G(s, a)).

The search asks a :class:`Prior` for the probabilities of the candidate actions of the
next op group given the decisions made so far and the runtime feedback of the partial
strategy's simulation. :class:`UniformPrior` is TAG's "Pure MCTS" (Table 7); the GNN
(``tagplan.gnn``) implements the same protocol.

Where the tree also holds pipelines (:mod:`.layout_branches`), the vertices above and
below a stage layout ask a :class:`LayoutPrior` too, with a :class:`LayoutQuery`; a prior
without an opinion there (``None``, or no such method) leaves them the prior the layouts'
compute bounds give (:meth:`~.layout_branches.LayoutBranches.prior`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from tagplan.planner.search.actions import Action, ActionSpace
from tagplan.planner.search.grouping import Grouping
from tagplan.planner.sim.simulate import SimResult

if TYPE_CHECKING:  # the layouts' module imports the evaluator; this one stays light
    from tagplan.planner.search.layout_branches import LayoutBranches

__all__ = ["LayoutPrior", "LayoutQuery", "Prior", "PriorQuery", "SearchContext", "UniformPrior"]


@dataclass(frozen=True, eq=False)
class SearchContext:
    """What stays fixed over one search: the op groups, the candidate actions (with the
    cluster and the GPUs' speeds on the model) and the reference step rewards are measured
    against. A prior that derives features from it may cache them by identity."""

    grouping: Grouping
    space: ActionSpace
    reference_step_s: float

    def decision_order(self) -> np.ndarray:
        """The op groups in the order the tree decides them: descending compute time."""
        return np.argsort(-self.grouping.group_time_s, kind="stable").astype(np.int32)

    def root_query(self) -> PriorQuery:
        """The query of the state before any decision (no feedback)."""
        return PriorQuery(self, self.decision_order(), 0, (), self.space.actions, None)


@dataclass(frozen=True, eq=False)
class PriorQuery:
    """What a prior sees when asked for one level (TAG Table 1's search progress).

    ``decided[k]`` is the action index chosen for ``order[k]`` (k < ``level``); the
    next op group to decide is ``order[level]``. ``feedback`` is the simulation of the
    partial strategy the vertex stands for (``None`` at the root); ``context`` is the
    search's fixed part.
    """

    context: SearchContext
    order: np.ndarray  # int32: op groups in descending compute time
    level: int
    decided: tuple[int, ...]
    actions: tuple[Action, ...]
    feedback: SimResult | None


@dataclass(frozen=True, eq=False)
class LayoutQuery:
    """A vertex of the pipelined part of the tree: the root (``path`` empty: TAG's
    decisions, then one candidate per layout) or a vertex below layout ``path[0] - 1``
    with the choices ``path[1:]`` made (its micro-batch count, then each stage's
    gradient synchronization in stage order): the candidates are that level's choices
    (:meth:`~.layout_branches.LayoutBranches.level_sizes`)."""

    context: SearchContext
    branches: LayoutBranches
    path: tuple[int, ...]


class Prior(Protocol):
    name: str  # what a plan reports as its prior (``uniform``, ``gnn:<digest>``)

    def probabilities(self, query: PriorQuery) -> np.ndarray:
        """A probability per action of ``query.actions`` (non-negative, summing to 1)."""
        ...


class UniformPrior:
    """Every candidate equally likely: MCTS without learned guidance."""

    name = "uniform"

    def probabilities(self, query: PriorQuery) -> np.ndarray:
        n = len(query.actions)
        return np.full(n, 1.0 / n)


@runtime_checkable
class LayoutPrior(Protocol):
    def layout_probabilities(self, query: LayoutQuery) -> np.ndarray | None:
        """A probability per candidate of ``query``'s level, or ``None``: no opinion."""
        ...
