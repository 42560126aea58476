"""run_forked: values in order, reports and cancellation crossing between the processes,
what a child raised, a child that dies, and a process that may not fork."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from tagplan.planner.errors import PlannerError
from tagplan.planner.forked import can_fork, run_forked

pytestmark = pytest.mark.skipif(not can_fork(), reason="needs the fork start method")


def test_each_item_runs_in_a_child_and_the_values_come_back_in_order() -> None:
    parent = os.getpid()
    inherited = {"factor": 3}  # built before the fork: the children see it without pickling

    def work(item, report, cancelled):
        report(item * 10)
        return os.getpid(), item * inherited["factor"]

    reports: list[tuple[int, int]] = []
    values = run_forked(
        [1, 2, 3, 4],
        work,
        processes=2,
        on_report=lambda item, message: reports.append((item, message)),
    )
    assert [value for _, value in values] == [3, 6, 9, 12]
    assert all(pid != parent for pid, _ in values)
    assert len({pid for pid, _ in values}) <= 2  # at most two children at once
    assert sorted(reports) == [(1, 10), (2, 20), (3, 30), (4, 40)]


def test_cancel_polled_in_the_parent_reaches_every_child() -> None:
    asked = []

    def work(item, report, cancelled):
        started = time.monotonic()
        while not cancelled():
            if time.monotonic() - started > 30:
                return "never cancelled"
            time.sleep(0.01)
        return "cancelled"

    def cancel() -> bool:
        asked.append(True)
        return len(asked) > 2

    assert run_forked(["a", "b"], work, processes=2, cancel=cancel) == ["cancelled"] * 2


def test_what_a_child_raised_is_raised_in_the_parent() -> None:
    def work(item, report, cancelled):
        if item == 2:
            raise ValueError("no strategy for item 2")
        return item

    with pytest.raises(ValueError, match="no strategy for item 2"):
        run_forked([1, 2], work, processes=2)


def test_a_child_that_dies_is_a_planner_error() -> None:
    def work(item, report, cancelled):
        os._exit(3)

    with pytest.raises(PlannerError, match="died"):
        run_forked([1], work, processes=1)


def _run_in_a_daemon(answer) -> None:
    answer.put(can_fork())


def test_a_daemonic_process_may_not_fork() -> None:
    context = multiprocessing.get_context("fork")
    answer = context.SimpleQueue()
    child = context.Process(target=_run_in_a_daemon, args=(answer,), daemon=True)
    child.start()
    child.join(30)
    assert answer.get() is False
