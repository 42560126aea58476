"""Matrix-product shapes of dense kernels and the work their output tiles round up to."""

from __future__ import annotations

import pytest

from tagplan.planner.cost.gemm_shape import gemm_shapes
from tagplan.planner.cost.op_time import Efficiency, OpCostModel
from tagplan.planner.cost.work import graph_work
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.topology import GpuTypeSpec, builtin_catalog
from tests.planner.cost.test_conv_algo import B, conv_ir
from tests.planner.graph.builders import dense_graph, graph_def, node, op, placeholder

GEMM_TILE = 128
PLAIN = Efficiency(dense_compute=1.0, other_compute=1.0, memory=1.0, launch_s=0.0)
# Compute-bound: 10 TFLOP/s against 1 PB/s.
GPU = GpuTypeSpec(
    name="GPU",
    fp32_tflops=10,
    memory_bandwidth_gb_per_s=1e6,
    memory_gib=1,
    winograd=False,
    gemm_tile=GEMM_TILE,
)


def shape_of(ir: GraphIR, name: str) -> tuple[float, float, bool]:
    shapes = gemm_shapes(ir, graph_work(ir))
    i = ir.op_index(name)
    return float(shapes.rows[i]), float(shapes.cols[i]), bool(shapes.rows_per_sample[i])


def padding(ir: GraphIR, name: str, local_batch: int, tile: int = GEMM_TILE) -> float:
    shapes = gemm_shapes(ir, graph_work(ir))
    return float(shapes.padding_at(local_batch, ir.batch_size, tile)[ir.op_index(name)])


def test_convolution_directions_as_matrix_products() -> None:
    ir = conv_ir(8, 16, 32)  # batch 4, 8x8 map, 3x3 filter, 16 -> 32 channels
    assert shape_of(ir, "e") == (B * 8 * 8, 32, True)
    assert shape_of(ir, "dx") == (B * 8 * 8, 16, True)
    assert shape_of(ir, "dk") == (3 * 3 * 16, 32, False)


def test_tiles_round_up_both_sides() -> None:
    ir = conv_ir(8, 16, 32)
    tile = GEMM_TILE
    # Forward: 256 rows are two whole tiles; 32 columns fill a quarter of one.
    assert padding(ir, "e", B) == pytest.approx(2 * tile * tile / (256 * 32))
    assert padding(ir, "dx", B) == pytest.approx(2 * tile * tile / (256 * 16))
    # Filter gradient: 144 rows take two tiles, 32 columns one; the batch does not matter.
    assert padding(ir, "dk", B) == pytest.approx(2 * tile * tile / (144 * 32))
    assert padding(ir, "dk", 1) == padding(ir, "dk", B)


def test_fewer_samples_leave_more_of_a_tile_empty() -> None:
    ir = conv_ir(8, 16, 32)
    # One sample: 64 rows in one 128-row tile.
    assert padding(ir, "e", 1) == pytest.approx(GEMM_TILE * GEMM_TILE / (64 * 32))
    assert padding(ir, "e", 1) == pytest.approx(2 * padding(ir, "e", B))


def test_smaller_tiles_waste_less() -> None:
    ir = conv_ir(8, 16, 32)
    # 64-wide tiles: 256 rows are four whole tiles, 32 columns half of one.
    assert padding(ir, "e", B, tile=64) == pytest.approx(4 * 64 * 64 / (256 * 32))


def test_matrix_products_and_other_ops() -> None:
    ir = analyze(graph_def(dense_graph(batch=200, features=4, units=300)))
    assert shape_of(ir, "y") == (200, 300, True)
    assert shape_of(ir, "dw") == (4, 300, False)
    # 200 x 300 on 2 x 3 tiles of 128 x 128.
    assert padding(ir, "y", 200) == pytest.approx(2 * 3 * GEMM_TILE**2 / (200 * 300))
    assert padding(ir, "loss", 200) == 1.0
    assert shape_of(ir, "loss") == (0, 0, False)


def test_a_batched_product_keeps_its_flops() -> None:
    doc = dense_graph(batch=8)
    doc["nodes"] += [
        placeholder("p", [8, 256, 256]),
        placeholder("v", [8, 256, 64]),
        op("s", "BatchMatMulV2", ["p", "v"], [8, 256, 64]),
        node("probe", "NoOp", ["^x", "^s"]),
    ]
    ir = analyze(graph_def(doc))
    # cuBLAS's batched kernels fit their tiles to small matrices: no rounding.
    assert shape_of(ir, "s") == (0, 0, False)
    assert padding(ir, "s", 8) == 1.0


def test_estimate_prices_the_tiled_work() -> None:
    """A matrix product's roofline counts its tiles' work; other kernels their own."""
    ir = analyze(graph_def(dense_graph(batch=200, features=4, units=300)))
    costs = OpCostModel.for_gpu_types(ir, [GPU], efficiency=PLAIN)
    seconds = costs.estimate(0, ir.batch_size)
    work = costs.work
    y, loss = ir.op_index("y"), ir.op_index("loss")
    tiled_flops = work.flops[y] * 2 * 3 * GEMM_TILE**2 / (200 * 300)
    assert seconds[y] == pytest.approx(max(tiled_flops / 10e12, work.bytes_moved[y] / 1e15))
    assert seconds[loss] == pytest.approx(
        max(work.flops[loss] / 10e12, work.bytes_moved[loss] / 1e15)
    )


def test_a_type_without_tiles_keeps_the_flops() -> None:
    ir = analyze(graph_def(dense_graph(batch=200, features=4, units=300)))
    untiled = GPU.model_copy(update={"gemm_tile": None})
    costs = OpCostModel.for_gpu_types(ir, [untiled], efficiency=PLAIN)
    y = ir.op_index("y")
    assert costs.estimate(0, ir.batch_size)[y] == pytest.approx(costs.work.flops[y] / 10e12)


def test_catalog_tiles_where_kernels_were_timed() -> None:
    # Hopper: kernels timed on an H200 (bench/gpu_kernels.py); elsewhere the flops stand.
    tiled = {name for name, spec in builtin_catalog().items() if spec.gemm_tile}
    assert tiled == {"H100", "H200"}
    assert builtin_catalog()["H200"].gemm_tile == GEMM_TILE
