"""The planner's progress and cancel callbacks, backed by the job's database row.

The planner calls them often; the database is written at most every ``interval_s`` for
progress — at once for a phase change or a better step, so the job's history has every
improvement — and read at most every ``interval_s`` for cancellation.
"""

from __future__ import annotations

import time
from typing import Any

from tagplan.db import job_state
from tagplan.db.session import session_scope

__all__ = ["JobMonitor"]


class JobMonitor:
    """Progress reports and the cancellation flag of one job."""

    def __init__(
        self,
        url: str,
        job_id: str,
        *,
        phases: frozenset[str] | None = None,
        interval_s: float = 0.5,
    ) -> None:
        self.url = url
        self.job_id = job_id
        self.phases = phases
        self.interval_s = interval_s
        self._last_write = 0.0
        self._last_phase: str | None = None
        self._best: float | None = None
        self._last_read = 0.0
        self._cancelled = False

    def progress(self, report: Any) -> None:
        """Store a :class:`~tagplan.planner.plan.PlanProgress` (phase changes at once).

        Reports of phases outside ``phases`` are dropped: a step that rebuilds earlier
        phases (the finish step regroups) must not move the job's phase backwards.
        """
        if self.phases is not None and report.phase not in self.phases:
            return
        now = time.monotonic()
        best = report.best_step_time_s
        improved = best is not None and (self._best is None or best < self._best)
        if (
            report.phase == self._last_phase
            and now - self._last_write < self.interval_s
            and not improved
        ):
            return
        self._last_write, self._last_phase = now, report.phase
        if improved:
            self._best = best
        with session_scope(self.url) as session:
            job_state.record_progress(
                session,
                job_id=self.job_id,
                phase=report.phase,
                iterations=report.iterations,
                best_step_time_s=report.best_step_time_s,
                best_speedup=report.best_speedup,
            )

    def cancelled(self) -> bool:
        """True once the job was cancelled (or failed elsewhere): the planner stops."""
        now = time.monotonic()
        if not self._cancelled and now - self._last_read >= self.interval_s:
            self._last_read = now
            with session_scope(self.url) as session:
                self._cancelled = job_state.is_finished(session, self.job_id)
        return self._cancelled
