"""The work formula table: one hand-computed case per row, batch scaling, the zoo."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tagplan.planner.cost.work import (
    FORMULAS,
    GraphWork,
    attrs_from_cost_key,
    graph_work,
    op_work,
)
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.protos import DT_RESOURCE, op_registry
from tests.planner.graph.builders import (
    F32,
    const,
    dense_graph,
    graph_def,
    node,
    op,
    placeholder,
    scalar,
    variable,
)

B = 4  # batch size of the hand-built graphs
I32 = {"type": "int32"}
DOCS = Path(__file__).resolve().parents[3] / "docs" / "cost-formulas.md"
ZOO = (
    "vgg19",
    "resnet101",
    "inception_v3",
    "transformer",
    "bert_small",
    "bert_large",
    "mlp",
    "small_cnn",
    "mlp_tf2",
)


def f32(*shape: int) -> int:
    """Bytes of a float32 tensor."""
    return 4 * math.prod(shape)


def int_scalar(name: str, value: int) -> dict[str, Any]:
    tensor = {"dtype": "int32", "shape": [], "values": [value]}
    return node(name, "Const", outputs=[("int32", [])], dtype=I32, value={"tensor": tensor})


def handle(name: str, shape: list[int]) -> dict[str, Any]:
    """A resource variable without a read."""
    return node(name, "VarHandleOp", outputs=[("resource", [])], dtype=F32, shape={"shape": shape})


def analyze_with(nodes: list[dict[str, Any]]) -> GraphIR:
    """The dense graph (x [B,4] @ w [4,3], SGD update) plus ``nodes``.

    A sink that waits on the batch input and on every added node keeps them all: the
    analyzer drops what no training step needs.
    """
    doc = dense_graph(batch=B)
    sink = node("probe", "NoOp", ["^x", *(f"^{n['name']}" for n in nodes)])
    doc["nodes"] += [*nodes, sink]
    return analyze(graph_def(doc))


def work_of(nodes: list[dict[str, Any]], target: str) -> tuple[GraphIR, Any]:
    ir = analyze_with(nodes)
    return ir, op_work(ir, ir.op_index(target))


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    nodes: list[dict[str, Any]]
    target: str
    flops: float
    bytes_moved: float
    formula: str


def batch_norm(name: str, **attrs: Any) -> dict[str, Any]:
    """FusedBatchNormV3 of ``img`` [B,8,8,3] with all six outputs."""
    outputs = [("float32", [B, 8, 8, 3]), *[("float32", [3])] * 5]
    inputs = ["img", "gamma/read", "gamma/read", "gamma/read", "gamma/read"]
    return node(name, "FusedBatchNormV3", inputs, outputs, T=F32, U=F32, **attrs)


IMG = placeholder("img", [B, 8, 8, 3])
NHWC2 = {"strides": [1, 2, 2, 1], "padding": "SAME"}
X2 = placeholder("x2", [B, 5])


CASES = [
    # Zero-work rows.
    Case("none-placeholder", [], "x", 0, 0, "none"),
    Case("none-variable", [], "w", 0, 0, "none"),
    Case("none-const", [], "lr", 0, 0, "none"),
    Case("reference-read", [], "w/read", 0, 0, "reference"),
    Case(
        "metadata-reshape",
        [const("s16", [16]), op("r", "Reshape", ["x", "s16"], [16], Tshape=I32)],
        "r",
        0,
        0,
        "metadata",
    ),
    Case(
        "metadata-shape",
        [node("sh", "Shape", ["x"], [("int32", [2])], T=F32, out_type=I32)],
        "sh",
        0,
        0,
        "metadata",
    ),
    # Data movement: 0 flops, read + write.
    Case(
        "copy-transpose",
        [X2, const("perm", [1, 0]), op("t", "Transpose", ["x2", "perm"], [5, B], Tperm=I32)],
        "t",
        0,
        f32(B, 5) + 8 + f32(5, B),
        "copy",
    ),
    Case(
        "copy-concat",
        [int_scalar("ax", 1), op("c", "ConcatV2", ["x", "x", "ax"], [B, 8], N=2, Tidx=I32)],
        "c",
        0,
        2 * f32(B, 4) + 4 + f32(B, 8),
        "copy",
    ),
    Case(
        "copy-cast",
        [node("c", "Cast", ["x"], [("int32", [B, 4])], SrcT=F32, DstT=I32)],
        "c",
        0,
        f32(B, 4) + 4 * B * 4,
        "copy",
    ),
    Case(
        "slice-reads-only-the-slice",
        [
            X2,
            const("begin", [0, 1]),
            const("size", [B, 2]),
            op("s", "Slice", ["x2", "begin", "size"], [B, 2], Index=I32),
        ],
        "s",
        0,
        2 * f32(B, 2) + 8 + 8,
        "slice",
    ),
    Case(
        "gather-reads-only-the-rows",
        [
            *variable("table", [10, 5]),
            placeholder("ids", [B, 2], "int32"),
            int_scalar("axis", 0),
            node(
                "g",
                "GatherV2",
                ["table/read", "ids", "axis"],
                [("float32", [B, 2, 5])],
                Tparams=F32,
                Tindices=I32,
                Taxis=I32,
            ),
        ],
        "g",
        0,
        2 * f32(B, 2, 5) + 4 * B * 2 + 4,
        "gather",
    ),
    Case(
        "gather-resource-handle-moves-nothing",
        [
            handle("emb", [10, 5]),
            placeholder("ids", [B, 2], "int32"),
            node(
                "g",
                "ResourceGather",
                ["emb", "ids"],
                [("float32", [B, 2, 5])],
                dtype=F32,
                Tindices=I32,
            ),
        ],
        "g",
        0,
        2 * f32(B, 2, 5) + 4 * B * 2,
        "gather",
    ),
    Case(
        "segment-sum",
        [
            placeholder("seg", [B], "int32"),
            int_scalar("num", 10),
            node(
                "u",
                "UnsortedSegmentSum",
                ["x", "seg", "num"],
                [("float32", [10, 4])],
                T=F32,
                Tindices=I32,
                Tnumsegments=I32,
            ),
        ],
        "u",
        B * 4,
        f32(B, 4) + 4 * B + 4 + f32(10, 4),
        "segment_sum",
    ),
    # Generators: outputs written only.
    Case("fill-zeros-like", [op("z", "ZerosLike", ["x"], [B, 4])], "z", 0, f32(B, 4), "fill"),
    Case(
        "fill-range",
        [
            int_scalar("start", 0),
            int_scalar("limit", 10),
            int_scalar("delta", 1),
            node("rg", "Range", ["start", "limit", "delta"], [("int32", [10])], Tidx=I32),
        ],
        "rg",
        10,
        40,
        "fill",
    ),
    Case(
        "random-uniform",
        [
            const("rshape", [B, 4]),
            node("ru", "RandomUniform", ["rshape"], [("float32", [B, 4])], dtype=F32, T=I32),
            op("masked", "Mul", ["x", "ru"], [B, 4]),
        ],
        "ru",
        4 * B * 4,
        f32(B, 4),
        "random",
    ),
    # Elementwise: k flops per output element.
    Case(
        "elementwise-relu", [op("e", "Relu", ["x"], [B, 4])], "e", 16, 2 * f32(B, 4), "elementwise"
    ),
    Case(
        "elementwise-tanh", [op("e", "Tanh", ["x"], [B, 4])], "e", 64, 2 * f32(B, 4), "elementwise"
    ),
    Case(
        "elementwise-rsqrt",
        [op("e", "Rsqrt", ["x"], [B, 4])],
        "e",
        32,
        2 * f32(B, 4),
        "elementwise",
    ),
    Case(
        "elementwise-rsqrt-grad",
        [op("r", "Rsqrt", ["x"], [B, 4]), op("e", "RsqrtGrad", ["r", "x"], [B, 4])],
        "e",
        64,
        3 * f32(B, 4),
        "elementwise",
    ),
    Case(
        "elementwise-pow-scalar",
        [scalar("three", 3.0), op("e", "Pow", ["x", "three"], [B, 4])],
        "e",
        9 * 16,
        2 * f32(B, 4) + 4,
        "elementwise",
    ),
    Case(
        "elementwise-broadcast-mul",
        [*variable("scale", [4]), op("e", "Mul", ["x", "scale/read"], [B, 4])],
        "e",
        16,
        2 * f32(B, 4) + f32(4),
        "elementwise",
    ),
    Case(
        "elementwise-squared-difference",
        [*variable("mu", [4]), op("e", "SquaredDifference", ["x", "mu/read"], [B, 4])],
        "e",
        32,
        2 * f32(B, 4) + f32(4),
        "elementwise",
    ),
    Case(
        "elementwise-select",
        [
            scalar("zero", 0.0),
            node("pos", "Greater", ["x", "zero"], [("bool", [B, 4])], T=F32),
            op("e", "Select", ["pos", "x", "x"], [B, 4]),
        ],
        "e",
        16,
        B * 4 + 3 * f32(B, 4),
        "elementwise",
    ),
    Case(
        "add-n",
        [op("e", "AddN", ["x", "x", "x"], [B, 4], N=3)],
        "e",
        2 * 16,
        4 * f32(B, 4),
        "add_n",
    ),
    Case(
        "bias-add",
        [*variable("b", [4]), op("e", "BiasAdd", ["x", "b/read"], [B, 4])],
        "e",
        16,
        2 * f32(B, 4) + f32(4),
        "bias_add",
    ),
    Case(
        "bias-add-grad",
        [op("e", "BiasAddGrad", ["x"], [4])],
        "e",
        16,
        f32(B, 4) + f32(4),
        "bias_add_grad",
    ),
    Case(
        "reduction-sum",
        [const("ax1", [1]), op("e", "Sum", ["x", "ax1"], [B], Tidx=I32)],
        "e",
        16,
        f32(B, 4) + 4 + f32(B),
        "reduction",
    ),
    Case(
        "reduction-mean-divides-each-output",
        [const("ax1", [1]), op("e", "Mean", ["x", "ax1"], [B], Tidx=I32)],
        "e",
        16 + B,
        f32(B, 4) + 4 + f32(B),
        "reduction",
    ),
    Case("l2-loss", [op("e", "L2Loss", ["x"], [])], "e", 32, f32(B, 4) + 4, "l2_loss"),
    Case("softmax", [op("e", "Softmax", ["x"], [B, 4])], "e", 8 * 16, 2 * f32(B, 4), "softmax"),
    Case("log-softmax", [op("e", "LogSoftmax", ["x"], [B, 4])], "e", 128, 2 * f32(B, 4), "softmax"),
    Case(
        "sparse-softmax-cross-entropy",
        [
            placeholder("logits", [B, 10]),
            placeholder("labels", [B], "int32"),
            node(
                "e",
                "SparseSoftmaxCrossEntropyWithLogits",
                ["logits", "labels"],
                [("float32", [B]), ("float32", [B, 10])],
                T=F32,
                Tlabels=I32,
            ),
        ],
        "e",
        8 * B * 10,
        f32(B, 10) + 4 * B + f32(B) + f32(B, 10),
        "softmax_cross_entropy",
    ),
    Case(
        "softmax-cross-entropy",
        [
            placeholder("logits", [B, 10]),
            placeholder("onehot", [B, 10]),
            node(
                "e",
                "SoftmaxCrossEntropyWithLogits",
                ["logits", "onehot"],
                [("float32", [B]), ("float32", [B, 10])],
                T=F32,
            ),
        ],
        "e",
        11 * B * 10,
        3 * f32(B, 10) + f32(B),
        "softmax_cross_entropy",
    ),
    # Matrix products.
    Case("matmul", [], "y", 2 * B * 3 * 4, f32(B, 4) + f32(4, 3) + f32(B, 3), "matmul"),
    Case(
        "matmul-k-from-a",
        [X2, *variable("v", [5, 6]), op("e", "MatMul", ["x2", "v/read"], [B, 6])],
        "e",
        2 * B * 6 * 5,
        f32(B, 5) + f32(5, 6) + f32(B, 6),
        "matmul",
    ),
    Case(
        "matmul-transpose-a-contracts-the-batch",
        [
            X2,
            placeholder("z", [B, 6]),
            op("e", "MatMul", ["z", "x2"], [6, 5], transpose_a=True),
        ],
        "e",
        2 * 6 * 5 * B,
        f32(B, 6) + f32(B, 5) + f32(6, 5),
        "matmul",
    ),
    Case(
        "matmul-transpose-b",
        [
            X2,
            *variable("vt", [6, 5]),
            op("e", "MatMul", ["x2", "vt/read"], [B, 6], transpose_b=True),
        ],
        "e",
        2 * B * 6 * 5,
        f32(B, 5) + f32(6, 5) + f32(B, 6),
        "matmul",
    ),
    Case(
        "batch-matmul-adj-y",
        [
            placeholder("q", [B, 2, 3, 5]),
            placeholder("k", [B, 2, 7, 5]),
            op("e", "BatchMatMulV2", ["q", "k"], [B, 2, 3, 7], adj_y=True),
        ],
        "e",
        2 * B * 2 * 3 * 7 * 5,
        f32(B, 2, 3, 5) + f32(B, 2, 7, 5) + f32(B, 2, 3, 7),
        "batch_matmul",
    ),
    Case(
        "batch-matmul-broadcasts-a-matrix",
        [
            placeholder("q", [B, 2, 3, 5]),
            *variable("m", [5, 6]),
            op("e", "BatchMatMulV2", ["q", "m/read"], [B, 2, 3, 6]),
        ],
        "e",
        2 * B * 2 * 3 * 6 * 5,
        f32(B, 2, 3, 5) + f32(5, 6) + f32(B, 2, 3, 6),
        "batch_matmul",
    ),
    Case(
        "batch-matmul-adj-x",
        [
            placeholder("a", [B, 5, 3]),
            placeholder("b2", [B, 5, 2]),
            op("e", "BatchMatMulV3", ["a", "b2"], [B, 3, 2], adj_x=True, Ta=F32, Tb=F32, Tout=F32),
        ],
        "e",
        2 * B * 3 * 2 * 5,
        f32(B, 5, 3) + f32(B, 5, 2) + f32(B, 3, 2),
        "batch_matmul",
    ),
    # Convolutions: 2 * elements(y) * Kh*Kw*Cin, y the (strided) output or its gradient.
    Case(
        "conv2d-strided",
        [
            IMG,
            *variable("k", [3, 3, 3, 16]),
            op("e", "Conv2D", ["img", "k/read"], [B, 4, 4, 16], **NHWC2),
        ],
        "e",
        2 * (B * 4 * 4 * 16) * (3 * 3 * 3),
        f32(B, 8, 8, 3) + f32(3, 3, 3, 16) + f32(B, 4, 4, 16),
        "conv2d",
    ),
    Case(
        "conv2d-backprop-input-counts-on-dy",
        [
            const("isize", [B, 8, 8, 3]),
            *variable("k", [3, 3, 3, 16]),
            placeholder("gy", [B, 4, 4, 16]),
            op("e", "Conv2DBackpropInput", ["isize", "k/read", "gy"], [B, 8, 8, 3], **NHWC2),
        ],
        "e",
        2 * (B * 4 * 4 * 16) * (3 * 3 * 3),
        16 + f32(3, 3, 3, 16) + f32(B, 4, 4, 16) + f32(B, 8, 8, 3),
        "conv2d_backprop_input",
    ),
    Case(
        "conv2d-backprop-filter",
        [
            IMG,
            const("fsize", [3, 3, 3, 16]),
            placeholder("gy", [B, 4, 4, 16]),
            op("e", "Conv2DBackpropFilter", ["img", "fsize", "gy"], [3, 3, 3, 16], **NHWC2),
        ],
        "e",
        2 * (B * 4 * 4 * 16) * (3 * 3 * 3),
        f32(B, 8, 8, 3) + 16 + f32(B, 4, 4, 16) + f32(3, 3, 3, 16),
        "conv2d_backprop_filter",
    ),
    Case(
        "depthwise-conv2d",
        [
            IMG,
            *variable("k", [3, 3, 3, 2]),
            op(
                "e",
                "DepthwiseConv2dNative",
                ["img", "k/read"],
                [B, 8, 8, 6],
                strides=[1, 1, 1, 1],
                padding="SAME",
            ),
        ],
        "e",
        2 * (B * 8 * 8 * 6) * 9,
        f32(B, 8, 8, 3) + f32(3, 3, 3, 2) + f32(B, 8, 8, 6),
        "depthwise_conv2d",
    ),
    Case(
        "depthwise-backprop-input",
        [
            const("isize", [B, 8, 8, 3]),
            *variable("k", [3, 3, 3, 2]),
            placeholder("gy", [B, 8, 8, 6]),
            op(
                "e",
                "DepthwiseConv2dNativeBackpropInput",
                ["isize", "k/read", "gy"],
                [B, 8, 8, 3],
                strides=[1, 1, 1, 1],
                padding="SAME",
            ),
        ],
        "e",
        2 * (B * 8 * 8 * 6) * 9,
        16 + f32(3, 3, 3, 2) + f32(B, 8, 8, 6) + f32(B, 8, 8, 3),
        "depthwise_backprop_input",
    ),
    Case(
        "depthwise-backprop-filter",
        [
            IMG,
            const("fsize", [3, 3, 3, 2]),
            placeholder("gy", [B, 8, 8, 6]),
            op(
                "e",
                "DepthwiseConv2dNativeBackpropFilter",
                ["img", "fsize", "gy"],
                [3, 3, 3, 2],
                strides=[1, 1, 1, 1],
                padding="SAME",
            ),
        ],
        "e",
        2 * (B * 8 * 8 * 6) * 9,
        f32(B, 8, 8, 3) + 16 + f32(B, 8, 8, 6) + f32(3, 3, 3, 2),
        "depthwise_backprop_filter",
    ),
    # Pooling: window * elements of the pooled tensor (+1 for a divide or a scatter).
    Case(
        "max-pool",
        [IMG, op("e", "MaxPool", ["img"], [B, 4, 4, 3], ksize=[1, 2, 2, 1], **NHWC2)],
        "e",
        4 * (B * 4 * 4 * 3),
        f32(B, 8, 8, 3) + f32(B, 4, 4, 3),
        "pool",
    ),
    Case(
        "avg-pool",
        [
            IMG,
            op(
                "e",
                "AvgPool",
                ["img"],
                [B, 8, 8, 3],
                ksize=[1, 3, 3, 1],
                strides=[1, 1, 1, 1],
                padding="SAME",
            ),
        ],
        "e",
        (9 + 1) * (B * 8 * 8 * 3),
        2 * f32(B, 8, 8, 3),
        "pool",
    ),
    Case(
        "max-pool-grad",
        [
            IMG,
            op("p", "MaxPool", ["img"], [B, 4, 4, 3], ksize=[1, 2, 2, 1], **NHWC2),
            placeholder("dp", [B, 4, 4, 3]),
            op("e", "MaxPoolGrad", ["img", "p", "dp"], [B, 8, 8, 3], ksize=[1, 2, 2, 1], **NHWC2),
        ],
        "e",
        (4 + 1) * (B * 4 * 4 * 3),
        2 * f32(B, 8, 8, 3) + 2 * f32(B, 4, 4, 3),
        "pool_grad",
    ),
    Case(
        "avg-pool-grad",
        [
            const("isize", [B, 8, 8, 3]),
            placeholder("dp", [B, 4, 4, 3]),
            op("e", "AvgPoolGrad", ["isize", "dp"], [B, 8, 8, 3], ksize=[1, 2, 2, 1], **NHWC2),
        ],
        "e",
        (4 + 1) * (B * 4 * 4 * 3),
        16 + f32(B, 4, 4, 3) + f32(B, 8, 8, 3),
        "pool_grad",
    ),
    # Normalization.
    Case(
        "batch-norm-training",
        [
            IMG,
            *variable("gamma", [3]),
            batch_norm("e"),
        ],
        "e",
        7 * (B * 8 * 8 * 3),
        3 * f32(B, 8, 8, 3) + 9 * f32(3),  # x read twice (statistics, then normalize)
        "batch_norm",
    ),
    Case(
        "batch-norm-inference",
        [
            IMG,
            *variable("gamma", [3]),
            batch_norm("e", is_training=False),
        ],
        "e",
        2 * (B * 8 * 8 * 3),
        2 * f32(B, 8, 8, 3) + 9 * f32(3),
        "batch_norm",
    ),
    Case(
        "batch-norm-grad",
        [
            IMG,
            placeholder("gy", [B, 8, 8, 3]),
            *variable("gamma", [3]),
            node(
                "e",
                "FusedBatchNormGradV3",
                ["gy", "img", "gamma/read", "gamma/read", "gamma/read", "gamma/read"],
                [("float32", [B, 8, 8, 3]), *[("float32", [3])] * 4],
                T=F32,
                U=F32,
            ),
        ],
        "e",
        9 * (B * 8 * 8 * 3),
        5 * f32(B, 8, 8, 3) + 8 * f32(3),  # dy and x read twice (sums, then dx)
        "batch_norm_grad",
    ),
    # Parameter updates: P = 12 elements of w [4, 3].
    Case("apply-sgd", [], "update_w", 2 * 12, 2 * f32(4, 3) + 4 + f32(4, 3), "apply_optimizer"),
    Case(
        "apply-adam",
        [
            *(handle(name, [4, 3]) for name in ("p", "m", "v")),
            *(scalar(name, 0.9) for name in ("b1p", "b2p", "b1", "b2", "eps")),
            node(
                "e",
                "ResourceApplyAdam",
                ["p", "m", "v", "b1p", "b2p", "lr", "b1", "b2", "eps", "dw"],
                [],
                T=F32,
            ),
        ],
        "e",
        13 * 12,
        6 * f32(4, 3) + 6 * 4 + f32(4, 3),
        "apply_optimizer",
    ),
    Case(
        "assign",
        [*variable("u", [4, 3]), node("e", "AssignVariableOp", ["w", "u/read"], [], dtype=F32)],
        "e",
        0,
        2 * f32(4, 3),
        "assign",
    ),
    Case(
        "assign-sub",
        [*variable("u", [4, 3]), node("e", "AssignSubVariableOp", ["w", "u/read"], [], dtype=F32)],
        "e",
        12,
        3 * f32(4, 3),
        "assign_update",
    ),
    # Not in the table: bytes only.
    Case(
        "fallback-unknown-op",
        [node("e", "MyCustomOp", ["x"], [("float32", [B, 4])])],
        "e",
        0,
        2 * f32(B, 4),
        "fallback",
    ),
]


class TestFormulaRows:
    @pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
    def test_hand_computed(self, case: Case) -> None:
        _, work = work_of(case.nodes, case.target)
        assert work.formula == case.formula
        assert work.flops == case.flops
        assert work.bytes_moved == case.bytes_moved

    def test_every_formula_name_has_a_case(self) -> None:
        covered = {c.formula for c in CASES}
        assert {f.name for f in FORMULAS.values()} <= covered

    def test_conv2d_output_shape_unknown_is_derived_from_strides_and_padding(self) -> None:
        cases = [
            # NHWC, stride 2, SAME: Ho = ceil(8 / 2) = 4.
            ([1, 2, 2, 1], "SAME", "NHWC", [B, 8, 8, 3], [B, 4, 4, 16]),
            # NCHW, stride 2, VALID: Ho = (8 - 3) // 2 + 1 = 3.
            ([1, 1, 2, 2], "VALID", "NCHW", [B, 3, 8, 8], [B, 16, 3, 3]),
        ]
        for strides, padding, layout, x_shape, y_shape in cases:
            nodes = [
                placeholder("im", x_shape),
                *variable("k", [3, 3, 3, 16]),
                op(
                    "e",
                    "Conv2D",
                    ["im", "k/read"],
                    y_shape,
                    strides=strides,
                    padding=padding,
                    data_format=layout,
                ),
            ]
            ir, known = work_of(nodes, "e")
            assert known.flops == 2 * math.prod(y_shape) * 27
            e = ir.op_index("e")
            y = ir.outputs(e)[0]
            shapes = list(ir.tensor_shapes)
            shapes[y] = (B, -1, -1, 16) if layout == "NHWC" else (B, 16, -1, -1)
            unknown = dataclasses.replace(ir, tensor_shapes=tuple(shapes))
            assert op_work(unknown, e).flops == known.flops

    def test_inputs_that_do_not_fit_the_row_fall_back(self) -> None:
        ir, _ = work_of([op("e", "MatMul", ["x", "w/read"], [B, 3])], "e")
        e = ir.op_index("e")
        ptr = ir.op_input_ptr.copy()
        ptr[e + 1 :] -= 2  # drop both inputs of the MatMul from the CSR view
        tensors = np.delete(ir.op_input_tensor, [ptr[e], ptr[e] + 1])
        broken = dataclasses.replace(ir, op_input_ptr=ptr, op_input_tensor=tensors)
        assert op_work(broken, e).formula == "fallback"


class TestBatchFractions:
    def test_matmul_flops_scale_bytes_split_by_tensor(self) -> None:
        _, work = work_of([], "y")  # x [B,4] @ w [4,3] -> [B,3]
        assert work.flops_batch_fraction == 1.0
        batch, fixed = f32(B, 4) + f32(B, 3), f32(4, 3)
        assert work.bytes_batch_fraction == pytest.approx(batch / (batch + fixed))

    def test_reduction_over_the_batch_scales(self) -> None:
        _, work = work_of([op("e", "BiasAddGrad", ["x"], [4])], "e")
        assert work.flops_batch_fraction == 1.0
        assert work.bytes_batch_fraction == pytest.approx(f32(B, 4) / (f32(B, 4) + f32(4)))

    def test_parameter_update_is_fixed(self) -> None:
        _, work = work_of([], "update_w")
        assert work.flops_batch_fraction == 0.0 and work.bytes_batch_fraction == 0.0

    def test_at_batch_scales_only_the_batch_part(self) -> None:
        ir = analyze_with([])
        work = graph_work(ir)
        flops, moved = work.at_batch(B // 2, B)
        y, update = ir.op_index("y"), ir.op_index("update_w")
        assert flops[y] == work.flops[y] / 2
        assert moved[y] == (f32(B, 4) + f32(B, 3)) / 2 + f32(4, 3)
        assert flops[update] == work.flops[update]
        assert moved[update] == work.bytes_moved[update]
        same = work.at_batch(B, B)
        np.testing.assert_allclose(same[0], work.flops)
        np.testing.assert_allclose(same[1], work.bytes_moved)

    def test_at_batch_refuses_bad_sizes(self) -> None:
        work = graph_work(analyze_with([]))
        with pytest.raises(InvalidInput, match="batch_size > 0"):
            work.at_batch(2, 0)


class TestGraphWork:
    def test_arrays_match_op_work(self) -> None:
        ir = analyze_with([op("e", "Relu", ["x"], [B, 4])])
        work = graph_work(ir)
        assert isinstance(work, GraphWork)
        assert len(work.formula) == ir.num_ops
        for array in (work.flops, work.bytes_moved, work.flops_batch_fraction):
            assert array.dtype == np.float64 and array.shape == (ir.num_ops,)
        for i in range(ir.num_ops):
            row = op_work(ir, i)
            assert (work.flops[i], work.bytes_moved[i], work.formula[i]) == (
                row.flops,
                row.bytes_moved,
                row.formula,
            )
            assert work.bytes_batch_fraction[i] == row.bytes_batch_fraction


class TestAttrsFromCostKey:
    def test_parses_values_and_lists(self) -> None:
        key = (
            "Conv2D|float32[B,8,8,3];float32[3,3,3,16]|T=float32;data_format=NHWC;"
            "padding=SAME;strides=(1,2,2,1)"
        )
        attrs = attrs_from_cost_key(key)
        assert attrs == {
            "T": "float32",
            "data_format": "NHWC",
            "padding": "SAME",
            "strides": "(1,2,2,1)",
        }

    def test_no_attributes(self) -> None:
        assert attrs_from_cost_key("Const||") == {}
        assert attrs_from_cost_key("Relu|float32[B]") == {}

    def test_string_value_with_separator_stays_whole(self) -> None:
        attrs = attrs_from_cost_key("VarHandleOp||shared_name=a;b c;dtype=float32")
        assert attrs == {"shared_name": "a;b c", "dtype": "float32"}

    def test_real_cost_key(self) -> None:
        ir, _ = work_of([op("e", "MatMul", ["x", "w/read"], [B, 3], transpose_b=False)], "e")
        assert attrs_from_cost_key(ir.cost_keys[ir.op_index("e")])["transpose_b"] == "False"


class TestTable:
    def test_op_types_are_tensorflow_ops(self) -> None:
        registry = op_registry()
        assert sorted(t for t in FORMULAS if t not in registry) == []

    def test_every_row_is_documented(self) -> None:
        assert all(f.name and f.doc for f in FORMULAS.values())
        assert "fallback" not in {f.name for f in FORMULAS.values()}

    def test_apply_rows_read_the_gradient_argument(self) -> None:
        registry = op_registry()
        for op_type, formula in FORMULAS.items():
            if formula.name != "apply_optimizer":
                continue
            states, _, grad = formula.compute.args  # type: ignore[attr-defined]
            args = registry[op_type].input_arg
            assert args[grad].name in ("grad", "delta"), op_type
            assert all(arg.is_ref or arg.type == DT_RESOURCE for arg in args[:states]), op_type

    def test_docs_list_every_op_type(self) -> None:
        text = DOCS.read_text()
        missing = [t for t in FORMULAS if f"`{t}`" not in text]
        assert missing == []


@pytest.fixture(scope="module")
def zoo_irs() -> dict[str, GraphIR]:
    from tagplan.planner.graph.source import load_graph_source

    irs = {}
    for name in ZOO:
        source = load_graph_source(f"zoo:{name}")
        irs[name] = analyze(
            source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss, batch_size=1
        )
    return irs


class TestZoo:
    def test_no_zoo_op_type_falls_back(self, zoo_irs: dict[str, GraphIR]) -> None:
        for name, ir in zoo_irs.items():
            work = graph_work(ir)
            fallback = sorted(
                {ir.op_types[i] for i, f in enumerate(work.formula) if f == "fallback"}
            )
            assert fallback == [], name

    def test_vgg19_forward_convolutions_are_2x_the_published_multiply_adds(
        self, zoo_irs: dict[str, GraphIR]
    ) -> None:
        # (spatial size, Cin, Cout) of VGG19's sixteen 3x3 convolutions at 224x224.
        layers = [(224, 3, 64), (224, 64, 64), (112, 64, 128), (112, 128, 128)]
        layers += [(56, 128, 256)] + [(56, 256, 256)] * 3
        layers += [(28, 256, 512)] + [(28, 512, 512)] * 3 + [(14, 512, 512)] * 4
        macs = sum(s * s * 9 * cin * cout for s, cin, cout in layers)
        assert macs == pytest.approx(19.5e9, rel=0.01)  # the "19.6 GFLOPs" of the literature
        ir = zoo_irs["vgg19"]
        work = graph_work(ir)
        conv = sum(work.flops[i] for i, t in enumerate(ir.op_types) if t == "Conv2D")
        assert conv == 2 * macs
        for op_type in ("Conv2DBackpropInput", "Conv2DBackpropFilter"):
            # Each backprop costs as much as the forward pass (this graph also computes
            # the gradient of the first layer's input).
            total = sum(work.flops[i] for i, t in enumerate(ir.op_types) if t == op_type)
            assert total == 2 * macs

    def test_bert_large_is_fast(self, zoo_irs: dict[str, GraphIR]) -> None:
        start = time.perf_counter()
        graph_work(zoo_irs["bert_large"])
        assert time.perf_counter() - start < 1.0
