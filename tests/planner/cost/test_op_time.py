"""Op times: the roofline estimate against hand-computed numbers, profiles winning."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.cost.op_time import Efficiency, OpCostModel
from tagplan.planner.cost.profile import InMemoryProfileSource
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.topology import GpuTypeSpec, load_cluster
from tests.planner.graph.builders import dense_graph, graph_def

# 1 GFLOP/s and 1 GB/s: times in the hundreds of nanoseconds, easy to compute by hand.
SLOW = GpuTypeSpec(name="SLOW", fp32_tflops=1e-3, memory_bandwidth_gb_per_s=1, memory_gib=1)
PLAIN = Efficiency(dense_compute=0.5, other_compute=0.25, memory=0.5, launch_s=1e-6)


@pytest.fixture
def model() -> OpCostModel:
    ir = analyze(graph_def(dense_graph(batch=8, features=4, units=3)))
    return OpCostModel.for_gpu_types(ir, [SLOW], efficiency=PLAIN)


def test_matmul_roofline_by_hand(model: OpCostModel) -> None:
    y = model.ir.op_names.index("y")
    # y = x[8,4] @ w[4,3]: 2*8*4*3 = 192 FLOP at 0.5 GFLOP/s effective -> 384 ns;
    # bytes (8*4 + 4*3 + 8*3) * 4 = 272 at 0.5 GB/s effective -> 544 ns: memory-bound.
    seconds = model.op_times(0, 8).seconds[y]
    assert seconds == pytest.approx(544e-9 + 1e-6)


def test_local_batch_scales_only_the_batch_part(model: OpCostModel) -> None:
    y = model.ir.op_names.index("y")
    # at local batch 4: 96 FLOP; bytes (4*4 + 12 + 4*3) * 4 = 160 -> 320 ns
    assert model.op_times(0, 4).seconds[y] == pytest.approx(320e-9 + 1e-6)


def test_ops_without_work_are_free(model: OpCostModel) -> None:
    times = model.op_times(0, 8).seconds
    for name in ("x", "w", "axes", "lr"):
        assert times[model.ir.op_names.index(name)] == 0.0


def test_profile_overrides_the_estimate_and_is_reported(model: OpCostModel) -> None:
    y = model.ir.op_names.index("y")
    profiles = InMemoryProfileSource()
    profiles.add(model.ir.cost_keys[y], "slow", 8, 0.25)
    profiles.add(model.ir.cost_keys[y], "slow", 16, 0.5)
    measured = OpCostModel.for_gpu_types(model.ir, [SLOW], profiles=profiles, efficiency=PLAIN)
    times = measured.op_times(0, 8)
    assert times.seconds[y] == 0.25 and times.measured[y]
    assert times.measured.sum() == 1
    assert times.estimated_fraction == pytest.approx(1 - 0.25 / times.total_s)
    assert measured.op_times(0, 12).seconds[y] == pytest.approx(0.375)  # interpolated


def test_instance_times_are_each_instances_op_times() -> None:
    """Many (op, type, local batch) entries at once give what op_times gives each one,
    measured flags included."""
    ir = analyze(graph_def(dense_graph(batch=8, features=4, units=3)))
    y = ir.op_names.index("y")
    profiles = InMemoryProfileSource()
    profiles.add(ir.cost_keys[y], "slow", 2, 0.125)
    fast = GpuTypeSpec(name="FAST", fp32_tflops=1e-2, memory_bandwidth_gb_per_s=10, memory_gib=1)
    model = OpCostModel.for_gpu_types(ir, [SLOW, fast], profiles=profiles, efficiency=PLAIN)
    rng = np.random.default_rng(0)
    op = rng.integers(ir.num_ops, size=40)
    gpu_type = rng.integers(2, size=40)
    local = rng.choice([1, 2, 5, 8], size=40)
    times = model.instance_times(op, gpu_type, local)
    for i in range(40):
        one = model.op_times(int(gpu_type[i]), int(local[i]))
        assert times.seconds[i] == one.seconds[op[i]]
        assert times.measured[i] == one.measured[op[i]]
    assert times.measured.any()


def test_unknown_gpu_type_lists_the_known_ones(model: OpCostModel) -> None:
    with pytest.raises(InvalidInput, match="known types: SLOW"):
        model.type_of("Z100")


def test_catalog_types_by_default() -> None:
    ir = analyze(graph_def(dense_graph()))
    model = OpCostModel.for_gpu_types(ir)
    v100 = model.op_times(model.type_of("v100-32gb"), 8)
    t4 = model.op_times(model.type_of("T4"), 8)
    assert 0 < v100.total_s <= t4.total_s


def test_gpu_types_are_the_clusters_type_indices() -> None:
    ir = analyze(graph_def(dense_graph()))
    cluster = load_cluster("testbed")
    costs = OpCostModel(ir, cluster)
    catalog = OpCostModel.for_gpu_types(ir)
    for t, name in enumerate(cluster.type_names):
        np.testing.assert_array_equal(
            costs.op_times(t, 8).seconds, catalog.op_times(catalog.type_of(name), 8).seconds
        )
    assert costs.op_times(np.int32(0), 8) is costs.op_times(0, 8)  # one cache entry


def test_a_type_index_outside_the_cluster_is_refused(model: OpCostModel) -> None:
    with pytest.raises(InvalidInput, match="out of range"):
        model.op_times(1, 8)
    with pytest.raises(InvalidInput, match="out of range"):
        model.estimate(-1, 8)


def test_a_cluster_with_other_types_is_refused(model: OpCostModel) -> None:
    model.check_cluster(model.cluster)
    with pytest.raises(InvalidInput, match="the cluster has"):
        model.check_cluster(load_cluster("testbed"))
