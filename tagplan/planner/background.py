"""Work that runs on a thread of its own while the caller goes on: worth it only for work
that spends its time outside the GIL (a solver's native code), so that a free core runs
it beside the planner's Python."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["BackgroundWork"]

T = TypeVar("T")


class BackgroundWork(Generic[T]):
    """``work()`` started at once on a thread of its own, its value (or what it raised)
    handed to whoever asks for it.

    The thread is not a daemon: a process that ends while the work runs waits for it
    (native code killed at interpreter exit aborts the process), so give ``work`` a
    deadline of its own, as the solvers' time limits are."""

    def __init__(self, work: Callable[[], T], *, name: str = "tagplan-background") -> None:
        self._work = work
        self._value: T | None = None
        self._error: BaseException | None = None
        self.seconds = 0.0  # how long work() ran, once it has returned
        self._thread = threading.Thread(target=self._run, name=name)
        self._thread.start()

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            self._value = self._work()
        except BaseException as exc:  # raised again by result()
            self._error = exc
        self.seconds = time.perf_counter() - started

    def result(self, wait_s: float) -> T | None:
        """The value, waiting at most ``wait_s`` seconds for it (``None`` when it is not
        there by then); what ``work`` raised is raised here."""
        self._thread.join(max(wait_s, 0.0))
        if self._thread.is_alive():
            return None
        if self._error is not None:
            raise self._error
        return self._value
