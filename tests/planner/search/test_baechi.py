"""Baechi's m-TOPO, m-ETF and m-SCT (Baechi §2) as model-parallel baselines."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
import pytest

from tagplan.planner.cost.memory import FRAMEWORK_RESERVE_BYTES
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baechi import (
    OpGraph,
    favourite_children,
    m_etf,
    m_sct,
    m_topo,
    sct_schedule,
)
from tagplan.planner.search.grouping import atoms_of
from tagplan.planner.strategy import resolve
from tagplan.planner.topology import load_cluster


@cache
def zoo(name: str):
    source = load_graph_source(f"zoo:{name}")
    return analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)


def placed_devices(strategy, ir, cluster) -> np.ndarray:
    return resolve(strategy, ir, cluster).op_device


def small_gpus(memory_gib: float, count: int = 4):
    return load_cluster(
        {
            "gpu_types": [
                {
                    "name": "SMALL",
                    "fp32_tflops": 10,
                    "memory_bandwidth_gb_per_s": 500,
                    "memory_gib": memory_gib,
                }
            ],
            "machines": [
                {
                    "name": "m",
                    "gpus": {"type": "SMALL", "count": count},
                    "intra_bandwidth_gbps": 100,
                }
            ],
        }
    )


@pytest.mark.parametrize("placer", [m_topo, m_etf, m_sct])
def test_units_stay_together_and_every_op_is_placed(placer) -> None:
    ir = zoo("resnet101")
    cluster = load_cluster("testbed")
    devices = placed_devices(placer(ir, cluster, OpCostModel(ir, cluster)), ir, cluster)
    assert (devices >= 0).all()
    units = atoms_of(ir)
    for unit in np.unique(units)[:200]:
        assert len(np.unique(devices[units == unit])) == 1


def test_m_topo_fills_gpus_in_order_within_their_memory() -> None:
    ir = zoo("vgg19")
    cluster = small_gpus(memory_gib=16)
    devices = placed_devices(m_topo(ir, cluster, OpCostModel(ir, cluster)), ir, cluster)
    first = [int(np.flatnonzero(devices == d)[0]) for d in np.unique(devices)]
    assert first == sorted(first)  # device ids increase along the topological order
    assert len(np.unique(devices)) > 1  # VGG19's tensors at batch 96 need several GPUs


def _two_machines(first: str, second: str) -> dict:
    return {
        "machines": [
            {"name": "a", "gpus": {"type": first, "count": 1}, "intra_bandwidth_gbps": 100},
            {"name": "b", "gpus": {"type": second, "count": 1}, "intra_bandwidth_gbps": 100},
        ],
        "network": {"bandwidth_gbps": 10},
    }


@pytest.mark.parametrize("placer", [m_etf, m_sct])
def test_a_mixed_allocation_is_seen_as_baechi_profiles_it(placer) -> None:
    """Baechi profiles ops on one GPU and transfers between one pair (§4.1): on a T4 and a
    V100 its placers place as on two T4s over the same 10 Gbps link."""
    ir = zoo("small_cnn")
    mixed = load_cluster(_two_machines("T4", "V100-32GB"))
    equal = load_cluster(_two_machines("T4", "T4"))
    placed = [
        placed_devices(placer(ir, cluster, OpCostModel(ir, cluster)), ir, cluster)
        for cluster in (mixed, equal)
    ]
    np.testing.assert_array_equal(placed[0], placed[1])


@pytest.mark.parametrize("placer", [m_etf, m_sct])
def test_spreads_and_the_plan_fits_in_memory(placer) -> None:
    """Baechi's memory estimate (§4.2: variables for the step, outputs until read) keeps
    the placement within every GPU, as the simulator confirms."""
    ir = zoo("vgg19")
    cluster = small_gpus(memory_gib=(548 * 4 / 2**10) + FRAMEWORK_RESERVE_BYTES / 2**30 + 6)
    evaluator = Evaluator(ir, cluster)
    strategy = placer(ir, cluster, evaluator.costs)
    devices = placed_devices(strategy, ir, cluster)
    assert len(np.unique(devices)) > 1
    result = evaluator.evaluate(strategy).result
    assert not result.oom and result.step_time_s > 0


class TestFavouriteChildren:
    """SCT's LP (Baechi §2.4, eq. 2) on graphs small enough to solve by hand."""

    def test_fork_favours_the_longer_branch(self) -> None:
        """a -> b, a -> c with p = (1, 1, 3), c = 1: keeping c local gives w = 4
        (b still fits: 1 + 1 + 1 < 4); keeping b local gives w = 1 + 1 + 3 = 5."""
        edges = np.array([0, 0]), np.array([1, 2])
        favourite = favourite_children(3, *edges, np.array([1.0, 1.0, 3.0]), np.ones(2))
        assert favourite.tolist() == [2, -1, -1]
        favourite = favourite_children(3, *edges, np.array([1.0, 3.0, 1.0]), np.ones(2))
        assert favourite.tolist() == [1, -1, -1]

    def test_join_has_one_favourite_parent(self) -> None:
        """a -> c, b -> c with p = (1, 2, 1), c = 1: c can be local to one parent only; the
        slower parent b wins (w = 3; favouring a would give 2 + 1 + 1 = 4)."""
        favourite = favourite_children(
            3, np.array([0, 1]), np.array([2, 2]), np.array([1.0, 2.0, 1.0]), np.ones(2)
        )
        assert favourite.tolist() == [-1, 2, -1]

    def test_ineligible_edges_are_never_favourites(self) -> None:
        favourite = favourite_children(
            3,
            np.array([0, 0]),
            np.array([1, 2]),
            np.array([1.0, 1.0, 3.0]),
            np.ones(2),
            eligible=np.array([True, False]),
        )
        assert favourite[0] != 2

    def test_no_edges(self) -> None:
        assert favourite_children(
            2, np.array([]), np.array([]), np.ones(2), np.array([])
        ).tolist() == [-1, -1]


def schedule(
    times: Sequence[Sequence[float]],
    edges: Sequence[tuple[int, int, float]],
    *,
    favourite: list[int] | None = None,
    units: list[int] | None = None,
    capacity: tuple[float, float] = (10.0, 10.0),
) -> list[int]:
    """Two GPUs, a transfer of ``b`` bytes taking ``b`` seconds, one byte of variables per
    unit and no outputs held."""
    num_ops = len(times[0])
    src, dst, nbytes = (np.array(column) for column in zip(*edges, strict=True))
    unit_of = np.arange(num_ops) if units is None else np.array(units)
    return sct_schedule(
        np.array(times),
        OpGraph.from_edges(num_ops, src, dst, nbytes),
        latency_s=np.zeros((2, 2)),
        bandwidth_bytes_per_s=np.ones((2, 2)),
        units=unit_of,
        unit_bytes=np.ones(unit_of.max() + 1),
        output_bytes=np.zeros(num_ops),
        capacity=np.array(capacity),
        favourite=None if favourite is None else np.array(favourite),
    ).tolist()


class TestByHand:
    """Five ops on two equal GPUs: a (2 s) feeds b (3 s), c (1 s) and f (1 s); e (1 s)
    reads b and c. Transfers: a->b 1 s, a->c 2 s, a->f 0.5 s, b->e 1 s, c->e 1 s.
    Priority (Kahn's breadth-first order): a, b, c, f, e."""

    TIMES = ((2.0, 3.0, 1.0, 1.0, 1.0),) * 2
    EDGES = ((0, 1, 1.0), (0, 2, 2.0), (0, 3, 0.5), (1, 4, 1.0), (2, 4, 1.0))

    def test_m_etf(self) -> None:
        """t=0: a on GPU 0 (both free; the lowest id), to 2.
        t=2: b, c, f can start on GPU 0 at 2; b first by priority, to 5. On GPU 1 c's
        data would arrive at 4 and f's at 2.5.
        t=2.5: f on GPU 1 (the earliest start of any pair, though c ranks higher); its
        input crosses over [2, 2.5], holding both queues to 2.5. f runs to 3.5.
        c's input now queues behind f's: on GPU 1 over [2.5, 4.5] (4 without the
        queues), on GPU 0 at 5 when b ends; t=4.5: c on GPU 1, to 5.5; queues at 4.5.
        t=5.5: e may start on GPU 1 at max(5.5, b's output 5 + 1) = 6, on GPU 0 at
        c's output 5.5 + 1 = 6.5; t=6: e on GPU 1, to 7."""
        assert schedule(self.TIMES, self.EDGES) == [0, 0, 1, 1, 1]

    def test_m_sct_lp(self) -> None:
        """Paths a-b-e and a-c-e give w >= 6 + (1 - y_ab) + (1 - y_be) and
        w >= 4 + 2 (1 - y_ac) + (1 - y_ce), with y_ab + y_ac <= 1 and y_be + y_ce <= 1
        (y = 1 - x: the edge kept on one GPU). The optimum, w = 19/3, has y_be = 1,
        y_ab = 2/3 and y_ac = 1/3: only b -> e is kept (y > 0.9), e is b's favourite."""
        src, dst, comm = (np.array(column) for column in zip(*self.EDGES, strict=True))
        favourite = favourite_children(5, src, dst, np.array(self.TIMES[0]), comm)
        assert favourite.tolist() == [-1, 4, -1, -1, -1]
        # SCT with that favourite: e's data reaches GPU 0 at 6.5, GPU 1 at 6, so GPU 0
        # is not awake for it and the schedule is m-ETF's
        assert schedule(self.TIMES, self.EDGES, favourite=favourite.tolist()) == [0, 0, 1, 1, 1]

    def test_m_sct_keeps_a_favourite_child_on_its_parents_gpu(self) -> None:
        """With c as a's favourite child: t=2: GPU 0 is awake for c (it starts there at
        2, on GPU 1 at 4) and no op is urgent (b could start on GPU 1 only at 3), so c
        runs on GPU 0 over [2, 3]. t=2.5: f on GPU 1 as before. t=3: b on GPU 0 (its
        data is there), to 6. t=6: e on GPU 0 at 6 (its inputs are local; GPU 1 would
        wait for b's output until 7), to 7."""
        favourite = [2, -1, -1, -1, -1]
        assert schedule(self.TIMES, self.EDGES, favourite=favourite) == [0, 0, 0, 1, 0]


class TestSctSchedule:
    """a -> b, a -> c on two equal GPUs: p = (1, 1, 3) s, each edge 0.5 s across GPUs."""

    FORK = ((0, 1, 0.5), (0, 2, 0.5))

    def test_favourite_child_stays_on_its_parents_gpu(self) -> None:
        """a runs on GPU 0 over [0, 1]; GPU 0 is awake for a's favourite child, which runs
        there at once; the other child waits 0.5 s for its input on GPU 1."""
        times = [[1.0, 1.0, 3.0]] * 2
        assert schedule(times, self.FORK, favourite=[2, -1, -1]) == [0, 1, 0]
        assert schedule(times, self.FORK, favourite=[1, -1, -1]) == [0, 0, 1]

    def test_memory_limit_moves_the_favourite_child(self) -> None:
        """GPU 0 holds a's unit alone: m-SCT excludes it, so both children go to GPU 1."""
        times = [[1.0, 1.0, 3.0]] * 2
        assert schedule(times, self.FORK, favourite=[2, -1, -1], capacity=(1, 10)) == [0, 1, 1]

    def test_m_etf_excludes_a_full_gpu(self) -> None:
        """Without favourites too: once a's unit fills GPU 0, b and c wait for GPU 1."""
        times = ((1.0, 1.0, 3.0),) * 2
        assert schedule(times, self.FORK, capacity=(1, 10)) == [0, 1, 1]

    def test_a_chain_stays_on_the_faster_gpu(self) -> None:
        """GPU 1 is twice as fast; a -> b -> c: a finishes first there, and each next op
        starts there as early as anywhere."""
        chain = ((0, 1, 0.5), (1, 2, 0.5))
        assert schedule([[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]], chain) == [1, 1, 1]

    def test_units_move_together(self) -> None:
        """b shares a's unit: it runs on a's GPU even though c is the favourite."""
        devices = schedule([[1.0] * 3] * 2, self.FORK, favourite=[2, -1, -1], units=[0, 0, 1])
        assert devices[0] == devices[1]
