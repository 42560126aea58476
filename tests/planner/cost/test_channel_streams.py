"""Training batch norms stream one channel per multiprocessor at a fixed rate: the bound
against its formula."""

from __future__ import annotations

from typing import Any

import pytest

from tagplan.planner.cost.channel_streams import (
    BACKWARD_CHANNEL_GB_PER_S,
    FORWARD_CHANNEL_GB_PER_S,
)
from tagplan.planner.cost.op_time import Efficiency, OpCostModel
from tagplan.planner.cost.work import graph_work
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.topology import GpuTypeSpec, builtin_catalog
from tests.planner.graph.builders import dense_graph, graph_def, node, placeholder

PLAIN = Efficiency(dense_compute=1.0, other_compute=1.0, memory=1.0, launch_s=0.0)
MULTIPROCESSORS = 80
BANDWIDTH_GB_PER_S = 900.0
GPU = GpuTypeSpec(
    name="GPU",
    fp32_tflops=1e5,  # every batch norm memory-bound
    memory_bandwidth_gb_per_s=BANDWIDTH_GB_PER_S,
    memory_gib=16,
    multiprocessors=MULTIPROCESSORS,
)
BATCH = 8


def batch_norm_ir(
    channels: int,
    dtype: str = "float32",
    training: bool = True,
    per_channel_shape: list[int] | None = None,
) -> GraphIR:
    """The dense training graph plus a batch norm and its gradient on ``[8, 32, 32, C]``
    (per-channel outputs of ``per_channel_shape``, default ``[C]``)."""
    x = [BATCH, 32, 32, channels]
    per_channel = [(dtype, per_channel_shape or [channels])]
    attrs: dict[str, Any] = {"T": {"type": dtype}, "U": {"type": "float32"}}
    attrs["is_training"] = training
    doc = dense_graph(batch=BATCH)
    nodes = [
        placeholder("img", x, dtype),
        placeholder("gy", x, dtype),
        placeholder("gamma", [channels]),
        node(
            "bn",
            "FusedBatchNormV3",
            ["img", *["gamma"] * 4],
            [(dtype, x), *per_channel * 5],
            **attrs,
        ),
        node(
            "bn_grad",
            "FusedBatchNormGradV3",
            ["gy", "img", *["gamma"] * 4],
            [(dtype, x), *per_channel * 4],
            **attrs,
        ),
    ]
    doc["nodes"] += [*nodes, node("probe", "NoOp", ["^x", "^bn", "^bn_grad"])]
    return analyze(graph_def(doc), batch_inputs=["x", "img", "gy"])


def seconds(ir: GraphIR, spec: GpuTypeSpec = GPU) -> dict[str, float]:
    times = OpCostModel.for_gpu_types(ir, [spec], efficiency=PLAIN).op_times(0, BATCH).seconds
    return {name: float(times[ir.op_index(name)]) for name in ("bn", "bn_grad")}


def bytes_of(ir: GraphIR) -> dict[str, float]:
    work = graph_work(ir)
    return {name: float(work.bytes_moved[ir.op_index(name)]) for name in ("bn", "bn_grad")}


@pytest.mark.parametrize("bandwidth_gb_per_s", [BANDWIDTH_GB_PER_S, 2 * BANDWIDTH_GB_PER_S])
@pytest.mark.parametrize("channels", [8, 16, 32])
def test_few_channels_stream_at_a_fixed_rate_each(channels: int, bandwidth_gb_per_s: float) -> None:
    """The channels' rate, not the GPU's bandwidth: twice the bandwidth, the same time."""
    ir = batch_norm_ir(channels)
    moved = bytes_of(ir)
    gpu = GPU.model_copy(update={"memory_bandwidth_gb_per_s": bandwidth_gb_per_s})
    for name, rate_gb_per_s in (
        ("bn", FORWARD_CHANNEL_GB_PER_S),
        ("bn_grad", BACKWARD_CHANNEL_GB_PER_S),
    ):
        expected = moved[name] / (channels * rate_gb_per_s * 1e9)
        assert seconds(ir, gpu)[name] == pytest.approx(expected, rel=1e-12)
        assert expected > moved[name] / (bandwidth_gb_per_s * 1e9)  # slower than the roofline


def test_many_channels_keep_the_roofline() -> None:
    ir = batch_norm_ir(512)
    moved = bytes_of(ir)
    for name in ("bn", "bn_grad"):
        assert seconds(ir)[name] == pytest.approx(moved[name] / (BANDWIDTH_GB_PER_S * 1e9))


@pytest.mark.parametrize(
    "ir",
    [
        pytest.param(batch_norm_ir(16, training=False), id="inference"),
        pytest.param(batch_norm_ir(16, dtype="float16"), id="float16"),
    ],
)
def test_inference_and_half_precision_keep_the_roofline(ir: GraphIR) -> None:
    moved = bytes_of(ir)
    unbounded = GPU.model_copy(update={"multiprocessors": None})
    assert seconds(ir) == seconds(ir, unbounded)
    assert seconds(ir)["bn"] == pytest.approx(moved["bn"] / (BANDWIDTH_GB_PER_S * 1e9))


def test_a_type_without_a_multiprocessor_count_has_no_bound() -> None:
    ir = batch_norm_ir(16)
    unbounded = GPU.model_copy(update={"multiprocessors": None})
    moved = bytes_of(ir)
    assert seconds(ir, unbounded)["bn_grad"] == pytest.approx(
        moved["bn_grad"] / (BANDWIDTH_GB_PER_S * 1e9)
    )
    assert seconds(ir)["bn_grad"] > 2 * seconds(ir, unbounded)["bn_grad"]


def test_every_catalog_gpu_names_its_multiprocessors() -> None:
    catalog = builtin_catalog()
    assert {name for name, spec in catalog.items() if spec.multiprocessors is None} == {"CPU"}
    # datasheet cores over the whitepaper's cores per multiprocessor
    assert catalog["H100"].multiprocessors == 16896 // 128
    assert catalog["V100-16GB"].multiprocessors == 5120 // 64
    assert catalog["K80"].multiprocessors == 2496 // 192


def test_unknown_channels_keep_the_roofline() -> None:
    """A batch norm whose per-channel outputs have no known size is not bounded by a
    guess at its channels."""
    ir = batch_norm_ir(16)
    known = seconds(ir)
    unknown = batch_norm_ir(16, per_channel_shape=[-1])
    assert tuple(unknown.tensor_shapes[unknown.outputs(unknown.op_index("bn"))[1]]) == (-1,)
    unbounded = GPU.model_copy(update={"multiprocessors": None})
    assert seconds(unknown) == seconds(unknown, unbounded)
    assert known["bn"] > seconds(unknown)["bn"]
