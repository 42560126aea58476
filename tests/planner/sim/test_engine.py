"""Scheduling rules of the simulator (TAG §4.3.2 FIFO, HeteroG §4.2 priority) on tiny graphs.

Tests of link contention name the exclusive link model, where a transfer holds its links;
the shared model has its own tests (test_shared_links.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.sim.simulate import LINK_MODELS, LinkModel, simulate
from tests.planner.sim.builders import Task, build, chain, collective, compute, transfer


class TestFifo:
    def test_chain_on_one_device(self) -> None:
        tasks, edges = chain(0, [1.0, 2.0, 3.0])
        result = simulate(build(tasks, edges))
        assert result.step_time_s == 6.0
        np.testing.assert_array_equal(result.start_s, [0.0, 1.0, 3.0])
        np.testing.assert_array_equal(result.finish_s, [1.0, 3.0, 6.0])
        np.testing.assert_array_equal(result.device_busy_s, [6.0])
        np.testing.assert_array_equal(result.device_idle_fraction, [0.0])

    def test_two_independent_chains_on_two_devices(self) -> None:
        a, a_edges = chain(0, [1.0, 2.0])
        b, b_edges = chain(1, [3.0, 4.0], first=2)
        result = simulate(build(a + b, a_edges + b_edges, num_devices=2))
        assert result.step_time_s == 7.0
        np.testing.assert_array_equal(result.start_s, [0.0, 1.0, 0.0, 3.0])
        np.testing.assert_array_equal(result.device_busy_s, [3.0, 7.0])
        np.testing.assert_allclose(result.device_idle_fraction, [1 - 3 / 7, 0.0])

    def test_shared_device_serves_in_ready_order_not_index_order(self) -> None:
        # Task 1 is ready at 3, task 3 at 1: task 3 takes device 0 first.
        tasks = [compute(1, 3.0), compute(0, 2.0), compute(2, 1.0), compute(0, 4.0)]
        result = simulate(build(tasks, [(0, 1), (2, 3)], num_devices=3))
        assert (result.start_s[3], result.finish_s[3]) == (1.0, 5.0)
        assert (result.start_s[1], result.finish_s[1]) == (5.0, 7.0)
        assert result.step_time_s == 7.0

    def test_ties_in_ready_time_go_by_index(self) -> None:
        result = simulate(build([compute(0, 2.0), compute(0, 1.0)]))
        np.testing.assert_array_equal(result.start_s, [0.0, 2.0])

    def test_transfers_sharing_a_link_serialize(self) -> None:
        tg = build([transfer([0], 2.0), transfer([0], 3.0)], num_devices=0, num_links=1)
        result = simulate(tg, link_model="exclusive")
        np.testing.assert_array_equal(result.start_s, [0.0, 2.0])
        assert result.step_time_s == 5.0
        np.testing.assert_array_equal(result.link_busy_s, [5.0])
        np.testing.assert_array_equal(result.link_idle_fraction, [0.0])

    def test_transfers_on_disjoint_links_overlap(self) -> None:
        tg = build([transfer([0], 2.0), transfer([1], 3.0)], num_devices=0, num_links=2)
        result = simulate(tg)
        np.testing.assert_array_equal(result.start_s, [0.0, 0.0])
        assert result.step_time_s == 3.0
        np.testing.assert_allclose(result.link_idle_fraction, [1 / 3, 0.0])

    def test_transfer_does_not_occupy_a_device(self) -> None:
        tasks = [compute(0, 1.0), transfer([0], 5.0), compute(0, 1.0)]
        result = simulate(build(tasks, [(0, 1)], num_links=1))
        np.testing.assert_array_equal(result.start_s, [0.0, 1.0, 1.0])

    def test_collective_blocks_a_transfer_on_one_of_its_links(self) -> None:
        tasks = [collective([0, 1, 2], 4.0), transfer([1], 1.0), transfer([3], 1.0)]
        result = simulate(build(tasks, num_devices=0, num_links=4), link_model="exclusive")
        np.testing.assert_array_equal(result.start_s, [0.0, 4.0, 0.0])
        np.testing.assert_array_equal(result.link_busy_s, [4.0, 5.0, 4.0, 1.0])

    def test_waiting_collective_keeps_its_place_on_its_free_links(self) -> None:
        # Link 0 is busy until 3; the collective (ready at 1) needs links 0 and 1 and is
        # queued on link 1 before the transfer ready at 2, which therefore waits for it.
        tasks = [
            transfer([0], 3.0),
            compute(0, 1.0),
            collective([0, 1], 2.0),
            compute(1, 2.0),
            transfer([1], 1.0),
        ]
        tg = build(tasks, [(1, 2), (3, 4)], num_devices=2, num_links=2)
        result = simulate(tg, link_model="exclusive")
        assert (result.start_s[2], result.finish_s[2]) == (3.0, 5.0)
        assert result.start_s[4] == 5.0

    def test_transfer_without_links_starts_when_ready(self) -> None:
        tasks = [compute(0, 2.0), transfer([], 1.5), compute(0, 1.0)]
        result = simulate(build(tasks, [(0, 1), (1, 2)]))
        np.testing.assert_array_equal(result.start_s, [0.0, 2.0, 3.5])

    def test_empty_graph(self) -> None:
        result = simulate(build([], num_devices=2))
        assert result.step_time_s == 0.0
        np.testing.assert_array_equal(result.device_busy_s, [0.0, 0.0])


class TestPriority:
    def _contended(self) -> list[Task]:
        # Device 0 runs task 0 until 10; task 2 (priority 1) is ready at 1 and task 4
        # (priority 5) at 2, both waiting for device 0.
        return [
            compute(0, 10.0),
            compute(1, 1.0),
            compute(0, 1.0, priority=1.0),
            compute(2, 2.0),
            compute(0, 1.0, priority=5.0),
        ]

    def test_fifo_runs_the_earlier_ready_task_first(self) -> None:
        tg = build(self._contended(), [(1, 2), (3, 4)], num_devices=3)
        result = simulate(tg)
        assert (result.start_s[2], result.start_s[4]) == (10.0, 11.0)

    def test_free_device_picks_the_highest_priority_waiting_task(self) -> None:
        tg = build(self._contended(), [(1, 2), (3, 4)], num_devices=3)
        result = simulate(tg, use_priority=True)
        assert (result.start_s[4], result.start_s[2]) == (10.0, 11.0)
        assert result.step_time_s == 12.0

    def test_priority_on_a_link(self) -> None:
        # Link 0 is busy until 4; the transfer (priority 1) is ready at 1, the collective
        # (priority 2) at 2.
        tasks = [
            transfer([0], 4.0),
            compute(0, 1.0),
            transfer([0], 1.0, priority=1.0),
            compute(0, 1.0),
            collective([0, 1], 1.0, priority=2.0),
        ]
        tg = build(tasks, [(1, 2), (3, 4)], num_links=2)
        fifo = simulate(tg, link_model="exclusive")
        assert (fifo.start_s[2], fifo.start_s[4]) == (4.0, 5.0)
        ranked = simulate(tg, use_priority=True, link_model="exclusive")
        assert (ranked.start_s[4], ranked.start_s[2]) == (4.0, 5.0)

    def test_higher_priority_does_not_preempt(self) -> None:
        tasks = [compute(0, 3.0), compute(1, 1.0), compute(0, 1.0, priority=9.0)]
        result = simulate(build(tasks, [(1, 2)], num_devices=2), use_priority=True)
        np.testing.assert_array_equal(result.start_s, [0.0, 0.0, 3.0])

    @pytest.mark.parametrize("link_model", LINK_MODELS)
    def test_equal_priorities_reproduce_fifo(self, link_model: LinkModel) -> None:
        rng = np.random.default_rng(7)
        for _ in range(20):
            n = 60
            tasks = []
            for _ in range(n):
                if rng.random() < 0.6:
                    tasks.append(compute(int(rng.integers(3)), float(rng.integers(1, 5))))
                else:
                    links = rng.choice(4, size=int(rng.integers(1, 3)), replace=False)
                    tasks.append(transfer(links.tolist(), float(rng.integers(1, 5))))
            edges = [(a, b) for a in range(n) for b in range(a + 1, n) if rng.random() < 0.05]
            tg = build(tasks, edges, num_devices=3, num_links=4)
            fifo = simulate(tg, link_model=link_model)
            ranked = simulate(tg, use_priority=True, link_model=link_model)
            np.testing.assert_array_equal(fifo.start_s, ranked.start_s)
            np.testing.assert_array_equal(fifo.link_busy_s, ranked.link_busy_s)


def test_schedules_respect_dependencies_and_resources() -> None:
    rng = np.random.default_rng(3)
    n = 300
    tasks = [compute(int(rng.integers(4)), float(rng.random())) for _ in range(n)]
    edges = [(a, b) for a in range(n) for b in range(a + 1, min(n, a + 20)) if rng.random() < 0.1]
    tg = build(tasks, edges, num_devices=4)
    for use_priority in (False, True):
        result = simulate(tg, use_priority=use_priority)
        for a, b in edges:
            assert result.start_s[b] >= result.finish_s[a]
        for d in range(4):
            on = np.flatnonzero(tg.task_device == d)
            order = on[np.argsort(result.start_s[on])]
            assert (result.start_s[order[1:]] >= result.finish_s[order[:-1]]).all()
        np.testing.assert_allclose(
            result.device_busy_s, np.bincount(tg.task_device, tg.task_duration_s)
        )


@pytest.mark.parametrize("link_model", LINK_MODELS)
@pytest.mark.parametrize("use_priority", [False, True])
def test_zero_duration_tasks(use_priority: bool, link_model: LinkModel) -> None:
    tasks = [compute(0, 0.0), compute(0, 0.0), compute(0, 2.0)]
    tg = build(tasks, [(0, 1), (1, 2)])
    result = simulate(tg, use_priority=use_priority, link_model=link_model)
    np.testing.assert_array_equal(result.start_s, [0.0, 0.0, 0.0])
    assert result.step_time_s == 2.0
