"""Work that runs beside the caller while the caller goes on: on a thread of its own, worth
it only for work that spends its time outside the GIL (a solver's native code), or in a
child process forked for it, for work that also runs Python for long (building a large
LP), which on a thread would take the GIL from the caller's own Python for as long."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from tagplan.planner.forked import can_fork

__all__ = ["BackgroundWork"]

T = TypeVar("T")


class BackgroundWork(Generic[T]):
    """``work()`` started at once beside the caller, its value (or what it raised)
    handed to whoever asks for it.

    By default on a thread. The thread is not a daemon: a process that ends while the work
    runs waits for it (native code killed at interpreter exit aborts the process), so give
    ``work`` a deadline of its own, as the solvers' time limits are. With ``fork`` (where
    this process can fork: :func:`~.forked.can_fork`, else on a thread) in a child forked
    for it, which inherits what ``work`` reads and sends back its value (picklable) or what
    it raised; :meth:`stop` ends a child whose value nobody will ask for. ``niceness``
    lowers a forked child's scheduling priority (``os.nice``) so that the caller, whose
    work is what the answer waits for, keeps its core where the cores are fewer than the
    processes."""

    def __init__(
        self,
        work: Callable[[], T],
        *,
        name: str = "tagplan-background",
        fork: bool = False,
        niceness: int = 0,
    ) -> None:
        self._work = work
        self._niceness = niceness
        self._value: T | None = None
        self._error: BaseException | None = None
        self._done = False  # a forked child's answer received (or the child stopped)
        self.seconds = 0.0  # how long work() ran, once it has returned
        self._child: Any = None
        if fork and can_fork():
            context = multiprocessing.get_context("fork")
            self._answer, sender = context.Pipe(duplex=False)
            self._child = context.Process(
                target=self._run_child, args=(sender,), name=name, daemon=True
            )
            self._child.start()
            sender.close()
        else:
            self._thread = threading.Thread(target=self._run, name=name)
            self._thread.start()

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            self._value = self._work()
        except BaseException as exc:  # raised again by result()
            self._error = exc
        self.seconds = time.perf_counter() - started

    def _run_child(self, sender: Any) -> None:
        """In the forked child: the work, its value or error sent to the parent."""
        if self._niceness:
            os.nice(self._niceness)
        self._run()
        sender.send((self._value, self._error, self.seconds))
        sender.close()

    def result(self, wait_s: float) -> T | None:
        """The value, waiting at most ``wait_s`` seconds for it (``None`` when it is not
        there by then); what ``work`` raised is raised here."""
        if self._child is None:
            self._thread.join(max(wait_s, 0.0))
            if self._thread.is_alive():
                return None
        elif not self._done:
            if not self._answer.poll(max(wait_s, 0.0)):
                return None
            try:
                self._value, self._error, self.seconds = self._answer.recv()
            except EOFError:  # the child died without an answer
                self._error = RuntimeError(f"{self._child.name} ended without an answer")
            self._done = True
            self._child.join()
        if self._error is not None:
            raise self._error
        return self._value

    def stop(self) -> None:
        """End a forked child still working (nothing for a thread, which cannot be)."""
        if self._child is not None and not self._done:
            self._child.terminate()
            self._child.join()
            self._done = True
            self._error = RuntimeError(f"{self._child.name} was stopped")
