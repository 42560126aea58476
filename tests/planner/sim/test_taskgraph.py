"""TaskGraph.validate on malformed graphs."""

from __future__ import annotations

import pytest

from tagplan.planner.errors import InvalidInput
from tests.planner.sim.builders import build, chain, compute


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
