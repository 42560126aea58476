"""TaskGraph.validate on malformed graphs."""

from __future__ import annotations

import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.sim.taskgraph import COMPUTE
from tests.planner.sim.builders import Task, build, chain, compute, transfer


def test_valid_graph_passes() -> None:
    tasks, edges = chain(0, [1.0, 1.0])
    build(tasks, edges).validate()


def test_cycle_raises() -> None:
    tasks = [compute(0, 1.0), compute(0, 1.0), compute(0, 1.0)]
    with pytest.raises(InvalidInput, match="cycle"):
        build(tasks, [(0, 1), (1, 2), (2, 1)]).validate()


def test_compute_task_without_device_raises() -> None:
    with pytest.raises(InvalidInput, match="device"):
        build([compute(3, 1.0)], num_devices=2).validate()


@pytest.mark.parametrize(
    ("task", "match"),
    [
        (transfer([0], 1.0, shares=[float("inf")]), "shares"),
        (transfer([0], 1.0, shares=[0.0]), "shares"),
        (transfer([0], 1.0, latency_s=2.0), "latencies"),
    ],
)
def test_bad_link_shares_and_latencies_raise(task: Task, match: str) -> None:
    with pytest.raises(InvalidInput, match=match):
        build([task], num_links=1).validate()


def test_compute_task_with_links_raises() -> None:
    task = Task(COMPUTE, 1.0, device=0, links=(0,))
    with pytest.raises(InvalidInput, match="compute task lists links"):
        build([task], num_links=1).validate()
