"""One walk over a placement's instances for the step bound
(:mod:`~tagplan.planner.step_bound`, docs/design.md §7): the longest chain of instances
with their transfers at the fastest path, the bytes that must reach every GPU and
machine, and which tensors an AllReduce sums, when its partials are made and for which
reader.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from tagplan.planner.collective_starts import released
from tagplan.planner.compile.placement import Placement
from tagplan.planner.strategy import Mode

__all__ = ["ChainWalk", "chains_and_arrivals", "instances_of"]


class ChainWalk(NamedTuple):
    """What one walk over the instances finds (:func:`chains_and_arrivals`)."""

    chain_s: float
    arriving: np.ndarray  # bytes that must reach each GPU
    entering: np.ndarray  # and each machine
    reduced: np.ndarray  # per tensor: summed by an AllReduce
    release_s: np.ndarray  # per tensor: when its AllReduce's partials are made
    summed_by: np.ndarray  # per tensor: a reader its AllReduce is for
    finish_s: np.ndarray  # per instance: the chain's finish


def instances_of(placement: Placement) -> tuple[np.ndarray, ...]:
    """The placement's instances as the kernels read them (its int32 columns as they
    are: the kernels' arithmetic on them is 64-bit)."""
    return (
        placement.inst_ptr,
        placement.inst_device,
        placement.inst_lo,
        placement.inst_hi,
        placement.op_mode == int(Mode.SPLIT),
    )


@njit(cache=True)
def chains_and_arrivals(
    inst_ptr: np.ndarray,
    inst_device: np.ndarray,
    inst_lo: np.ndarray,
    inst_hi: np.ndarray,
    op_split: np.ndarray,
    seconds: np.ndarray,
    input_ptr: np.ndarray,
    input_tensor: np.ndarray,
    producer: np.ndarray,
    batch: np.ndarray,
    summed: np.ndarray,
    tensor_bytes: np.ndarray,
    row_bytes: np.ndarray,
    consumer_ptr: np.ndarray,
    consumer_op: np.ndarray,
    machine: np.ndarray,
    rate: np.ndarray,
    in_port: np.ndarray,
    downlink: np.ndarray,
    num_machines: int,
    links: bool,
    collectives: bool,
) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The longest chain, the bytes arriving at every GPU and machine, and, with
    ``collectives``, which tensors an AllReduce sums (their links are counted apart:
    module docstring), the earliest each such AllReduce can start (once the last of its
    partials is made) and a reader it is summed for. Instances of a batch-split op hold
    disjoint rows in ascending order."""
    num_ops = len(inst_ptr) - 1
    num_devices = len(rate)
    finish = np.zeros(len(inst_device))
    on_device = np.full(num_devices, -1, dtype=np.int64)  # the producer's instance there
    widest = 0
    for op in range(num_ops):
        widest = max(widest, inst_ptr[op + 1] - inst_ptr[op])
    ready = np.zeros(widest)
    made = np.zeros(widest)
    port_s = np.zeros(widest)
    far_s = np.zeros(widest)
    for op in range(num_ops):
        c0, c1 = inst_ptr[op], inst_ptr[op + 1]
        ready[: c1 - c0] = 0.0
        for k in range(input_ptr[op], input_ptr[op + 1]):
            t = input_tensor[k]
            p = producer[t]
            first, last = inst_ptr[p], inst_ptr[p + 1]
            if first == last:
                continue
            if batch[t] and op_split[p]:  # wait for every instance with rows we read
                for c in range(c0, c1):
                    d, lo, hi = inst_device[c], inst_lo[c], inst_hi[c]
                    start = first + np.searchsorted(inst_hi[first:last], lo, side="right")
                    remote = 0  # rows from other GPUs, each: made at, seconds in, machine
                    for j in range(start, last):
                        if inst_lo[j] >= hi:
                            break
                        arrive = finish[j]
                        if links and inst_device[j] != d:
                            nbytes = (min(hi, inst_hi[j]) - max(lo, inst_lo[j])) * row_bytes[t]
                            arrive += nbytes / rate[inst_device[j], d]
                            made[remote] = finish[j]
                            port_s[remote] = nbytes / in_port[d]
                            far_s[remote] = 0.0
                            if machine[inst_device[j]] != machine[d]:
                                far_s[remote] = nbytes / downlink[machine[d]]
                            remote += 1
                        ready[c - c0] = max(ready[c - c0], arrive)
                    if remote > 1:  # they share the GPU's in-port and machine's downlink
                        ready[c - c0] = max(
                            ready[c - c0],
                            released(made[:remote], port_s[:remote]),
                            released(made[:remote], far_s[:remote]),
                        )
            elif summed[t] and op_split[p] and not op_split[op]:  # the sum of them all
                for c in range(c0, c1):
                    d = inst_device[c]
                    for j in range(first, last):
                        arrive = finish[j]
                        if links and inst_device[j] != d:
                            arrive += tensor_bytes[t] / rate[inst_device[j], d]
                        ready[c - c0] = max(ready[c - c0], arrive)
            else:  # the earliest instance that can serve us: its own GPU's, or any other's
                earliest = np.inf
                for j in range(first, last):
                    on_device[inst_device[j]] = j
                    earliest = min(earliest, finish[j])
                for c in range(c0, c1):
                    d = inst_device[c]
                    soonest = earliest
                    if links:
                        need = (
                            (inst_hi[c] - inst_lo[c]) * row_bytes[t]
                            if batch[t]
                            else tensor_bytes[t]
                        )
                        soonest += need / rate[d, d]
                    if on_device[d] >= 0:
                        soonest = min(soonest, finish[on_device[d]])
                    ready[c - c0] = max(ready[c - c0], soonest)
                for j in range(first, last):
                    on_device[inst_device[j]] = -1
        for c in range(c0, c1):
            finish[c] = ready[c - c0] + seconds[c]
    chain = finish.max() if len(finish) else 0.0
    arriving = np.zeros(num_devices)
    entering = np.zeros(num_machines)
    reduced = np.zeros(len(producer), dtype=np.bool_)  # summed by an AllReduce
    release = np.zeros(len(producer))
    summed_by = np.full(len(producer), -1, dtype=np.int64)
    if not links:
        return chain, arriving, entering, reduced, release, summed_by, finish
    device_need = np.zeros(num_devices)
    machine_need = np.zeros(num_machines)
    held_machine = np.zeros(num_machines, dtype=np.bool_)
    reader_on = np.zeros(num_devices, dtype=np.bool_)
    for t in range(len(producer)):
        p = producer[t]
        first, last = inst_ptr[p], inst_ptr[p + 1]
        if first == last or consumer_ptr[t] == consumer_ptr[t + 1]:
            continue
        split = batch[t] and op_split[p]
        partials = summed[t] and op_split[p]
        only_device, only_machine = inst_device[first], machine[inst_device[first]]
        for j in range(first, last):
            on_device[inst_device[j]] = j
            held_machine[machine[inst_device[j]]] = True
            if inst_device[j] != only_device:
                only_device = -1
            if machine[inst_device[j]] != only_machine:
                only_machine = -1
        for k in range(consumer_ptr[t], consumer_ptr[t + 1]):
            reader = consumer_op[k]
            mirrored = False  # the reader runs beside every partial: one AllReduce
            if partials and not op_split[reader]:
                for c in range(inst_ptr[reader], inst_ptr[reader + 1]):
                    reader_on[inst_device[c]] = True
                mirrored = True
                for j in range(first, last):
                    mirrored = mirrored and reader_on[inst_device[j]]
                for c in range(inst_ptr[reader], inst_ptr[reader + 1]):
                    reader_on[inst_device[c]] = False
            for c in range(inst_ptr[reader], inst_ptr[reader + 1]):
                d, lo, hi = inst_device[c], inst_lo[c], inst_hi[c]
                m = machine[d]
                if partials and not op_split[reader]:
                    if mirrored and collectives and only_device < 0:  # an AllReduce
                        reduced[t] = True  # its links' share: StepBound._collective_busy
                        summed_by[t] = reader
                        here = 0.0 if on_device[d] >= 0 else tensor_bytes[t]  # else a copy
                        on_machine = 0.0 if held_machine[m] else tensor_bytes[t]
                    elif mirrored:  # the sum, once
                        here = 0.0 if only_device == d else tensor_bytes[t]
                        on_machine = 0.0 if only_machine == m else tensor_bytes[t]
                    else:  # every other GPU's partial, added up where it is read
                        here = on_machine = 0.0
                        for j in range(first, last):
                            if inst_device[j] != d:
                                here += tensor_bytes[t]
                            if machine[inst_device[j]] != m:
                                on_machine += tensor_bytes[t]
                    device_need[d] = max(device_need[d], here)
                    machine_need[m] = max(machine_need[m], on_machine)
                    continue
                if not split:
                    need = (hi - lo) * row_bytes[t] if batch[t] else tensor_bytes[t]
                    if on_device[d] < 0:
                        device_need[d] = max(device_need[d], need)
                    if not held_machine[m]:
                        machine_need[m] = max(machine_need[m], need)
                    continue
                here = 0  # rows held by the producer's instance on d
                j = on_device[d]
                if j >= 0:
                    here = max(0, min(hi, inst_hi[j]) - max(lo, inst_lo[j]))
                on_machine = 0  # rows held on d's machine
                start = first + np.searchsorted(inst_hi[first:last], lo, side="right")
                for j in range(start, last):
                    if inst_lo[j] >= hi:
                        break
                    if machine[inst_device[j]] == m:
                        on_machine += min(hi, inst_hi[j]) - max(lo, inst_lo[j])
                device_need[d] = max(device_need[d], (hi - lo - here) * row_bytes[t])
                machine_need[m] = max(machine_need[m], (hi - lo - on_machine) * row_bytes[t])
        for j in range(first, last):
            on_device[inst_device[j]] = -1
            held_machine[machine[inst_device[j]]] = False
            if reduced[t]:
                release[t] = max(release[t], finish[j])
        for k in range(consumer_ptr[t], consumer_ptr[t + 1]):
            reader = consumer_op[k]
            for c in range(inst_ptr[reader], inst_ptr[reader + 1]):
                d = inst_device[c]
                arriving[d] += device_need[d]
                device_need[d] = 0.0
                m = machine[d]
                entering[m] += machine_need[m]
                machine_need[m] = 0.0
    return chain, arriving, entering, reduced, release, summed_by, finish
