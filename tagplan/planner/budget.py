"""One wall-clock deadline for a whole plan, and what each phase did under it.

A scheduler calls the planner when it has just allocated GPUs and the training job waits
for the answer, so ``budget_s`` bounds the plan end to end: grouping, baselines, search,
SFB and the final compile all run against one :class:`Deadline`. The deadline is an
absolute time (seconds since the epoch), so the workers of one job, each running a shard
in its own process, share it: it is fixed once when the job starts and handed to every
step.

Every phase either finishes (``done``), stops early at its share of the budget and says
so (``truncated``: some of its work was left out), or does not run (``skipped``), and
:class:`PhaseReport` carries that into the result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

__all__ = ["Deadline", "PhaseLog", "PhaseReport", "PhaseStatus"]

PhaseStatus = Literal["done", "truncated", "skipped"]


@dataclass(frozen=True)
class Deadline:
    """An absolute end time ``at_s`` (seconds since the epoch) of a budget of
    ``budget_s``."""

    at_s: float
    budget_s: float

    @classmethod
    def after(cls, budget_s: float, *, start_s: float | None = None) -> Deadline:
        """The deadline ``budget_s`` after ``start_s`` (default: now)."""
        start = time.time() if start_s is None else start_s
        return cls(at_s=start + budget_s, budget_s=budget_s)

    def left_s(self) -> float:
        """Seconds until the deadline (negative once it has passed)."""
        return self.at_s - time.time()

    def share_s(self, fraction: float) -> float:
        """``fraction`` of the whole budget, capped by what is left."""
        return max(0.0, min(self.budget_s * fraction, self.left_s()))


@dataclass
class PhaseReport:
    """What one phase of a plan did: its status, wall time, and why it is not ``done``."""

    status: PhaseStatus = "done"
    seconds: float = 0.0
    note: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"status": self.status, "seconds": self.seconds, "note": self.note}

    @classmethod
    def from_dict(cls, data: dict) -> PhaseReport:
        return cls(status=data["status"], seconds=float(data["seconds"]), note=data["note"])


class PhaseLog:
    """The phases of one plan as they run: each one's report, the open one's clock."""

    def __init__(self, reports: dict[str, PhaseReport] | None = None) -> None:
        self.reports: dict[str, PhaseReport] = reports or {}
        self._open: str | None = None
        self._opened_at = time.perf_counter()

    def enter(self, phase: str) -> None:
        """Close the open phase and open ``phase`` (its seconds add up over visits)."""
        self.leave()
        self._open, self._opened_at = phase, time.perf_counter()
        self.reports.setdefault(phase, PhaseReport())

    def leave(self) -> None:
        if self._open is not None:
            self.reports[self._open].seconds += time.perf_counter() - self._opened_at
            self._open = None

    def mark(self, phase: str, status: PhaseStatus, note: str) -> None:
        report = self.reports.setdefault(phase, PhaseReport())
        report.status, report.note = status, note

    def to_dict(self) -> dict[str, dict[str, object]]:
        return {name: report.to_dict() for name, report in self.reports.items()}
