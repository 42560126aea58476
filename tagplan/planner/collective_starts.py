"""When each AllReduce can start at the earliest, and how long a link takes with work
released over time: the step bound's *collectives after they start* part
(:mod:`~tagplan.planner.step_bound`, docs/design.md §7).

A gradient's AllReduce starts as its op group's gradient sync says
(:class:`~tagplan.planner.strategy.GradientSync`): once its bucket's last gradient is
made, once every gradient is (after the backward pass), or once its own partials are.
Before that, every GPU holding a partial has run, one task at a time, each instance that
must precede those partials, none before its chain's start. A link with work released
over time is busy at least until the largest release plus the work released no earlier
(one machine with release dates); the chain uses the same rule for the rows a reader
gathers through its in-port.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from tagplan.planner.compile.buckets import GradientAllReduce, gradient_buckets
from tagplan.planner.strategy import GradientSync, ResolvedStrategy

if TYPE_CHECKING:  # the walk imports this module's kernels
    from tagplan.planner.chains import ChainWalk

__all__ = ["GradientStarts", "after_release_s", "released", "serial_before"]

_MAX_UNITS = 63  # gradients' start groups told apart by serial_before (bits of an int64)
_START_SLICES = 16  # serial_before's steps of the instances' earliest starts
_MAX_SETS = 256  # sets of units serial_before sums apart (more: instance by instance)


class GradientStarts:
    """:meth:`starts` for one graph and cluster: what it reads of every op and tensor."""

    def __init__(
        self,
        *,
        producer: np.ndarray,
        consumer_ptr: np.ndarray,
        gradient: np.ndarray,
        tensor_bytes: np.ndarray,
        input_ptr: np.ndarray,
        input_tensor: np.ndarray,
        batch: np.ndarray,
        summed: np.ndarray,
        num_devices: int,
    ) -> None:
        self._producer = producer
        self._one_reader = np.diff(consumer_ptr) == 1  # per tensor
        self._gradient, self._bytes = gradient, tensor_bytes
        self._input_ptr, self._input_tensor = input_ptr, input_tensor
        self._batch, self._summed = batch, summed
        self.num_devices = num_devices

    def starts(
        self,
        by_members: dict[tuple[int, ...], list[int]],
        resolved: ResolvedStrategy,
        instances: tuple[np.ndarray, ...],
        seconds: np.ndarray,
        walk: ChainWalk,
    ) -> np.ndarray:
        """The earliest each AllReduce starts under its op group's gradient sync
        (:class:`~tagplan.planner.strategy.GradientSync`): a gradient's in an
        ``after-backward`` group once every gradient's partials are made, one in a
        ``bucketed`` group once its bucket's last gradient is (the buckets of
        :func:`~tagplan.planner.compile.buckets.gradient_buckets` over the gradients'
        AllReduces in the order the compiler lists them, by the op reading each sum),
        one in an ``overlap`` group once its own are; and not before each GPU has run
        the instances that must precede those partials, one at a time
        (:func:`serial_before`). Once its own partials are made where that order is not
        certain: unless every gradient summed has one reader and no op reads two of them.
        ``walk`` is the step bound's walk over the instances: when each AllReduce's
        partials are made, a reader it is summed for, and each instance's chain."""
        release_s, summed_by = walk.release_s, walk.summed_by
        gradients = [t for tensors in by_members.values() for t in tensors if self._gradient[t]]
        if not gradients:
            return release_s
        single = self._one_reader[gradients]
        readers = summed_by[gradients]
        if not single.all() or len(np.unique(readers)) < len(readers):
            return release_s
        members_of = {t: members for members, tensors in by_members.items() for t in tensors}
        order = np.array([gradients[i] for i in np.argsort(readers, kind="stable")])
        decisions = resolved.group_decisions
        groups = resolved.op_group[summed_by[order]].tolist()
        syncs = [decisions[g].gradient_sync for g in groups]
        after = np.array([sync == GradientSync.AFTER_BACKWARD for sync in syncs])
        # each gradient's unit: its bucket, itself (overlap), or the after-backward ones'
        unit = np.full(len(self._producer), -1, dtype=np.int64)
        start_s = release_s.copy()
        start_s[order[after]] = release_s[order].max()
        allreduces = [
            GradientAllReduce(g, members_of[t], int(self._bytes[t]))
            for g, t in zip(groups, order.tolist(), strict=True)
        ]
        units = 0
        for bucket in gradient_buckets(allreduces, decisions):
            tensors = order[list(bucket.collectives)]
            start_s[tensors] = release_s[tensors].max()
            unit[tensors], units = units, units + 1
        alone = order[[sync == GradientSync.OVERLAP for sync in syncs]]
        unit[alone] = np.arange(units, units + len(alone))
        units += len(alone)
        unit[order[after]], units = units, units + int(after.any())
        if units > _MAX_UNITS:
            return start_s
        serial_s, serial_any_s = serial_before(
            *instances,
            seconds,
            self._input_ptr,
            self._input_tensor,
            self._producer,
            self._batch,
            self._summed,
            unit,
            units,
            self.num_devices,
            walk.finish_s,
            walk.chain_s,
            _MAX_SETS,
        )
        start_s[order] = np.maximum(
            start_s[order], np.where(after, serial_any_s, serial_s[unit[order]])
        )
        return start_s


def after_release_s(release_s: np.ndarray, busy_s: np.ndarray) -> float:
    """The earliest a link is done with work released over time: work ``j`` takes
    ``busy_s[j]`` seconds of the link and cannot start before ``release_s[j]``, so
    whatever is released at or after a time still takes its seconds after it, and the link
    is busy at least until the largest ``release_s[k]`` plus the work released no earlier
    (the classic bound of one machine with release dates)."""
    order = np.argsort(-release_s, kind="stable")
    return float((release_s[order] + np.cumsum(busy_s[order])).max(initial=0.0))


@njit(cache=True)
def serial_before(
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
    unit: np.ndarray,
    num_units: int,
    num_devices: int,
    finish: np.ndarray,
    chain_s: float,
    max_sets: int,
) -> tuple[np.ndarray, float]:
    """For each unit of tensors (``unit[t]``: at most 63 units), the least time before
    all their producers' instances are done: a GPU runs its compute one task at a time,
    so it is busy at least until it has run every instance of its that must precede one
    of them, and those that cannot start before a time (their chain's start, ``finish``
    less their seconds) run after it: one machine with release dates, the dates taken at
    :data:`_START_SLICES` steps of the longest chain ``chain_s`` (any time gives a bound;
    the steps keep it one pass). An instance must precede a reader's instance whose rows
    it holds (a batch-split producer) and every reader's instance of the sum of its
    partials (a reader not split the same way), as the chain bound waits for them; where
    any instance may serve a reader, none is counted. Also the least time before every
    unit's producers are done. Instances are summed per set of units they precede, up
    to ``max_sets`` sets, and one unit at a time past them."""
    num_ops = len(inst_ptr) - 1
    before = np.zeros(len(inst_device), dtype=np.int64)  # bit u: precedes unit u
    for t in range(len(producer)):
        if unit[t] >= 0:
            p = producer[t]
            for j in range(inst_ptr[p], inst_ptr[p + 1]):
                before[j] |= np.int64(1) << unit[t]
    for op in range(num_ops - 1, -1, -1):  # readers come after their producers
        c0, c1 = inst_ptr[op], inst_ptr[op + 1]
        after = np.int64(0)
        for c in range(c0, c1):
            after |= before[c]
        if after == 0:
            continue
        for k in range(input_ptr[op], input_ptr[op + 1]):
            t = input_tensor[k]
            p = producer[t]
            first, last = inst_ptr[p], inst_ptr[p + 1]
            if batch[t] and op_split[p]:
                for c in range(c0, c1):
                    if before[c] == 0:
                        continue
                    lo, hi = inst_lo[c], inst_hi[c]
                    start = first + np.searchsorted(inst_hi[first:last], lo, side="right")
                    for j in range(start, last):
                        if inst_lo[j] >= hi:
                            break
                        before[j] |= before[c]
            elif summed[t] and op_split[p] and not op_split[op]:
                for j in range(first, last):
                    before[j] |= after
    # by when each instance may start at the earliest (its chain), in _START_SLICES
    # slices of the longest chain, summed per set of units it precedes (an op's
    # instances share theirs, and a graph has few), then per unit: the row of "any" last
    width = chain_s / _START_SLICES
    sets = np.zeros(max_sets, dtype=np.int64)
    by_set = np.zeros((max_sets, num_devices, _START_SLICES))
    busy = np.zeros((num_units + 1, num_devices, _START_SLICES))
    num_sets, last, k = 0, np.int64(0), -1
    for i in range(len(inst_device)):
        bits = before[i]
        if bits == 0:
            continue
        d = inst_device[i]
        b = 0
        if width > 0.0:
            b = min(int((finish[i] - seconds[i]) / width), _START_SLICES - 1)
        if bits != last:
            last, k = bits, -1
            for j in range(num_sets):
                if sets[j] == bits:
                    k = j
                    break
            if k < 0 and num_sets < max_sets:
                k, num_sets = num_sets, num_sets + 1
                sets[k] = bits
        if k >= 0:
            by_set[k, d, b] += seconds[i]
            continue
        busy[num_units, d, b] += seconds[i]  # past max_sets sets: unit by unit
        for u in range(num_units):
            if (bits >> u) & 1:
                busy[u, d, b] += seconds[i]
    for k in range(num_sets):
        busy[num_units] += by_set[k]
        for u in range(num_units):
            if (sets[k] >> u) & 1:
                busy[u] += by_set[k]
    serial = np.zeros(num_units + 1)
    for u in range(num_units + 1):
        for d in range(num_devices):
            after = 0.0
            for b in range(_START_SLICES - 1, -1, -1):
                after += busy[u, d, b]
                if after > 0.0:  # work starts at or after the slice's first time
                    serial[u] = max(serial[u], b * width + after)
    return serial[:num_units], serial[num_units]


@njit(cache=True)
def released(made: np.ndarray, busy_s: np.ndarray) -> float:
    """:func:`after_release_s` for a few pieces of work, without sorting them."""
    latest = 0.0
    for k in range(len(made)):
        after = 0.0
        for j in range(len(made)):
            if made[j] >= made[k]:
                after += busy_s[j]
        latest = max(latest, made[k] + after)
    return latest
