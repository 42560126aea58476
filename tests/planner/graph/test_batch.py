"""Batch-axis propagation and TAG §4.1.1 split categories, op family by op family."""

from __future__ import annotations

import pytest

from tagplan.planner.graph.batch import Aggregation, SplitCategory, propagate_batch
from tagplan.planner.graph.parsed import parse_graph
from tests.planner.graph.builders import F32, const, document, graph_def, node, op, placeholder

B = 6
CONCAT, SUM, NONE = SplitCategory.SPLIT_CONCAT, SplitCategory.SPLIT_SUM, SplitCategory.NONE


def run(nodes: list[dict], inputs: tuple[str, ...] = ("x",)):
    graph = parse_graph(graph_def(document(nodes)))
    result = propagate_batch(
        graph,
        batch_inputs=[graph.index[n] for n in inputs],
        graph_batch_size=B,
        stateful=[False] * graph.num_nodes,
    )

    def axis(name: str, slot: int = 0) -> int:
        return result.axis(graph.index[name], slot)

    def category(name: str) -> SplitCategory:
        return SplitCategory(int(result.category[graph.index[name]]))

    def aggregation(name: str, slot: int = 0) -> Aggregation:
        return Aggregation(int(result.aggregation[result.output_offset[graph.index[name]] + slot]))

    return axis, category, aggregation, result, graph


def test_matmul_rows_concat_and_batch_contraction_sums() -> None:
    axis, category, aggregation, *_ = run(
        [
            placeholder("x", [B, 4]),
            placeholder("w", [4, 3]),
            op("y", "MatMul", ["x", "w"], [B, 3]),
            op("dw", "MatMul", ["x", "y"], [4, 3], transpose_a=True),
            op("yt", "MatMul", ["w", "x"], [3, B], transpose_a=True, transpose_b=True),
            op("outer", "MatMul", ["x", "x"], [B, B], transpose_b=True),
        ]
    )
    assert (axis("y"), category("y")) == (0, CONCAT)
    assert (axis("dw"), category("dw"), aggregation("dw")) == (-1, SUM, Aggregation.SUM)
    assert (axis("yt"), category("yt")) == (1, CONCAT)
    assert category("outer") == NONE  # every row meets every other row: not splittable


def test_batch_matmul_keeps_leading_batch_and_sums_contraction() -> None:
    axis, category, *_ = run(
        [
            placeholder("x", [B, 2, 5, 8]),
            op("scores", "BatchMatMulV2", ["x", "x"], [B, 2, 5, 5], adj_y=True),
            op("xt", "Transpose", ["x", "perm"], [8, 2, 5, B]),
            const("perm", [3, 1, 2, 0]),
            op("grad", "BatchMatMulV2", ["xt", "x"], [8, 2, 5, 8]),
        ]
    )
    assert (axis("scores"), category("scores")) == (0, CONCAT)
    assert axis("xt") == 3
    assert category("grad") == NONE  # batch is the leading dim of one, a matrix dim of the other


@pytest.mark.parametrize(
    ("in_shape", "out_shape", "expected_axis"),
    [
        ([B, 5, 8], [B * 5, 8], 0),  # merge batch with the sequence
        ([B * 5, 8], [B, 40], 0),
        ([B, 4], [2, B * 2], -1),  # the batch is spread: lost
        ([3, B, 4], [3, B * 4], 1),
    ],
)
def test_reshape_follows_the_batch_block(in_shape, out_shape, expected_axis) -> None:
    batch_axis = in_shape.index(B) if B in in_shape else 0
    nodes = [
        placeholder("p", in_shape),
        const("shape", out_shape),
        op("r", "Reshape", ["p", "shape"], out_shape, Tshape={"type": "int32"}),
    ]
    if batch_axis == 0:
        axis, category, *_ = run(nodes, inputs=("p",))
    else:  # make p carry the batch on axis 1 through a transpose of a batch input
        nodes = [
            placeholder("x", [B, *in_shape[:1], *in_shape[2:]]),
            const("perm", [1, 0, 2]),
            op("p", "Transpose", ["x", "perm"], in_shape),
            *nodes[1:],
        ]
        axis, category, *_ = run(nodes)
    assert axis("r") == expected_axis
    assert category("r") == (CONCAT if expected_axis >= 0 else NONE)


def test_reductions() -> None:
    axis, category, aggregation, *_ = run(
        [
            placeholder("x", [B, 4]),
            const("batch_axis", [0]),
            const("feature_axis", [1]),
            op("sum_b", "Sum", ["x", "batch_axis"], [4]),
            op("mean_b", "Mean", ["x", "batch_axis"], [4]),
            op("mean_f", "Mean", ["x", "feature_axis"], [B]),
            op("max_f_kept", "Max", ["x", "feature_axis"], [B, 1], keep_dims=True),
        ]
    )
    assert (category("sum_b"), aggregation("sum_b")) == (SUM, Aggregation.SUM)
    assert (category("mean_b"), aggregation("mean_b")) == (NONE, Aggregation.LOST)
    assert (axis("mean_f"), category("mean_f")) == (0, CONCAT)
    assert axis("max_f_kept") == 0


def test_gradient_ops_sum_over_the_batch() -> None:
    axis, category, *_ = run(
        [
            placeholder("x", [B, 8, 8, 3]),
            placeholder("dy", [B, 8, 8, 16]),
            const("fshape", [3, 3, 3, 16]),
            op(
                "dfilter",
                "Conv2DBackpropFilter",
                ["x", "fshape", "dy"],
                [3, 3, 3, 16],
                strides=[1, 1, 1, 1],
                padding="SAME",
            ),
            op("dbias", "BiasAddGrad", ["dy"], [16]),
        ],
        inputs=("x", "dy"),
    )
    assert category("dfilter") == SUM
    assert category("dbias") == SUM


def test_batch_norm_splits_with_local_statistics() -> None:
    bn_outputs = [("float32", [B, 4, 4, 8])] + [("float32", [8])] * 5
    axis, category, aggregation, result, graph = run(
        [
            placeholder("x", [B, 4, 4, 8]),
            placeholder("scale", [8]),
            node(
                "bn",
                "FusedBatchNormV3",
                ["x", "scale", "scale", "scale", "scale"],
                bn_outputs,
                T=F32,
                U=F32,
                is_training=True,
            ),
        ]
    )
    assert (category("bn"), axis("bn")) == (CONCAT, 0)
    assert aggregation("bn", 1) == Aggregation.MEAN
    assert result.batch_statistics[graph.index["bn"]]


def test_gather_and_segment_sum_for_embeddings() -> None:
    axis, category, *_ = run(
        [
            placeholder("ids", [B, 5], dtype="int32"),
            placeholder("table", [100, 16]),
            const("zero", [0]),
            node(
                "emb",
                "GatherV2",
                ["table", "ids", "zero"],
                [("float32", [B, 5, 16])],
                Tparams=F32,
                Tindices={"type": "int32"},
                Taxis={"type": "int32"},
            ),
            const("flat", [B * 5, 16]),
            op("rows", "Reshape", ["emb", "flat"], [B * 5, 16]),
            const("flat_ids_shape", [B * 5]),
            node(
                "flat_ids",
                "Reshape",
                ["ids", "flat_ids_shape"],
                [("int32", [B * 5])],
                T={"type": "int32"},
            ),
            const("n", [100]),
            node(
                "dtable",
                "UnsortedSegmentSum",
                ["rows", "flat_ids", "n"],
                [("float32", [100, 16])],
                T=F32,
                Tindices={"type": "int32"},
            ),
        ],
        inputs=("ids",),
    )
    assert (axis("emb"), category("emb")) == (0, CONCAT)
    assert category("dtable") == SUM


def test_concat_along_the_batch_is_not_splittable() -> None:
    axis, category, *_ = run(
        [
            placeholder("x", [B, 4]),
            const("a0", [0]),
            const("a1", [1]),
            op("cat_features", "ConcatV2", ["x", "x", "a1"], [B, 8], N=2),
            op("cat_batch", "ConcatV2", ["x", "x", "a0"], [2 * B, 4], N=2),
        ]
    )
    assert (axis("cat_features"), category("cat_features")) == (0, CONCAT)
    assert category("cat_batch") == NONE


def test_unknown_and_shape_ops_are_never_split() -> None:
    axis, category, aggregation, *_ = run(
        [
            placeholder("x", [B, 4]),
            node("mystery", "MyCustomOp", ["x"], [("float32", [B, 4])]),
            node("shape", "Shape", ["x"], [("int32", [2])], T=F32, out_type={"type": "int32"}),
        ]
    )
    assert category("mystery") == NONE
    assert axis("mystery") == -1
    assert category("shape") == NONE


def test_batch_sized_tensors_built_from_constants_are_marked() -> None:
    """The mean's gradient: a scalar tiled over the batch meets the per-example loss."""
    axis, category, *_ = run(
        [
            placeholder("x", [B]),
            placeholder("g", [1]),
            const("multiples", [B]),
            op("tiled", "Tile", ["g", "multiples"], [B], Tmultiples={"type": "int32"}),
            op("scaled", "RealDiv", ["tiled", "g"], [B]),
            op("prod", "Mul", ["x", "scaled"], [B]),
        ]
    )
    assert axis("prod") == 0
    assert axis("scaled") == 0 and category("scaled") == CONCAT
    assert axis("tiled") == 0 and category("tiled") == NONE  # made from non-batch inputs
