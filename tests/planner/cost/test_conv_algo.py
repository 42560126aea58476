"""Convolution algorithms: which convolutions get Winograd candidates, their work and time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tagplan.planner.cost.conv_algo import (
    _DIRECTIONS,
    FILTER_SIZE,
    FUSED_TILE,
    NONFUSED_TILE,
    conv_algorithms,
)
from tagplan.planner.cost.op_time import Efficiency, OpCostModel
from tagplan.planner.cost.work import graph_work
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.topology import GpuTypeSpec
from tests.planner.graph.builders import const, dense_graph, graph_def, node, op, placeholder
from tests.planner.graph.builders import variable as var

B = 4
DOCS = Path(__file__).resolve().parents[3] / "docs" / "cost-formulas.md"
SAME = {"strides": [1, 1, 1, 1], "padding": "SAME"}
# Compute-bound: 1 TFLOP/s against 1 PB/s, so transforms cost next to nothing.
COMPUTE = GpuTypeSpec(name="COMPUTE", fp32_tflops=1, memory_bandwidth_gb_per_s=1e6, memory_gib=1)
PLAIN = Efficiency(dense_compute=1.0, other_compute=1.0, memory=1.0, launch_s=0.0)


def conv_ir(size: int, cin: int, cout: int, kernel: int = 3, **attrs: Any) -> GraphIR:
    """``e = Conv2D(img [B,size,size,cin], k [kernel,kernel,cin,cout])`` and its two gradients."""
    attrs = {**SAME, **attrs}
    y = [B, size, size, cout]
    nodes = [
        placeholder("img", [B, size, size, cin]),
        *var("k", [kernel, kernel, cin, cout]),
        op("e", "Conv2D", ["img", "k/read"], y, **attrs),
        placeholder("gy", y),
        const("isize", [B, size, size, cin]),
        const("fsize", [kernel, kernel, cin, cout]),
        op("dx", "Conv2DBackpropInput", ["isize", "k/read", "gy"], [B, size, size, cin], **attrs),
        op(
            "dk",
            "Conv2DBackpropFilter",
            ["img", "fsize", "gy"],
            [kernel, kernel, cin, cout],
            **attrs,
        ),
    ]
    doc = dense_graph(batch=B)
    doc["nodes"] += [*nodes, node("probe", "NoOp", ["^x", "^e", "^dx", "^dk"])]
    return analyze(graph_def(doc))


def factors(ir: GraphIR, name: str) -> tuple[float, float]:
    algorithms = conv_algorithms(ir, graph_work(ir))
    i = ir.op_index(name)
    return float(algorithms.fused_factor[i]), float(algorithms.nonfused_factor[i])


def test_multiplication_factors_by_hand() -> None:
    ir = conv_ir(8, 16, 32)
    # 8x8 map: F(2x2,3x3) 16 tiles x 16 mults, F(4x4,3x3) 4 tiles x 36, direct 64 x 9.
    assert factors(ir, "e") == pytest.approx((16 * 16 / 576, 4 * 36 / 576))
    assert factors(ir, "e") == pytest.approx((1 / 2.25, 1 / 4))
    assert factors(ir, "dx") == pytest.approx((1 / 2.25, 1 / 4))
    # cuDNN has no fused Winograd for the filter gradient.
    assert factors(ir, "dk") == pytest.approx((0.0, 1 / 4))


def test_tiles_round_up_on_a_map_they_do_not_divide() -> None:
    # 7x7 map: 4x4 tiles of 4x4 outputs (64 for 49), 2x2 tiles 16 of them (64 for 49).
    fused, nonfused = factors(conv_ir(7, 8, 8), "e")
    assert nonfused == pytest.approx(4 * 36 / (49 * 9))
    assert fused == pytest.approx(16 * 16 / (49 * 9))


@pytest.mark.parametrize(
    ("kernel", "attrs"),
    [
        (1, {}),
        (5, {}),
        (3, {"strides": [1, 2, 2, 1]}),
        (3, {"dilations": [1, 2, 2, 1]}),
    ],
    ids=["1x1", "5x5", "stride-2", "dilation-2"],
)
def test_only_3x3_stride_1_undilated_convolutions_are_offered(
    kernel: int, attrs: dict[str, Any]
) -> None:
    ir = conv_ir(8, 4, 4, kernel, **attrs)
    for name in ("e", "dx", "dk"):
        assert factors(ir, name) == (0.0, 0.0), name


def test_nchw_reads_the_spatial_axes_of_its_layout() -> None:
    nodes = [
        placeholder("img", [B, 16, 8, 8]),
        *var("k", [3, 3, 16, 16]),
        op("e", "Conv2D", ["img", "k/read"], [B, 16, 8, 8], data_format="NCHW", **SAME),
    ]
    doc = dense_graph(batch=B)
    doc["nodes"] += [*nodes, node("probe", "NoOp", ["^x", "^e"])]
    ir = analyze(graph_def(doc))
    assert factors(ir, "e") == pytest.approx((1 / 2.25, 1 / 4))


def test_transform_bytes_by_hand() -> None:
    ir = conv_ir(8, 16, 32)
    algorithms = conv_algorithms(ir, graph_work(ir))
    e = ir.op_index("e")
    # x and y: B * (16 + 32) channels * 4 tiles * 36 values, filter 16 * 32 * 36, float32,
    # each written once and read once.
    assert algorithms.transform_batch_bytes[e] == 2 * B * 48 * 4 * 36 * 4
    assert algorithms.transform_fixed_bytes[e] == 2 * 16 * 32 * 36 * 4
    half = algorithms.transform_bytes_at(B // 2, B)[e]
    assert half == B * 48 * 4 * 36 * 4 + 2 * 16 * 32 * 36 * 4


def test_compute_bound_convolution_takes_the_non_fused_time() -> None:
    ir = conv_ir(8, 16, 32)
    model = OpCostModel.for_gpu_types(ir, [COMPUTE], efficiency=PLAIN)
    seconds = model.estimate(0, B)
    direct = model.work.flops / 1e12
    for name in ("e", "dx", "dk"):
        i = ir.op_index(name)
        assert seconds[i] == pytest.approx(direct[i] / 4, rel=1e-3), name


def test_a_gpu_without_winograd_keeps_the_direct_time() -> None:
    ir = conv_ir(8, 16, 32)
    plain = COMPUTE.model_copy(update={"winograd": False})
    model = OpCostModel.for_gpu_types(ir, [plain], efficiency=PLAIN)
    i = ir.op_index("e")
    assert model.estimate(0, B)[i] == pytest.approx(model.work.flops[i] / 1e12, rel=1e-3)


def test_transforms_that_cost_more_than_they_save_leave_the_direct_algorithm() -> None:
    # An RGB stem on a bandwidth-starved GPU: the transformed 64-channel output moves far
    # more than the 3-channel multiplications save.
    ir = conv_ir(32, 3, 64)
    slow_memory = GpuTypeSpec(
        name="SLOWMEM", fp32_tflops=10, memory_bandwidth_gb_per_s=100, memory_gib=1
    )
    model = OpCostModel.for_gpu_types(ir, [slow_memory], efficiency=PLAIN)
    i = ir.op_index("e")
    flops, moved = model.work.flops[i], model.work.bytes_moved[i]
    direct = max(flops / 1e13, moved / 1e11)
    assert model.estimate(0, B)[i] == pytest.approx(direct)


def test_tensor_cores_faster_than_winograd_keep_the_direct_time() -> None:
    ir = conv_ir(8, 16, 32)
    tf32 = COMPUTE.model_copy(update={"tf32_tflops": 8.0})
    model = OpCostModel.for_gpu_types(ir, [tf32], efficiency=PLAIN)
    i = ir.op_index("e")
    assert model.estimate(0, B)[i] == pytest.approx(model.work.flops[i] / 8e12, rel=1e-3)


def test_docs_state_the_rule_of_the_code() -> None:
    text = DOCS.read_text()
    section = text.split("## Convolution algorithms", 1)[1].split("\n## ", 1)[0]
    r = FILTER_SIZE
    for m in (FUSED_TILE, NONFUSED_TILE):
        assert f"F({m}x{m},{r}x{r})" in section
    for op_type in _DIRECTIONS:
        assert f"`{op_type}`" in section
    assert "not implemented" in section  # why the filter gradient has no fused candidate
    assert np.isclose((FUSED_TILE * r) ** 2 / (FUSED_TILE + r - 1) ** 2, 2.25)
    assert "2.25x fewer" in section and "4x fewer" in section
