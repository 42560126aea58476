"""The bytes that must leave each GPU and machine under a placement: the *leaving* part
of the step bound's port and machine-link times (:mod:`~tagplan.planner.step_bound`).

Bytes a reader on another GPU needs leave the GPU that holds them at least once, however
the compiler routes them (a hub may forward them, but they leave their holder first):

* the rows of a batch-split op's instance, which no other instance holds, that readers
  on other GPUs read (a split reader's instances hold disjoint rows, so theirs add up; a
  reader run whole on several GPUs takes the same rows on each, so they leave once);
* what readers elsewhere need of a tensor only one GPU holds (an op run whole there);
* a partial sum, once, when a reader of the sum runs on another GPU (whatever adds the
  partials up, this GPU's share of every element has to leave it).

A machine is counted the same way across machines: rows only its GPUs hold, read on
another machine; a tensor only it holds; its partials, once.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["departures"]


@njit(cache=True)
def departures(
    inst_ptr: np.ndarray,
    inst_device: np.ndarray,
    inst_lo: np.ndarray,
    inst_hi: np.ndarray,
    op_split: np.ndarray,
    reduced: np.ndarray,
    producer: np.ndarray,
    batch: np.ndarray,
    summed: np.ndarray,
    tensor_bytes: np.ndarray,
    row_bytes: np.ndarray,
    consumer_ptr: np.ndarray,
    consumer_op: np.ndarray,
    machine: np.ndarray,
    num_devices: int,
    num_machines: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The bytes that must leave every GPU and every machine, each tensor counted at the
    reader that takes most from it, but the ``reduced`` tensors (an AllReduce sums them:
    its links are counted apart). Instances of a batch-split op hold disjoint rows in
    ascending order."""
    leaving = np.zeros(num_devices)
    exiting = np.zeros(num_machines)
    device_out = np.zeros(num_devices)  # this tensor's, from a GPU that holds it whole
    machine_out = np.zeros(num_machines)
    widest = 0
    for op in range(len(inst_ptr) - 1):
        widest = max(widest, inst_ptr[op + 1] - inst_ptr[op])
    rows_out = np.zeros(widest)  # of a batch-split tensor, per instance: its own rows
    rows_far = np.zeros(widest)  # the same, to other machines
    for t in range(len(producer)):
        p = producer[t]
        first, last = inst_ptr[p], inst_ptr[p + 1]
        if first == last or consumer_ptr[t] == consumer_ptr[t + 1] or reduced[t]:
            continue  # an AllReduce's links are counted apart
        split = batch[t] and op_split[p]
        partials = summed[t] and op_split[p]
        only_device, only_machine = inst_device[first], machine[inst_device[first]]
        for j in range(first, last):
            if inst_device[j] != only_device:
                only_device = -1
            if machine[inst_device[j]] != only_machine:
                only_machine = -1
        for k in range(consumer_ptr[t], consumer_ptr[t + 1]):
            reader = consumer_op[k]
            r0, r1 = inst_ptr[reader], inst_ptr[reader + 1]
            if split:  # rows only their instance holds, read on another GPU (machine)
                for j in range(first, last):
                    s, lo, hi = inst_device[j], inst_lo[j], inst_hi[j]
                    start = r0
                    if op_split[reader]:
                        start = r0 + np.searchsorted(inst_hi[r0:r1], lo, side="right")
                    off_device = off_machine = 0
                    for c in range(start, r1):
                        if op_split[reader] and inst_lo[c] >= hi:
                            break
                        rows = max(0, min(hi, inst_hi[c]) - max(lo, inst_lo[c]))
                        to_device = rows if inst_device[c] != s else 0
                        to_machine = rows if machine[inst_device[c]] != machine[s] else 0
                        if op_split[reader]:  # disjoint rows: each leaves for its reader
                            off_device += to_device
                            off_machine += to_machine
                        else:  # the same rows for every instance: they leave once
                            off_device = max(off_device, to_device)
                            off_machine = max(off_machine, to_machine)
                    rows_out[j - first] = max(rows_out[j - first], off_device * row_bytes[t])
                    rows_far[j - first] = max(rows_far[j - first], off_machine * row_bytes[t])
            elif partials and not op_split[reader]:  # each partial leaves for the sum
                for j in range(first, last):
                    s = inst_device[j]
                    for c in range(r0, r1):
                        if inst_device[c] != s:
                            device_out[s] = tensor_bytes[t]
                        if machine[inst_device[c]] != machine[s]:
                            machine_out[machine[s]] = tensor_bytes[t]
            else:  # one GPU (machine) holding all of it sends what readers elsewhere need
                rows_apart = batch[t] and op_split[reader]  # disjoint rows: they add up
                to_device = to_machine = 0.0
                for c in range(r0, r1):
                    d = inst_device[c]
                    need = (inst_hi[c] - inst_lo[c]) * row_bytes[t] if batch[t] else tensor_bytes[t]
                    if d != only_device:
                        to_device = to_device + need if rows_apart else max(to_device, need)
                    if machine[d] != only_machine:
                        to_machine = to_machine + need if rows_apart else max(to_machine, need)
                if only_device >= 0:
                    device_out[only_device] = max(device_out[only_device], to_device)
                if only_machine >= 0:
                    machine_out[only_machine] = max(machine_out[only_machine], to_machine)
        for j in range(first, last):  # instances of a split op hold disjoint rows
            s, m = inst_device[j], machine[inst_device[j]]
            leaving[s] += device_out[s] + rows_out[j - first]
            exiting[m] += machine_out[m] + rows_far[j - first]
            device_out[s] = machine_out[m] = rows_out[j - first] = rows_far[j - first] = 0.0
    return leaving, exiting
