"""Baechi's m-TOPO, m-ETF and m-SCT (Baechi §2) as model-parallel baselines."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from tagplan.planner.cost.memory import FRAMEWORK_RESERVE_BYTES
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baechi import (
    _capacity,
    _unit_memory,
    favourite_children,
    m_etf,
    m_sct,
    m_topo,
    sct_schedule,
)
from tagplan.planner.search.grouping import atoms_of
from tagplan.planner.strategy import resolve
from tagplan.planner.topology import load_cluster
from tests.planner.graph.builders import dense_graph, graph_def


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


def test_m_etf_keeps_a_chain_on_the_fastest_gpu() -> None:
    """With no parallelism to gain, every transfer only costs: one GPU, the fastest."""
    ir = analyze(graph_def(dense_graph()))
    cluster = load_cluster(
        {
            "machines": [
                {"name": "a", "gpus": {"type": "T4", "count": 1}, "intra_bandwidth_gbps": 100},
                {
                    "name": "b",
                    "gpus": {"type": "V100-32GB", "count": 1},
                    "intra_bandwidth_gbps": 100,
                },
            ],
            "network": {"bandwidth_gbps": 10},
        }
    )
    costs = OpCostModel(ir, cluster)
    devices = placed_devices(m_etf(ir, cluster, costs), ir, cluster)
    assert set(devices.tolist()) == {1}


@pytest.mark.parametrize("placer", [m_etf, m_sct])
def test_spreads_when_memory_runs_out_and_the_plan_fits(placer) -> None:
    ir = zoo("vgg19")
    cluster = small_gpus(memory_gib=(548 * 4 / 2**10) + FRAMEWORK_RESERVE_BYTES / 2**30 + 6)
    evaluator = Evaluator(ir, cluster)
    strategy = placer(ir, cluster, evaluator.costs)
    devices = placed_devices(strategy, ir, cluster)
    assert len(np.unique(devices)) > 1
    # what Baechi charges per unit stays within every GPU's memory, and the simulator agrees
    units = atoms_of(ir)
    memory = _unit_memory(ir, units)
    first = np.unique(units, return_index=True)[1]
    used = np.bincount(devices[first], weights=memory, minlength=cluster.num_devices)
    assert (used <= _capacity(cluster)).all()
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


def fork_schedule(favourite: list[int], capacity: list[float]) -> list[int]:
    """a -> b, a -> c on two equal GPUs: p = (1, 1, 3) s, each edge 0.5 s across GPUs, one
    unit of memory per op."""
    return sct_schedule(
        np.array([[1.0, 1.0, 3.0], [1.0, 1.0, 3.0]]),
        np.array([0, 0]),
        np.array([1, 2]),
        np.array([0.5, 0.5]),
        latency_s=np.zeros((2, 2)),
        bandwidth_bytes_per_s=np.ones((2, 2)),
        favourite=np.array(favourite),
        units=np.arange(3),
        unit_memory=np.ones(3),
        capacity=np.array(capacity),
    ).tolist()


class TestSctSchedule:
    def test_favourite_child_stays_on_its_parents_gpu(self) -> None:
        """a runs on GPU 0 over [0, 1]; GPU 0 is awake for a's favourite child, which runs
        there at once; the other child waits 0.5 s for its input on GPU 1."""
        assert fork_schedule([2, -1, -1], [10, 10]) == [0, 1, 0]
        assert fork_schedule([1, -1, -1], [10, 10]) == [0, 0, 1]

    def test_memory_limit_moves_the_favourite_child(self) -> None:
        """GPU 0 holds a alone: m-SCT excludes it, so both children go to GPU 1."""
        assert fork_schedule([2, -1, -1], [1, 10]) == [0, 1, 1]

    def test_a_chain_stays_on_the_faster_gpu(self) -> None:
        """GPU 1 is twice as fast; a -> b -> c, each the favourite child of the last."""
        devices = sct_schedule(
            np.array([[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]]),
            np.array([0, 1]),
            np.array([1, 2]),
            np.array([0.5, 0.5]),
            latency_s=np.zeros((2, 2)),
            bandwidth_bytes_per_s=np.ones((2, 2)),
            favourite=np.array([1, 2, -1]),
            units=np.arange(3),
            unit_memory=np.ones(3),
            capacity=np.array([10.0, 10.0]),
        )
        assert devices.tolist() == [1, 1, 1]

    def test_a_constant_follows_its_unit_instead_of_pulling_it(self) -> None:
        """A (1 s) and a constant C feed R, which shares C's unit; A's output takes 1 s to
        cross GPUs. Placed on its own at t = 0, C would land on the idle GPU 1 and drag R
        away from A; fused with its unit (Baechi §3.3) it follows R to A's GPU."""
        devices = sct_schedule(
            np.array([[1.0, 0.0, 1.0], [1.0, 0.0, 1.0]]),
            np.array([0, 1]),
            np.array([2, 2]),
            np.array([1.0, 0.0]),
            latency_s=np.zeros((2, 2)),
            bandwidth_bytes_per_s=np.ones((2, 2)),
            favourite=np.array([-1, -1, -1]),
            units=np.array([0, 1, 1]),
            unit_memory=np.ones(2),
            capacity=np.array([10.0, 10.0]),
        )
        assert devices.tolist() == [0, 0, 0]

    def test_units_move_together(self) -> None:
        """b shares a's unit: it runs on a's GPU even though c is the favourite."""
        devices = sct_schedule(
            np.ones((2, 3)),
            np.array([0, 0]),
            np.array([1, 2]),
            np.array([0.5, 0.5]),
            latency_s=np.zeros((2, 2)),
            bandwidth_bytes_per_s=np.ones((2, 2)),
            favourite=np.array([2, -1, -1]),
            units=np.array([0, 0, 1]),
            unit_memory=np.ones(2),
            capacity=np.array([10.0, 10.0]),
        )
        assert devices[0] == devices[1]
