"""BackgroundWork: a value, an error and a wait that runs out, from a thread of its own or
a child forked for the work."""

from __future__ import annotations

import os
import threading
import time

import pytest

from tagplan.planner.background import BackgroundWork
from tagplan.planner.forked import can_fork


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


forking = pytest.mark.skipif(not can_fork(), reason="needs the fork start method")


@forking
def test_forked_work_runs_in_a_child_on_what_the_parent_built() -> None:
    built = {"rows": list(range(1000))}  # built before the fork: the child reads it as is
    work = BackgroundWork(lambda: (os.getpid(), sum(built["rows"])), fork=True)
    pid, total = work.result(30.0)
    assert pid != os.getpid() and total == 499500
    assert work.seconds >= 0.0


@forking
def test_a_forked_child_yields_its_core_by_its_niceness() -> None:
    caller = os.nice(0)
    work = BackgroundWork(lambda: os.nice(0), fork=True, niceness=3)
    assert work.result(30.0) == min(caller + 3, 19)
    assert os.nice(0) == caller  # the caller keeps its priority


@forking
def test_what_forked_work_raised_is_raised_to_the_caller() -> None:
    def fail() -> None:
        raise ValueError("no solution")

    with pytest.raises(ValueError, match="no solution"):
        BackgroundWork(fail, fork=True).result(30.0)


@forking
def test_forked_work_not_done_gives_none_and_can_be_stopped() -> None:
    work = BackgroundWork(lambda: time.sleep(60), fork=True)
    assert work.result(0.05) is None
    work.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        work.result(0.0)
