"""Peak memory by reference counting (TAG §4.3.2) on hand-built schedules."""

from __future__ import annotations

import numpy as np

from tagplan.planner.sim.memory import _device_time_order, buffer_lifetimes, memory_profile
from tagplan.planner.sim.taskgraph import TaskGraph
from tests.planner.sim.builders import Buffer, build, compute


def _four_tasks() -> tuple[TaskGraph, np.ndarray, np.ndarray]:
    """Tasks 0..2 on device 0, task 3 on device 1, with a fixed schedule."""
    tasks = [compute(0, 2.0), compute(0, 3.0), compute(0, 2.0), compute(1, 1.0)]
    buffers = [
        Buffer(0, 100, producer=0, consumers=(1, 2)),  # live [0, 5)
        Buffer(0, 200, producer=1, consumers=(3,)),  # live [2, 6)
        Buffer(0, 50, producer=2),  # no consumers: live [2, 4)
        Buffer(1, 70, producer=3),  # live [5, 6)
    ]
    tg = build(
        tasks,
        [(0, 1), (0, 2), (1, 3)],
        num_devices=2,
        buffers=buffers,
        persistent_bytes=[1000, 10],
    )
    start = np.array([0.0, 2.0, 2.0, 5.0])
    finish = np.array([2.0, 5.0, 4.0, 6.0])
    return tg, start, finish


def test_lifetimes_from_producer_start_to_last_consumer_finish() -> None:
    tg, start, finish = _four_tasks()
    alloc, free = buffer_lifetimes(tg, start, finish)
    np.testing.assert_array_equal(alloc, [0.0, 2.0, 2.0, 5.0])
    np.testing.assert_array_equal(free, [5.0, 6.0, 4.0, 6.0])


def test_peak_is_the_hand_count_plus_persistent() -> None:
    tg, start, finish = _four_tasks()
    profile = memory_profile(tg, start, finish)
    # Device 0 during [2, 4): 100 + 200 + 50; device 1 during [5, 6): 70.
    np.testing.assert_array_equal(profile.peak_bytes, [1000 + 350, 10 + 70])
    assert profile.timeline_ptr is None


def test_frees_come_before_allocs_at_equal_times() -> None:
    # a -> b -> c on one device; a is freed at 2, when c's output is allocated.
    tasks = [compute(0, 1.0), compute(0, 1.0), compute(0, 1.0)]
    buffers = [Buffer(0, 10, 0, (1,)), Buffer(0, 20, 1, (2,)), Buffer(0, 40, 2)]
    tg = build(tasks, [(0, 1), (1, 2)], buffers=buffers)
    profile = memory_profile(tg, np.array([0.0, 1.0, 2.0]), np.array([1.0, 2.0, 3.0]))
    assert profile.peak_bytes[0] == 20 + 40


def test_buffer_with_no_consumers_lives_while_its_producer_runs() -> None:
    tg = build([compute(0, 4.0)], buffers=[Buffer(0, 64, 0)], persistent_bytes=[8])
    profile = memory_profile(tg, np.array([0.0]), np.array([4.0]), timeline=True)
    assert profile.peak_bytes[0] == 72
    np.testing.assert_array_equal(profile.timeline_time_s, [0.0, 0.0, 4.0])
    np.testing.assert_array_equal(profile.timeline_bytes, [8, 72, 8])


def test_device_without_buffers_holds_its_persistent_bytes() -> None:
    tg = build([compute(0, 1.0)], num_devices=2, persistent_bytes=[5, 7])
    profile = memory_profile(tg, np.array([0.0]), np.array([1.0]), timeline=True)
    np.testing.assert_array_equal(profile.peak_bytes, [5, 7])
    np.testing.assert_array_equal(profile.timeline_ptr, [0, 1, 2])


def test_timeline_per_device() -> None:
    tg, start, finish = _four_tasks()
    profile = memory_profile(tg, start, finish, timeline=True)
    ptr = profile.timeline_ptr
    np.testing.assert_array_equal(ptr, [0, 6, 9])
    # A point at 0 with the persistent bytes, then one per distinct event time: both
    # allocations at 2 land in one point.
    np.testing.assert_array_equal(profile.timeline_time_s[:6], [0.0, 0.0, 2.0, 4.0, 5.0, 6.0])
    np.testing.assert_array_equal(profile.timeline_bytes[:6], [1000, 1100, 1350, 1300, 1200, 1000])
    np.testing.assert_array_equal(profile.timeline_time_s[6:], [0.0, 5.0, 6.0])
    np.testing.assert_array_equal(profile.timeline_bytes[6:], [10, 80, 10])


def test_matches_a_direct_count_on_random_lifetimes() -> None:
    rng = np.random.default_rng(11)
    n, num_devices = 40, 3
    start = rng.integers(0, 20, n).astype(float)
    finish = start + rng.integers(0, 4, n)
    buffers = []
    for producer in range(n):
        later = np.flatnonzero(start >= finish[producer])
        consumers = rng.choice(later, size=min(len(later), int(rng.integers(0, 3))), replace=False)
        buffers.append(
            Buffer(
                int(rng.integers(num_devices)),
                int(rng.integers(1, 100)),
                producer,
                tuple(int(c) for c in consumers),
            )
        )
    tg = build(
        [compute(0, float(f - s)) for s, f in zip(start, finish, strict=True)],
        num_devices=num_devices,
        buffers=buffers,
        persistent_bytes=[3, 0, 9],
    )
    alloc, free = buffer_lifetimes(tg, start, finish)
    profile = memory_profile(tg, start, finish, timeline=True)

    def usage(device: int, t: float) -> int:
        live = (tg.buffer_device == device) & (alloc <= t) & (t < free)
        return int(tg.buffer_bytes[live].sum() + tg.persistent_bytes[device])

    for device in range(num_devices):
        expected = max([usage(device, t) for t in alloc] + [int(tg.persistent_bytes[device])])
        assert profile.peak_bytes[device] == expected
        lo, hi = profile.timeline_ptr[device], profile.timeline_ptr[device + 1]
        for t, value in zip(
            profile.timeline_time_s[lo + 1 : hi], profile.timeline_bytes[lo + 1 : hi], strict=True
        ):
            assert value == usage(device, t)


def test_events_are_ordered_by_device_then_time_then_number() -> None:
    rng = np.random.default_rng(5)
    n = 5000
    times = rng.choice(np.concatenate([rng.random(300) * 10.0 ** rng.integers(-9, 4, 300)]), n)
    times[:3] = [0.0, -0.0, 2.0**-1074]  # zeros tie; the smallest float follows them
    device = rng.integers(0, 9, n)
    device[:3] = 4
    order = _device_time_order(device, times)
    assert order.tolist() == np.lexsort((np.arange(n), times, device)).tolist()
