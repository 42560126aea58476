"""simulate(): memory, OOM, the feedback of TAG Table 1, and upward rank (HeteroG §4.2)."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.sim.simulate import simulate, upward_rank
from tagplan.planner.sim.taskgraph import TaskGraph
from tests.planner.sim.builders import Buffer, build, chain, compute, transfer


def _two_devices_with_buffers() -> TaskGraph:
    # Device 0: a [0, 2] -> b [2, 5]; b's output goes to device 1 over link 0 [5, 6];
    # c [6, 7] on device 1 consumes it.
    tasks = [compute(0, 2.0), compute(0, 3.0), transfer([0], 1.0, nbytes=300), compute(1, 1.0)]
    buffers = [
        Buffer(0, 100, producer=0, consumers=(1,)),  # [0, 5)
        Buffer(0, 300, producer=1, consumers=(2,)),  # [2, 6)
        Buffer(1, 300, producer=2, consumers=(3,)),  # [5, 7)
        Buffer(1, 40, producer=3),  # [6, 7)
    ]
    return build(
        tasks,
        [(0, 1), (1, 2), (2, 3)],
        num_devices=2,
        num_links=1,
        buffers=buffers,
        persistent_bytes=[1000, 2000],
    )


class TestMemory:
    def test_peak_includes_persistent_and_reserve(self) -> None:
        result = simulate(_two_devices_with_buffers(), reserve_bytes=5)
        assert result.step_time_s == 7.0
        np.testing.assert_array_equal(result.peak_memory_bytes, [1405, 2345])
        assert not result.oom
        np.testing.assert_array_equal(result.overflow_bytes, [0, 0])

    def test_oom_reports_overflow_per_device(self) -> None:
        tg = _two_devices_with_buffers()
        result = simulate(tg, device_memory_bytes=np.array([1500, 2300]), reserve_bytes=5)
        assert result.oom
        np.testing.assert_array_equal(result.overflow_bytes, [0, 45])

    def test_capacity_needs_one_entry_per_device(self) -> None:
        with pytest.raises(InvalidInput, match="device_memory_bytes"):
            simulate(_two_devices_with_buffers(), device_memory_bytes=np.array([1]))


class TestGroupFeedback:
    def test_makespan_and_idle_before_transfer(self) -> None:
        tasks = [
            compute(0, 2.0, group=0),  # [0, 2] -> transfer 3, which waits for link 0
            compute(0, 1.0, group=0),  # [2, 3] -> transfer 5 [3, 4]: no wait
            compute(1, 1.0, group=2),  # [0, 1] -> transfer 6 [1, 2]
            transfer([0], 1.0),  # [3, 4], after transfer 4 frees link 0
            transfer([0], 3.0),  # [0, 3]
            transfer([1], 1.0),
            transfer([2], 1.0),
        ]
        tg = build(tasks, [(0, 3), (1, 5), (2, 6)], num_devices=2, num_links=3)
        result = simulate(tg, link_model="exclusive")  # transfer 3 waits for link 0
        np.testing.assert_array_equal(result.start_s, [0, 2, 0, 3, 0, 3, 1])
        # Groups 0 and 2 are present; 1 has no tasks.
        np.testing.assert_array_equal(result.group_makespan_s, [3.0, 0.0, 1.0])
        # Group 0: gaps 3 - 2 = 1 and 3 - 3 = 0; group 2: 1 - 1 = 0.
        np.testing.assert_array_equal(result.group_idle_before_transfer_s, [0.5, 0.0, 0.0])

    def test_compute_to_compute_edges_are_not_transfers(self) -> None:
        tasks = [compute(0, 1.0, group=0), compute(1, 1.0, group=0), compute(1, 5.0)]
        result = simulate(build(tasks, [(0, 1)], num_devices=2))
        np.testing.assert_array_equal(result.group_idle_before_transfer_s, [0.0])
        np.testing.assert_array_equal(result.group_makespan_s, [6.0])

    def test_no_groups(self) -> None:
        tasks, edges = chain(0, [1.0])
        result = simulate(build(tasks, edges))
        assert result.group_makespan_s.shape == (0,)
        assert result.group_idle_before_transfer_s.shape == (0,)


class TestUpwardRank:
    def test_small_dag_by_hand(self) -> None:
        # a(1) -> b(2), a -> c(4), b -> d(3), c -> d
        tasks = [compute(0, 1.0), compute(0, 2.0), compute(1, 4.0), compute(0, 3.0)]
        tg = build(tasks, [(0, 1), (0, 2), (1, 3), (2, 3)], num_devices=2)
        np.testing.assert_array_equal(upward_rank(tg), [8.0, 5.0, 7.0, 3.0])

    def test_priority_by_rank_shortens_the_step(self) -> None:
        # Device 0 holds a long leaf (task 0) and a short task that feeds a long chain
        # on device 1; FIFO runs them by index, the rank runs the critical one first.
        tail, tail_edges = chain(1, [5.0, 5.0], first=2)
        tasks = [compute(0, 5.0), compute(0, 1.0), *tail]
        tg = build(tasks, [(1, 2), *tail_edges], num_devices=2)
        assert simulate(tg).step_time_s == 16.0
        np.testing.assert_array_equal(upward_rank(tg), [5.0, 11.0, 10.0, 5.0])
        tg.task_priority[:] = upward_rank(tg)
        assert simulate(tg, use_priority=True).step_time_s == 11.0

    def test_cycle_raises(self) -> None:
        tg = build([compute(0, 1.0), compute(0, 1.0)], [(0, 1), (1, 0)])
        with pytest.raises(InvalidInput, match="cycle"):
            upward_rank(tg)


@pytest.mark.parametrize("use_priority", [False, True])
def test_simulating_a_cycle_raises(use_priority: bool) -> None:
    tg = build([compute(0, 1.0), compute(0, 1.0), compute(0, 1.0)], [(0, 1), (1, 2), (2, 1)])
    with pytest.raises(InvalidInput, match="cycle"):
        simulate(tg, use_priority=use_priority)


def test_non_finite_priority_is_refused_in_priority_mode() -> None:
    tg = build([compute(0, 1.0, priority=float("nan"))])
    simulate(tg)
    with pytest.raises(InvalidInput, match="finite"):
        simulate(tg, use_priority=True)
