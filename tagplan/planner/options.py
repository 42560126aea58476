"""The planner's options, defined once: the engine takes them as :class:`PlanOptions`, the
API's request schema and the workers derive their fields and defaults from it. This module
imports nothing heavy, so the API process can read it without loading the engine."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from tagplan.planner.errors import InvalidInput

__all__ = [
    "DEFAULT_MAX_ACTIONS",
    "DEFAULT_MAX_GROUPS",
    "DEFAULT_PATIENCE",
    "PlanOptions",
    "option_names",
]

DEFAULT_MAX_GROUPS = 60
"""METIS groups at most (TAG §4.1.1)."""
DEFAULT_MAX_ACTIONS = 300
"""Candidate actions per op group at most (docs/design.md §7)."""
DEFAULT_PATIENCE = 64
"""The least convergence window of the search, in iterations."""


@dataclass(frozen=True)
class PlanOptions:
    """What a plan may spend and how it searches."""

    budget_s: float = 60.0  # the whole plan, every phase included
    iterations: int | None = None  # search iteration cap
    seed: int = 0
    sfb: bool = True  # sufficient-factor broadcast (TAG §4.2.3)
    max_groups: int = DEFAULT_MAX_GROUPS
    shards: int = 1  # root-parallel search trees
    max_actions: int = DEFAULT_MAX_ACTIONS
    patience: int | None = DEFAULT_PATIENCE  # convergence window; None: use the budget
    by_class: bool = True  # simulate GPUs treated alike once (False: per GPU, the reference)
    pipeline: bool = True  # weigh pipelined strategies too: the baseline and tagplan's
    # simulate the baselines a bound rules out too (they cannot be the plan): for tables
    # that compare every baseline
    every_baseline: bool = False

    def __post_init__(self) -> None:
        if not (self.budget_s > 0 and math.isfinite(self.budget_s)):
            raise InvalidInput(f"budget_s must be positive and finite, got {self.budget_s}")
        if self.iterations is not None and self.iterations < 1:
            raise InvalidInput(f"iterations must be at least 1, got {self.iterations}")
        if self.shards < 1:
            raise InvalidInput(f"shards must be at least 1, got {self.shards}")
        if self.patience is not None and self.patience < 1:
            raise InvalidInput(f"patience must be at least 1, got {self.patience}")


def option_names() -> frozenset[str]:
    """The fields of :class:`PlanOptions`."""
    return frozenset(f.name for f in fields(PlanOptions))
