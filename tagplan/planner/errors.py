"""Errors the engine raises. Callers map them to exit codes or HTTP problems.

``InvalidInput`` means the caller sent something wrong and can fix it; ``Infeasible``
means the input is well-formed but no answer exists (e.g. a graph that fits on no
allocation); ``BudgetExhausted`` means the search stopped before finding any plan;
``Cancelled`` means the caller asked the planner to stop.
"""

from __future__ import annotations

__all__ = ["BudgetExhausted", "Cancelled", "Infeasible", "InvalidInput", "PlannerError"]


class PlannerError(Exception):
    """Base of every error the engine raises on purpose."""


class InvalidInput(PlannerError, ValueError):
    """The input is malformed or inconsistent; the message names the problem."""


class Infeasible(PlannerError):
    """The input is valid but no strategy exists; ``overflow_bytes`` says by how much."""

    def __init__(self, message: str, *, overflow_bytes: int = 0) -> None:
        super().__init__(message)
        self.overflow_bytes = overflow_bytes


class BudgetExhausted(PlannerError):
    """The search budget ran out before any feasible strategy was found."""


class Cancelled(PlannerError):
    """The caller's cancel check returned true; the planner stopped between iterations."""
