"""The GNN as the search's :class:`~tagplan.planner.search.prior.Prior` (TAG §4.2.2's
G(s, a)).

The fixed part of the graph, and what the network derives from its edges (its
:class:`~tagplan.gnn.model.GraphShape`), are built once per search (the context is kept
by identity); each expansion adds the vertex's decisions and feedback and runs one
forward pass with autograd off. ``uniform_mix`` blends in the uniform prior, so an
action the network rates near zero is still tried once the better-rated ones have been
visited enough (PUCT's exploration term is proportional to the prior).

A network with a layout head also scores the pipelined part of the tree
(:meth:`GnnPrior.layout_probabilities`): the root state is encoded once per search and
each layout level's candidates are scored from it (:mod:`.layout_features`); a network
without one has no opinion there, and the layouts keep their own prior.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from tagplan.gnn.features import StaticGraph, ablate, state_graph, static_graph
from tagplan.gnn.layout_features import LayoutStatics
from tagplan.gnn.model import GraphShape, PriorNet
from tagplan.gnn.tensors import GraphTensors, to_tensors
from tagplan.planner.search.prior import LayoutQuery, PriorQuery, SearchContext

__all__ = ["DEFAULT_UNIFORM_MIX", "GnnPrior"]

DEFAULT_UNIFORM_MIX = 0.1


class GnnPrior:
    """The network of a checkpoint as a search prior; ``name`` says which checkpoint
    (what a plan reports as its prior)."""

    def __init__(
        self, model: PriorNet, *, name: str, uniform_mix: float = DEFAULT_UNIFORM_MIX
    ) -> None:
        if not 0.0 <= uniform_mix <= 1.0:
            raise ValueError(f"uniform_mix must be in [0, 1], got {uniform_mix}")
        self.model, self.name, self.uniform_mix = model.eval(), name, uniform_mix
        self._context: SearchContext | None = None
        self._static: StaticGraph | None = None
        self._shape: GraphShape | None = None  # the static graph's, once a state is seen
        self._layouts: tuple[LayoutStatics, dict[str, torch.Tensor]] | None = None
        self.calls = 0
        self.seconds = 0.0  # spent in probabilities(): the prior's share of a search

    def _static_of(self, context: SearchContext) -> StaticGraph:
        if self._context is not context or self._static is None:
            self._static, self._context = static_graph(context), context
            self._shape, self._layouts = None, None
        return self._static

    def _graph(self, query: PriorQuery) -> GraphTensors:
        data = to_tensors(
            ablate(state_graph(self._static_of(query.context), query), self.model.hyper["ablation"])
        )
        if self._shape is None:  # every state of a search has the static graph's edges
            self._shape = self.model.shape_of(data)
        return data

    def probabilities(self, query: PriorQuery) -> np.ndarray:
        started = time.perf_counter()
        data = self._graph(query)
        with torch.inference_mode():
            learned = self.model(data, self._shape).double().numpy()
        return self._blended(learned, started)

    def _blended(self, learned: np.ndarray, started: float) -> np.ndarray:
        """``learned`` blended with the uniform prior; the call counted in the prior's
        calls and seconds since ``started``."""
        n = len(learned)
        p = (1.0 - self.uniform_mix) * learned / learned.sum() + self.uniform_mix / n
        self.calls += 1
        self.seconds += time.perf_counter() - started
        return p / p.sum()

    def layout_probabilities(self, query: LayoutQuery) -> np.ndarray | None:
        """The layout head's prior over the candidates of ``query``'s level (module
        docstring); ``None`` for a network without one."""
        if not self.model.has_layout_head:
            return None
        started = time.perf_counter()
        self._static_of(query.context)
        if self._layouts is None or self._layouts[0].branches is not query.branches:
            with torch.inference_mode():
                h = self.model.encode(self._graph(query.context.root_query()), self._shape)
            self._layouts = (LayoutStatics(query.context, query.branches), h)
        statics, h = self._layouts
        found = statics.candidates(query.path)
        with torch.inference_mode():
            logits = self.model.layout_logits(
                h, torch.from_numpy(found.x), found.device_groups, torch.from_numpy(found.focus)
            )
        return self._blended(torch.softmax(logits, 0).double().numpy(), started)
