"""Horovod's tensor fusion across op groups: which gradient AllReduces share a bucket.

Both back ends (:mod:`.tasks`, :mod:`.graphdef`) list a step's gradient AllReduces in the
order they emit them, which is the order the gradients become ready (backward order), and
call :func:`gradient_buckets`; each then turns a bucket into its own form (one fused
AllReduce time behind a barrier, a ``NoOp`` barrier in front of the AllReduce nodes), so
the simulated and the executed graph fuse the same gradients.

The rule: the AllReduces of ``bucketed`` groups that reduce over the same GPUs with the
same algorithm fill one open bucket, whatever their op group; a bucket closes once it
holds at least the smallest ``bucket_bytes`` of the groups whose gradients it holds (so no
group's gradients wait in a bucket much larger than the group asked for: a bucket
overshoots by its last gradient at most), and the next such AllReduce opens a new one.
A bucket starts when its last gradient is ready. With a single op group this is the
per-group rule: one bucket after another, in backward order.

>>> from tagplan.planner.strategy import GradientSync, GroupDecision, Option
>>> fused = GroupDecision(
...     device_groups=[0], option=Option.REPLICATE_ALLREDUCE,
...     gradient_sync=GradientSync.BUCKETED, bucket_bytes=100,
... )
>>> allreduces = [
...     GradientAllReduce(group=0, members=(0, 1), nbytes=60),
...     GradientAllReduce(group=1, members=(0, 1), nbytes=60),
...     GradientAllReduce(group=1, members=(2, 3), nbytes=10),
...     GradientAllReduce(group=0, members=(0, 1), nbytes=10),
... ]
>>> [(b.collectives, b.nbytes) for b in gradient_buckets(allreduces, [fused, fused])]
[((0, 1), 120), ((2,), 10), ((3,), 10)]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from tagplan.planner.strategy import Collective, GradientSync, GroupDecision

__all__ = ["Bucket", "GradientAllReduce", "gradient_buckets"]


class GradientAllReduce(NamedTuple):
    """One gradient's AllReduce as a back end emits it.

    ``group`` is the op group whose decision syncs the gradient (the group of the op
    reading the sum); ``members`` are the GPUs it reduces over, in ascending order.
    """

    group: int
    members: tuple[int, ...]
    nbytes: int


class Bucket(NamedTuple):
    """AllReduces fused into one: ``collectives`` are positions in the list given to
    :func:`gradient_buckets`, ascending; ``groups`` the op groups they belong to, in order
    of first appearance."""

    collectives: tuple[int, ...]
    members: tuple[int, ...]
    algorithm: Collective
    nbytes: int
    groups: tuple[int, ...]


class _Open:
    """A bucket being filled."""

    def __init__(self) -> None:
        self.collectives: list[int] = []
        self.groups: list[int] = []
        self.nbytes = 0
        self.cap = 0

    def add(self, position: int, group: int, nbytes: int, cap: int) -> None:
        self.collectives.append(position)
        if group not in self.groups:
            self.groups.append(group)
        self.nbytes += nbytes
        self.cap = cap if len(self.collectives) == 1 else min(self.cap, cap)

    def close(self, members: tuple[int, ...], algorithm: Collective) -> Bucket:
        return Bucket(tuple(self.collectives), members, algorithm, self.nbytes, tuple(self.groups))


def gradient_buckets(
    allreduces: Sequence[GradientAllReduce], decisions: Sequence[GroupDecision]
) -> list[Bucket]:
    """The buckets of the module docstring's rule, ordered by their first AllReduce.

    ``allreduces`` are in emission (backward) order; ``decisions[g]`` is op group ``g``'s
    decision. AllReduces of groups whose sync is not ``bucketed`` are in no bucket.
    """
    buckets: list[Bucket] = []
    filling: dict[tuple[tuple[int, ...], Collective], _Open] = {}
    for position, allreduce in enumerate(allreduces):
        decision = decisions[allreduce.group]
        if decision.gradient_sync != GradientSync.BUCKETED:
            continue
        key = (allreduce.members, decision.collective)
        bucket = filling.setdefault(key, _Open())
        bucket.add(position, allreduce.group, allreduce.nbytes, decision.bucket_bytes)
        if bucket.nbytes >= bucket.cap:
            buckets.append(bucket.close(*key))
            del filling[key]
    buckets.extend(bucket.close(*key) for key, bucket in filling.items())
    return sorted(buckets, key=lambda b: b.collectives[0])
