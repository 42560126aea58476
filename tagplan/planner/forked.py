"""Work spread over child processes forked from this one: for work that runs Python for
seconds on state this process has built (an evaluator's caches, compiled simulator
kernels, a prior's network) and that a child could not rebuild in time.

Each child inherits that state when it is forked, runs one item, reports through a queue
and returns a picklable value; the caller's callbacks stay in this process. A child sees
two callables: ``report(message)`` sends ``message`` to this process, where
``on_report(item, message)`` receives it, and ``cancelled()`` is true once the caller's
``cancel()`` (polled here) has said so. So a child never touches what only the caller may
use, such as a database session or a broker connection.

Forking needs the ``fork`` start method (POSIX) and a process allowed to have children
(:func:`can_fork`): a daemonic process, such as a worker of Celery's prefork pool, is
not."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from tagplan.planner.errors import PlannerError

__all__ = ["can_fork", "run_forked"]

T = TypeVar("T")
R = TypeVar("R")

Work = Callable[[T, Callable[[Any], None], Callable[[], bool]], R]

_POLL_S = 0.1  # how often this process reads reports and polls cancel()

# what a forked child inherits: the work, the reports' queue, the cancellation event; one
# caller at a time sets it (callers on other threads wait their turn)
_inherited: tuple[Callable[..., Any], Any, Any] | None = None
_one_caller = threading.Lock()


def can_fork() -> bool:
    """Whether this process can fork children for :func:`run_forked`."""
    return (
        "fork" in multiprocessing.get_all_start_methods()
        and not multiprocessing.current_process().daemon
    )


def run_forked(
    items: Sequence[T],
    work: Work[T, R],
    *,
    processes: int,
    on_report: Callable[[T, Any], None] | None = None,
    cancel: Callable[[], bool] | None = None,
) -> list[R]:
    """``work(item, report, cancelled)`` for every item, at most ``processes`` at once
    in forked children; the values in the items' order. What a child raised is raised
    here (the first item's in order); a child that dies raises
    :class:`~.errors.PlannerError`."""
    if not can_fork():
        raise PlannerError("this process cannot fork children (see tagplan.planner.forked)")
    with _one_caller:
        return _run(items, work, processes, on_report, cancel)


def _run(
    items: Sequence[T],
    work: Work[T, R],
    processes: int,
    on_report: Callable[[T, Any], None] | None,
    cancel: Callable[[], bool] | None,
) -> list[R]:
    global _inherited
    context = multiprocessing.get_context("fork")
    reports, cancelled = context.SimpleQueue(), context.Event()
    _inherited = (work, reports, cancelled)
    try:
        with ProcessPoolExecutor(min(processes, len(items)), mp_context=context) as pool:
            futures = [pool.submit(_run_item, k, item) for k, item in enumerate(items)]
            pending = set(futures)
            while pending:
                _, pending = wait(pending, timeout=_POLL_S, return_when=FIRST_COMPLETED)
                _deliver(reports, items, on_report)
                if cancel is not None and not cancelled.is_set() and cancel():
                    cancelled.set()
            _deliver(reports, items, on_report)
            return [future.result() for future in futures]
    except BrokenProcessPool as exc:
        raise PlannerError(f"a forked process died before it finished: {exc}") from exc
    finally:
        _inherited = None
        reports.close()


def _deliver(reports: Any, items: Sequence[T], on_report: Callable[[T, Any], None] | None) -> None:
    """Hand every report waiting in the queue to ``on_report``."""
    while not reports.empty():
        index, message = reports.get()
        if on_report is not None:
            on_report(items[index], message)


def _run_item(index: int, item: Any) -> Any:
    """In a child: the inherited work on one item."""
    if _inherited is None:
        raise RuntimeError("run only in a child that run_forked forked")
    work, reports, cancelled = _inherited
    return work(item, lambda message: reports.put((index, message)), cancelled.is_set)
