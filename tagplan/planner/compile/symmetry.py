"""Symmetry classes: GPUs a strategy treats alike, compiled and simulated once.

A search's strategies choose *device groups* (the GPUs of one type on one machine), and
replicas inside a group get equal shares of the batch, so most GPUs of a group run the
same op instances on the same number of rows, send the same bytes over the same kinds of
link and hold the same memory. :func:`symmetry_classes` partitions every device group
into classes of consecutive GPUs whose instances are alike (the same ops, the same local
batch); a GPU singled out by the strategy — the first GPU of a group's placement, which
runs its ops that need the whole batch, a parameter server, a model-parallel placement,
a different share — is a class of its own. The *quotient placement* keeps one instance
per class on its first GPU, the representative, covering the class's rows.

The task compiler (:mod:`.task_compiler`) compiles the quotient placement with each
representative standing for its class's ``m`` members: a compute task for ``m`` tasks of
equal duration on ``m`` GPUs; a transfer for the transfers of all members, whose share of
each link is multiplied by the flows that cross one instance of it (``m`` flows into a
parameter server's port, ``m`` flows over a machine's uplink); a collective with its time
and links over every member; a buffer for each member's. **Why the result equals the
per-GPU simulation**: the per-GPU task graph is invariant under permuting the members of
a class, so members' tasks become ready together and run the same durations; the
simulator's max-min fair link sharing gives flows that cross the same links at the same
share the same speed, and ``k`` equal flows on a link load it exactly as one flow with
``k`` times the share (:mod:`~tagplan.planner.sim.engine` already counts flows of one
route so), so every member's tasks start and finish when the representative's do, and each
member's memory follows the representative's. Step time, per-GPU peak memory and OOM are
equal (up to the order of floating-point sums).

The invariance holds for the compiler's rules only while no rule singles out one member:
a whole copy or a replica's own value (a shape, a batch statistic) held by every member
of a class and fetched from its first (the copy the closest rule picks), a hub that is a
member of a class, a class gathering slices whose first member would then hand the whole
tensor to the rest, replicas reading rows laid out differently (a hub that is no
member, a GPU holding a whole tensor a class reads rows of, cuts every member's rows in
one ``Split``, so they arrive alike). The compiler raises :class:`Asymmetric` there,
naming the classes, and the compile splits them into single GPUs (:func:`split_classes`)
and tries again, until it compiles or the classes would keep too many instances to be
worth it; then the strategy is compiled per GPU, which stays the reference
(``by_class=False``). Two cases are seen in the quotient placement before
compiling (:func:`refined_for_reads`): replicas reading rows laid out differently (an op
group on other device groups than its producer's, :func:`classes_reading_across_layouts`),
and a class whose split instance covers the whole batch where the same tensor is also
held whole (:func:`classes_holding_rows_as_whole`: the class's piece and the whole copy
would pass for each other, where per GPU each member cuts or gathers its own rows). The
classes they touch become single GPUs, each gathering or cutting its own pieces as per
GPU; the classes no such rule touches are still compiled once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from tagplan.planner.compile.placement import Placement
from tagplan.planner.csr import row_ranges
from tagplan.planner.strategy import Mode
from tagplan.planner.topology import Cluster

__all__ = [
    "Asymmetric",
    "Symmetry",
    "classes_holding_rows_as_whole",
    "classes_reading_across_layouts",
    "refined_for_reads",
    "split_classes",
    "symmetry_classes",
]


class Asymmetric(Exception):
    """A compile rule singles out one member of the classes of ``devices`` (their
    representatives): compile with those classes split (:func:`split_classes`), or per
    GPU."""

    def __init__(self, rule: str, devices: tuple[int, ...]) -> None:
        super().__init__(rule)
        self.devices = devices


@dataclass(frozen=True, eq=False)
class Symmetry:
    """The classes of one placement: ``representative[d]`` is the first GPU of ``d``'s
    class, ``members[r]`` the size of the class a representative ``r`` stands for (1 for
    every other GPU), and ``placement`` the quotient placement."""

    representative: np.ndarray  # int32 per device
    members: np.ndarray  # int32 per device
    placement: Placement

    def expand(self, devices: tuple[int, ...] | list[int]) -> tuple[int, ...]:
        """Every GPU of the classes of ``devices`` (representatives), in device order."""
        wanted = np.isin(self.representative, np.asarray(devices, dtype=np.int32))
        return tuple(np.flatnonzero(wanted).tolist())

    def per_device(self, values: np.ndarray) -> np.ndarray:
        """A per-device array of the quotient simulation, each GPU taking its
        representative's value."""
        return values[self.representative]


def _mixed(key: np.ndarray) -> np.ndarray:
    """splitmix64 of each key: a well-mixed hash, so that a sum of them hashes a multiset."""
    key = (key + np.uint64(0x9E3779B97F4A7C15)) * np.uint64(0xBF58476D1CE4E5B9)
    key ^= key >> np.uint64(27)
    key *= np.uint64(0x94D049BB133111EB)
    key ^= key >> np.uint64(31)
    return key


def _device_signatures(placement: Placement, num_devices: int) -> np.ndarray:
    """A 64-bit hash per device of the multiset of (op, local batch) instances on it."""
    counts = np.diff(placement.inst_ptr)
    op_of = np.repeat(np.arange(len(counts), dtype=np.uint64), counts)
    rows = (placement.inst_hi - placement.inst_lo).astype(np.uint64)
    key = _mixed(op_of * np.uint64(1_000_003) + rows)
    signature = np.zeros(num_devices, dtype=np.uint64)
    np.add.at(signature, placement.inst_device, key)
    return signature


def classes_reading_across_layouts(
    symmetry: Symmetry, producer: np.ndarray, reader: np.ndarray
) -> set[int]:
    """The representatives of the classes of several GPUs that read, or hold pieces
    read as, rows of a split producer's batch tensor (``producer[i]`` -> ``reader[i]``,
    both split) that no piece of it holds as they are, or that only a class of another
    size holds (its members' pieces are halves, thirds... of what each reader reads, or
    the reverse): the rule that gathers or cuts pieces of another layout singles out
    their members (:class:`Asymmetric`).

    Checked on the quotient placement before compiling, so that a strategy whose compile
    by class would stop there is refined first (:func:`refined_for_reads`) rather than
    after a partial compile (the search's neighbouring strategies mostly are such: an op
    group on other device groups than its producer's)."""
    quotient, members = symmetry.placement, symmetry.members
    ptr = quotient.inst_ptr
    device, lo, hi = quotient.inst_device, quotient.inst_lo, quotient.inst_hi
    split = quotient.op_mode == Mode.SPLIT
    batch = np.uint64(quotient.batch_size + 1)
    rows = (device.astype(np.uint64) * batch + lo.astype(np.uint64)) * batch
    key = _mixed(rows + hi.astype(np.uint64))
    op_rows = np.add.reduceat(key, ptr[:-1]) if len(key) else np.zeros(0, dtype=np.uint64)
    differ = split[producer] & split[reader] & (op_rows[producer] != op_rows[reader])
    found: set[int] = set()
    seen: set[tuple[int, int]] = set()
    for p, r in zip(producer[differ].tolist(), reader[differ].tolist(), strict=True):
        layouts = (int(op_rows[p]), int(op_rows[r]))
        if layouts in seen:  # the same two layouts read each other alike
            continue
        seen.add(layouts)
        pieces = range(ptr[p], ptr[p + 1])
        held = {(int(lo[i]), int(hi[i])): int(members[device[i]]) for i in pieces}
        for i in range(ptr[r], ptr[r + 1]):
            if held.get((int(lo[i]), int(hi[i]))) == members[device[i]]:
                continue  # held as read, member by member
            covering = [j for j in pieces if lo[j] < hi[i] and hi[j] > lo[i]]
            found |= {int(device[k]) for k in (i, *covering) if members[device[k]] > 1}
    return found


def classes_holding_rows_as_whole(
    symmetry: Symmetry, access_op: np.ndarray, access_tensor: np.ndarray
) -> set[int]:
    """The representatives of the classes of several GPUs on which one batch tensor is
    both held whole (made or read by an op that is not split) and held or read by rows
    as a split op whose instance there covers the whole batch (``access_op[i]`` makes or
    reads ``access_tensor[i]``). Compiled by class, that instance's rows are the whole
    batch, so the whole copy and the class's piece would pass for each other, where per
    GPU every member cuts its own rows from the whole or gathers the whole from the
    members' pieces: such a class is split (:func:`refined_for_reads`)."""
    quotient, members = symmetry.placement, symmetry.members
    instances, counts = row_ranges(quotient.inst_ptr, access_op)
    device = quotient.inst_device[instances]
    split = (quotient.op_mode == Mode.SPLIT)[np.repeat(access_op, counts)]
    covering = (
        split
        & (quotient.inst_lo[instances] == 0)
        & (quotient.inst_hi[instances] == quotient.batch_size)
    )
    shared = members[device] > 1
    num_devices = np.int64(len(members))
    key = np.repeat(access_tensor.astype(np.int64), counts) * num_devices + device
    both = np.intersect1d(key[shared & covering], key[shared & ~split])
    return set((both % num_devices).tolist())


def refined_for_reads(
    symmetry: Symmetry,
    placement: Placement,
    producer: np.ndarray,
    reader: np.ndarray,
    access: tuple[np.ndarray, np.ndarray],
    *,
    most_instances: int,
) -> Symmetry | None:
    """``symmetry`` with every class that reads, or holds pieces read as, rows laid out
    otherwise (:func:`classes_reading_across_layouts`), or holds a batch tensor's rows as
    its whole (:func:`classes_holding_rows_as_whole`, ``access``: its ops and tensors)
    split into single GPUs, again until none does; ``None`` when the classes left would
    keep more than ``most_instances`` of the placement's instances (splitting only adds
    instances: a compile by class then costs what one per GPU does) or no class of
    several GPUs is left. Single GPUs gather or cut their pieces as the per-GPU compile
    does (:func:`split_classes`); the classes no such read touches (other machines, other
    op groups' device groups) are still compiled once."""
    if symmetry.placement.num_instances > most_instances:
        return None
    while symmetry is not None and (
        split := classes_reading_across_layouts(symmetry, producer, reader)
        | classes_holding_rows_as_whole(symmetry, *access)
    ):
        symmetry = split_classes(symmetry, placement, split, most_instances=most_instances)
    return symmetry


def split_classes(
    symmetry: Symmetry, placement: Placement, devices: Iterable[int], *, most_instances: int
) -> Symmetry | None:
    """``symmetry`` with the classes of ``devices`` (representatives) split into single
    GPUs; ``None`` when the classes left would keep more than ``most_instances`` of the
    placement's instances or none of several GPUs is left. A finer partition keeps the
    invariance of the module docstring: a permutation inside a smaller class is one inside
    the larger, and a single GPU is compiled as per GPU."""
    representative = symmetry.representative.copy()
    wanted = np.fromiter(devices, dtype=np.int32)
    alone = np.isin(representative, wanted)
    representative[alone] = np.flatnonzero(alone)
    # the quotient keeps the instances on the representatives: count them before making it
    on_device = np.bincount(placement.inst_device, minlength=len(representative))
    if on_device[representative == np.arange(len(representative))].sum() > most_instances:
        return None
    members = np.bincount(representative, minlength=len(representative)).astype(np.int32)
    if members.max() < 2:
        return None
    quotient = _quotient_placement(placement, representative, members)
    return None if quotient is None else Symmetry(representative, members, quotient)


def symmetry_classes(placement: Placement, cluster: Cluster) -> Symmetry | None:
    """The classes of ``placement`` and its quotient placement (module docstring), or
    ``None`` when no class has two GPUs or an op's instances do not cover a class as one
    contiguous run of rows."""
    num_devices = cluster.num_devices
    signature = _device_signatures(placement, num_devices)
    representative = np.arange(num_devices, dtype=np.int32)
    group_of = cluster.group_of_device
    for d in range(1, num_devices):
        if group_of[d] == group_of[d - 1] and signature[d] == signature[d - 1]:
            representative[d] = representative[d - 1]
    members = np.bincount(representative, minlength=num_devices).astype(np.int32)
    if members.max() < 2:
        return None
    quotient = _quotient_placement(placement, representative, members)
    if quotient is None:
        return None
    return Symmetry(representative, members, quotient)


def _quotient_placement(
    placement: Placement, representative: np.ndarray, members: np.ndarray
) -> Placement | None:
    """One instance per class on its representative: a split op's over the class's rows
    (its members' runs, consecutive and of equal length), any other op's over the whole
    batch. ``None`` when some op's instances do not fit that shape."""
    device, lo, hi = placement.inst_device, placement.inst_lo, placement.inst_hi
    rep = representative[device]
    keep = device == rep
    # every member of a class holds the same instances (equal signatures), so each op
    # has one run of instances per class, starting at the representative
    ptr = placement.inst_ptr.astype(np.int64)
    op_of = np.repeat(np.arange(len(ptr) - 1), np.diff(ptr))
    same_op = op_of[1:] == op_of[:-1]
    if (np.diff(device)[same_op] <= 0).any():  # two replicas of an op on one GPU
        return None
    size = members[rep]
    split = placement.op_mode[op_of] == Mode.SPLIT
    run_end = np.flatnonzero(keep) + size[keep] - 1  # last instance of each run
    if (run_end >= len(device)).any():
        return None
    kept_lo, kept_hi = lo[keep], hi[keep].copy()
    run_split = split[keep]
    last_hi = hi[run_end]
    same_run = (rep[run_end] == rep[keep]) & (op_of[run_end] == op_of[keep])
    rows = kept_hi - kept_lo
    if (
        not same_run.all()
        or not (np.where(run_split, last_hi - kept_lo == rows * size[keep], True)).all()
    ):
        return None
    kept_hi = np.where(run_split, last_hi, kept_hi)
    new_ptr = np.zeros(len(ptr), dtype=np.int32)
    new_ptr[1:] = np.cumsum(np.bincount(op_of[keep], minlength=len(ptr) - 1))
    return Placement(
        op_mode=placement.op_mode,
        inst_ptr=new_ptr,
        inst_device=np.ascontiguousarray(device[keep]),
        inst_lo=np.ascontiguousarray(kept_lo),
        inst_hi=np.ascontiguousarray(kept_hi.astype(np.int32)),
        batch_size=placement.batch_size,
    )
