"""Peak memory per device from a schedule, by reference counting (TAG §4.3.2).

A buffer ``b`` of ``B_b`` bytes on device ``d_b`` is live over ``[alloc_b, free_b)`` with

.. math::

    \\mathrm{alloc}_b = \\mathrm{start}(\\mathrm{producer}_b),\\qquad
    \\mathrm{free}_b = \\max\\big(\\mathrm{finish}(\\mathrm{producer}_b),
        \\max_{c \\in \\mathrm{consumers}_b} \\mathrm{finish}(c)\\big)

so a buffer with no consumers is freed when its producer finishes (the producer's
finish also bounds a consumer list that would end earlier, which a valid graph never
does since consumers succeed the producer). The usage of device ``d`` at time ``t`` is

.. math::

    M_d(t) = \\mathrm{persistent}_d + \\sum_{b:\\, d_b = d,\\ \\mathrm{alloc}_b \\le t
        < \\mathrm{free}_b} B_b

and the peak is its maximum over the step. The sweep sorts the alloc (+B) and free (-B)
events of each device by time with **frees before allocs at equal times**: a tensor
released by the op that finishes at ``t`` is gone before the op starting at ``t``
allocates its output, as in TensorFlow, where a kernel's inputs are unreferenced when it
completes. A buffer whose producer takes no time is therefore never counted.

Shapes: ``start_s``, ``finish_s`` are per task; ``peak_bytes`` is per device, in bytes;
the timeline is a CSR over devices of (time in s, bytes in use after that time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from tagplan.planner.sim.taskgraph import TaskGraph

__all__ = ["MemoryProfile", "buffer_lifetimes", "memory_profile"]


@dataclass(frozen=True)
class MemoryProfile:
    """Peak memory per device and, optionally, its usage over time."""

    peak_bytes: np.ndarray  # int64 per device: persistent + peak of live buffers
    timeline_ptr: np.ndarray | None = None  # int64 CSR over devices
    timeline_time_s: np.ndarray | None = None  # float64: step points, sorted per device
    timeline_bytes: np.ndarray | None = None  # int64: usage from that time on


def buffer_lifetimes(
    tg: TaskGraph, start_s: np.ndarray, finish_s: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(alloc_s, free_s)`` of every buffer: producer's start; last consumer's finish."""
    producer = tg.buffer_producer
    alloc = start_s[producer]
    free = finish_s[producer].copy()
    counts = np.diff(tg.consumer_ptr)
    used = counts > 0
    if used.any():
        # reduceat over the starts of the non-empty slices only: each then spans exactly
        # its own consumers, since the empty slices between them contribute nothing.
        last = np.maximum.reduceat(finish_s[tg.consumer_task], tg.consumer_ptr[:-1][used])
        free[used] = np.maximum(free[used], last)
    return alloc, free


def memory_profile(
    tg: TaskGraph, start_s: np.ndarray, finish_s: np.ndarray, *, timeline: bool = False
) -> MemoryProfile:
    """Peak bytes per device (persistent included) of the schedule ``(start_s, finish_s)``.

    With ``timeline=True`` also the usage of each device over time: a point at 0 with the
    persistent bytes, then one per distinct event time, holding the usage from then on.
    """
    num_devices = tg.num_devices
    persistent = np.asarray(tg.persistent_bytes, dtype=np.int64)
    alloc, free = buffer_lifetimes(tg, start_s, finish_s)
    nb = tg.num_buffers
    # Frees first at equal times: the alloc key is nudged to the next float up, which
    # reorders no other pair of events (nothing lies strictly between t and its successor).
    key = np.concatenate([free, np.nextafter(alloc, np.inf)])
    delta = np.concatenate([-tg.buffer_bytes, tg.buffer_bytes]).astype(np.int64)
    dev = np.concatenate([tg.buffer_device, tg.buffer_device])
    order = _device_time_order(dev.astype(np.int64), key)
    dev_sorted = dev[order]
    level = np.cumsum(delta[order])
    counts = np.bincount(dev_sorted, minlength=num_devices)
    ptr = np.zeros(num_devices + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    # Per-device running sum: subtract the total of the devices sorted before it.
    before = np.concatenate([[0], level])[ptr[:-1]]
    level -= np.repeat(before, counts)
    peak = np.zeros(num_devices, dtype=np.int64)
    has = counts > 0
    if has.any():
        peak[has] = np.maximum(np.maximum.reduceat(level, ptr[:-1][has]), 0)
    profile_peak = peak + persistent
    if not timeline:
        return MemoryProfile(peak_bytes=profile_peak)
    times = np.concatenate([free, alloc])[order]
    # Keep the last event of each (device, time): frees then allocs, so it is also the
    # highest usage at that instant.
    last = np.ones(2 * nb, dtype=bool)
    if nb:
        last[:-1] = (dev_sorted[1:] != dev_sorted[:-1]) | (times[1:] != times[:-1])
    kept_dev = dev_sorted[last]
    kept_counts = np.bincount(kept_dev, minlength=num_devices) + 1
    tl_ptr = np.zeros(num_devices + 1, dtype=np.int64)
    np.cumsum(kept_counts, out=tl_ptr[1:])
    tl_time = np.zeros(tl_ptr[-1])
    tl_bytes = np.empty(tl_ptr[-1], dtype=np.int64)
    heads = tl_ptr[:-1]
    tl_bytes[heads] = persistent
    rest = np.ones(tl_ptr[-1], dtype=bool)
    rest[heads] = False
    tl_time[rest] = times[last]
    tl_bytes[rest] = level[last] + persistent[kept_dev]
    return MemoryProfile(
        peak_bytes=profile_peak,
        timeline_ptr=tl_ptr,
        timeline_time_s=tl_time,
        timeline_bytes=tl_bytes,
    )


_DIGIT_BITS = 16  # a radix pass sorts by this many bits of the key


@njit(cache=True)
def _device_time_order(device: np.ndarray, time_s: np.ndarray) -> np.ndarray:
    """The events' order by device, then time, then number: a least-significant-digit
    radix sort, linear in the events where a comparison sort of the times is not (a task
    graph on 64 GPUs has about half a million buffers). A float's bits, the sign bit
    flipped for a non-negative one and every bit for a negative one, order as the float
    does (-0.0 as 0.0); a pass whose digit every key shares is skipped."""
    n = len(time_s)
    bits = time_s.view(np.uint64)
    keys = np.empty(n, dtype=np.uint64)
    sign = np.uint64(1) << np.uint64(63)
    for i in range(n):
        b = bits[i]
        keys[i] = ~b if b & sign and b != sign else b | sign  # -0.0 is 0.0
    order = np.arange(n)
    spare = np.empty(n, dtype=np.int64)
    digits = np.empty(n, dtype=np.int64)
    mask = np.uint64((1 << _DIGIT_BITS) - 1)
    widest = device.max() + 1 if n else 0
    counts = np.empty(max(1 << _DIGIT_BITS, widest), dtype=np.int64)
    for shift in range(0, 64 + _DIGIT_BITS, _DIGIT_BITS):  # the last pass: the device
        if shift < 64:
            for i in range(n):
                digits[i] = np.int64((keys[i] >> np.uint64(shift)) & mask)
        else:
            digits[:] = device
        counts[:] = 0
        for i in range(n):
            counts[digits[i]] += 1
        if n and counts.max() == n:
            continue  # every key has this digit: the order stands
        total = 0
        for d in range(len(counts)):
            total, counts[d] = total + counts[d], total
        for i in range(n):
            j = order[i]
            spare[counts[digits[j]]] = j
            counts[digits[j]] += 1
        order, spare = spare, order
    return order
