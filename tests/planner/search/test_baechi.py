"""Baechi's m-TOPO and m-ETF (papers/baechi.md §2) as model-parallel baselines."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from tagplan.planner.cost.memory import FRAMEWORK_RESERVE_BYTES
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baechi import m_etf, m_topo
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


@pytest.mark.parametrize("placer", [m_topo, m_etf])
def test_units_stay_together_and_every_op_is_placed(placer) -> None:
    ir = zoo("resnet101")
    cluster = load_cluster("testbed")
    devices = placed_devices(placer(ir, cluster, OpCostModel(ir)), ir, cluster)
    assert (devices >= 0).all()
    units = atoms_of(ir)
    for unit in np.unique(units)[:200]:
        assert len(np.unique(devices[units == unit])) == 1


def test_m_topo_fills_gpus_in_order_within_their_memory() -> None:
    ir = zoo("vgg19")
    cluster = small_gpus(memory_gib=16)
    devices = placed_devices(
        m_topo(ir, cluster, OpCostModel(ir, gpu_types=cluster.to_spec().type_table())), ir, cluster
    )
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
    costs = OpCostModel(ir, gpu_types=cluster.to_spec().type_table())
    devices = placed_devices(m_etf(ir, cluster, costs), ir, cluster)
    assert set(devices.tolist()) == {1}


def test_m_etf_spreads_when_memory_runs_out_and_the_plan_fits() -> None:
    ir = zoo("vgg19")
    cluster = small_gpus(memory_gib=(548 * 4 / 2**10) + FRAMEWORK_RESERVE_BYTES / 2**30 + 6)
    evaluator = Evaluator(ir, cluster)
    strategy = m_etf(ir, cluster, evaluator.costs)
    assert len(np.unique(placed_devices(strategy, ir, cluster))) > 1
    assert evaluator.evaluate(strategy).step_time_s > 0
