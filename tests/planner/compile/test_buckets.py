"""Tensor fusion across op groups on hand-made lists of gradient AllReduces."""

from __future__ import annotations

from tagplan.planner.compile.buckets import GradientAllReduce, gradient_buckets
from tagplan.planner.strategy import Collective, GradientSync, GroupDecision, Option

MIB = 2**20


def decision(**update) -> GroupDecision:
    return GroupDecision(
        device_groups=[0],
        option=Option.REPLICATE_ALLREDUCE,
        gradient_sync=GradientSync.BUCKETED,
        **update,
    )


def allreduce(group: int, nbytes: int, members: tuple[int, ...] = (0, 1)) -> GradientAllReduce:
    return GradientAllReduce(group=group, members=members, nbytes=nbytes)


def contents(buckets) -> list[tuple[int, ...]]:
    return [b.collectives for b in buckets]


class TestGradientBuckets:
    def test_nothing_to_fuse(self) -> None:
        assert gradient_buckets([], [decision()]) == []

    def test_groups_over_the_same_gpus_share_a_bucket(self) -> None:
        buckets = gradient_buckets(
            [allreduce(0, 3 * MIB), allreduce(1, 5 * MIB), allreduce(0, 1 * MIB)],
            [decision(), decision()],
        )
        assert contents(buckets) == [(0, 1, 2)]
        (bucket,) = buckets
        assert bucket.nbytes == 9 * MIB and bucket.groups == (0, 1)
        assert bucket.members == (0, 1) and bucket.algorithm == Collective.AUTO

    def test_groups_over_different_gpus_do_not(self) -> None:
        buckets = gradient_buckets(
            [allreduce(0, 10, (0, 1)), allreduce(1, 10, (2, 3)), allreduce(0, 10, (0, 1))],
            [decision(), decision()],
        )
        assert contents(buckets) == [(0, 2), (1,)]
        assert [b.members for b in buckets] == [(0, 1), (2, 3)]

    def test_nor_groups_with_different_algorithms(self) -> None:
        ring, hierarchical = (
            decision(collective=Collective.RING),
            decision(collective=Collective.HIERARCHICAL),
        )
        buckets = gradient_buckets([allreduce(0, 10), allreduce(1, 10)], [ring, hierarchical])
        assert contents(buckets) == [(0,), (1,)]
        assert [b.algorithm for b in buckets] == [Collective.RING, Collective.HIERARCHICAL]

    def test_a_bucket_closes_once_it_holds_bucket_bytes(self) -> None:
        """The bucket that reaches the cap closes with its last gradient; the next opens
        a new one (a gradient larger than the cap is a bucket of its own)."""
        small = decision(bucket_bytes=100)
        sizes = [40, 40, 30, 250, 10, 60, 50]
        buckets = gradient_buckets([allreduce(k % 2, n) for k, n in enumerate(sizes)], [small] * 2)
        assert contents(buckets) == [(0, 1, 2), (3,), (4, 5, 6)]
        assert [b.nbytes for b in buckets] == [110, 250, 120]

    def test_the_smallest_bucket_bytes_of_the_groups_in_it_applies(self) -> None:
        large, small = decision(bucket_bytes=1000), decision(bucket_bytes=100)
        buckets = gradient_buckets(
            [allreduce(0, 60), allreduce(0, 60), allreduce(1, 60), allreduce(0, 60)],
            [large, small],
        )
        # group 0 alone would wait for 1000 bytes; group 1 joins and the cap is 100
        assert contents(buckets) == [(0, 1, 2), (3,)]

    def test_only_bucketed_groups_are_fused(self) -> None:
        after = GroupDecision(
            device_groups=[0],
            option=Option.REPLICATE_ALLREDUCE,
            gradient_sync=GradientSync.AFTER_BACKWARD,
        )
        overlap = GroupDecision(device_groups=[0], option=Option.REPLICATE_ALLREDUCE)
        buckets = gradient_buckets(
            [allreduce(0, 10), allreduce(1, 10), allreduce(2, 10), allreduce(1, 10)],
            [after, decision(), overlap],
        )
        assert contents(buckets) == [(1, 3)]

    def test_one_group_is_the_per_group_rule(self) -> None:
        """Consecutive buckets in emission order, each closed when it reaches the cap."""
        sizes = [7, 1, 1, 9, 2, 2, 2, 2, 5]
        buckets = gradient_buckets([allreduce(0, n) for n in sizes], [decision(bucket_bytes=8)])
        expected, bucket, total = [], [], 0
        for position, nbytes in enumerate(sizes):  # the rule as the compilers had it per group
            if bucket and total >= 8:
                expected.append(tuple(bucket))
                bucket, total = [], 0
            bucket.append(position)
            total += nbytes
        expected.append(tuple(bucket))
        assert contents(buckets) == expected == [(0, 1), (2, 3), (4, 5, 6, 7), (8,)]

    def test_buckets_are_ordered_by_their_first_allreduce(self) -> None:
        buckets = gradient_buckets(
            [allreduce(0, 10, (2, 3)), allreduce(0, 10, (0, 1)), allreduce(0, 200, (0, 1))],
            [decision(bucket_bytes=100)],
        )
        assert contents(buckets) == [(0,), (1, 2)]
