"""BackgroundWork: a value, an error and a wait that runs out, from a thread of its own."""

from __future__ import annotations

import threading

import pytest

from tagplan.planner.background import BackgroundWork


def test_the_value_comes_back_and_the_work_ran_on_another_thread() -> None:
    caller = threading.get_ident()
    work = BackgroundWork(lambda: (threading.get_ident(), 42))
    ident, value = work.result(10.0)
    assert value == 42 and ident != caller
    assert work.seconds >= 0.0


def test_what_the_work_raised_is_raised_to_the_caller() -> None:
    def fail() -> None:
        raise ValueError("no solution")

    with pytest.raises(ValueError, match="no solution"):
        BackgroundWork(fail).result(10.0)


def test_a_wait_that_runs_out_gives_none_and_a_later_one_the_value() -> None:
    release = threading.Event()

    def slow() -> str:
        release.wait(10.0)
        return "done"

    work = BackgroundWork(slow)
    assert work.result(0.05) is None
    release.set()
    assert work.result(10.0) == "done"
