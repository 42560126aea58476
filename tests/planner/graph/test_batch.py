"""Batch-axis propagation and TAG §4.1.1 split categories, op family by op family."""

from __future__ import annotations

import pytest

from tagplan.planner.graph.batch import Aggregation, SplitCategory, propagate_batch
from tagplan.planner.graph.parsed import parse_graph
from tests.planner.graph.builders import F32, const, document, graph_def, node, op, placeholder

B = 6
CONCAT, SUM, NONE = SplitCategory.SPLIT_CONCAT, SplitCategory.SPLIT_SUM, SplitCategory.NONE


class Probe:
    """Propagation results over a hand-built graph, looked up by node name."""

    def __init__(self, nodes: list[dict], inputs: tuple[str, ...] = ("x",)) -> None:
        self.graph = parse_graph(graph_def(document(nodes)))
        self.result = propagate_batch(
            self.graph,
            batch_inputs=[self.graph.index[n] for n in inputs],
            graph_batch_size=B,
            stateful=[False] * self.graph.num_nodes,
        )

    def axis(self, name: str, slot: int = 0) -> int:
        return self.result.axis(self.graph.index[name], slot)

    def category(self, name: str) -> SplitCategory:
        return SplitCategory(int(self.result.category[self.graph.index[name]]))

    def aggregation(self, name: str, slot: int = 0) -> Aggregation:
        offset = self.result.output_offset[self.graph.index[name]]
        return Aggregation(int(self.result.aggregation[offset + slot]))

    def batch_statistics(self, name: str) -> bool:
        return bool(self.result.batch_statistics[self.graph.index[name]])


def test_matmul_rows_concat_and_batch_contraction_sums() -> None:
    p = Probe(
        [
            placeholder("x", [B, 4]),
            placeholder("w", [4, 3]),
            op("y", "MatMul", ["x", "w"], [B, 3]),
            op("dw", "MatMul", ["x", "y"], [4, 3], transpose_a=True),
            op("yt", "MatMul", ["w", "x"], [3, B], transpose_a=True, transpose_b=True),
            op("outer", "MatMul", ["x", "x"], [B, B], transpose_b=True),
        ]
    )
    assert (p.axis("y"), p.category("y")) == (0, CONCAT)
    assert (p.axis("dw"), p.category("dw"), p.aggregation("dw")) == (-1, SUM, Aggregation.SUM)
    assert (p.axis("yt"), p.category("yt")) == (1, CONCAT)
    assert p.category("outer") == NONE  # every row meets every other row: not splittable


def test_batch_matmul_keeps_leading_batch_and_sums_contraction() -> None:
    p = Probe(
        [
            placeholder("x", [B, 2, 5, 8]),
            op("scores", "BatchMatMulV2", ["x", "x"], [B, 2, 5, 5], adj_y=True),
            op("xt", "Transpose", ["x", "perm"], [8, 2, 5, B]),
            const("perm", [3, 1, 2, 0]),
            op("grad", "BatchMatMulV2", ["xt", "x"], [8, 2, 5, 8]),
        ]
    )
    assert (p.axis("scores"), p.category("scores")) == (0, CONCAT)
    assert p.axis("xt") == 3
    assert p.category("grad") == NONE  # batch is the leading dim of one, a matrix dim of the other


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
        p = Probe(nodes, inputs=("p",))
    else:  # make p carry the batch on axis 1 through a transpose of a batch input
        nodes = [
            placeholder("x", [B, *in_shape[:1], *in_shape[2:]]),
            const("perm", [1, 0, 2]),
            op("p", "Transpose", ["x", "perm"], in_shape),
            *nodes[1:],
        ]
        p = Probe(nodes)
    assert p.axis("r") == expected_axis
    assert p.category("r") == (CONCAT if expected_axis >= 0 else NONE)


def test_reductions() -> None:
    p = Probe(
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
    assert (p.category("sum_b"), p.aggregation("sum_b")) == (SUM, Aggregation.SUM)
    assert (p.category("mean_b"), p.aggregation("mean_b")) == (NONE, Aggregation.LOST)
    assert (p.axis("mean_f"), p.category("mean_f")) == (0, CONCAT)
    assert p.axis("max_f_kept") == 0


def test_gradient_ops_sum_over_the_batch() -> None:
    p = Probe(
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
    assert p.category("dfilter") == SUM
    assert p.category("dbias") == SUM


def test_batch_norm_splits_with_local_statistics() -> None:
    bn_outputs = [("float32", [B, 4, 4, 8])] + [("float32", [8])] * 5
    p = Probe(
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
    assert (p.category("bn"), p.axis("bn")) == (CONCAT, 0)
    assert p.aggregation("bn", 1) == Aggregation.MEAN
    assert p.batch_statistics("bn")


def test_gather_and_segment_sum_for_embeddings() -> None:
    p = Probe(
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
    assert (p.axis("emb"), p.category("emb")) == (0, CONCAT)
    assert p.category("dtable") == SUM


def test_the_gradient_of_a_gather_with_batch_dims_keeps_the_batch() -> None:
    """TensorFlow's gradient of ``gather(params, positions, batch_dims=1)`` (BERT's
    masked-LM head): it moves the gathered axis with a permutation computed from ranges
    and sizes, offsets each example's positions by its row (a range over the examples)
    and sums the values into one segment per (example, position), then reshapes back. The
    permutation is evaluated, the range counts each replica's own rows, and the segment
    sum carries the batch (a leading block of rows), so all of it splits by examples."""
    S, M, H = 5, 2, 4
    i32 = {"type": "int32"}
    p = Probe(
        [
            placeholder("params", [B, S, H]),
            placeholder("positions", [B, M], dtype="int32"),
            placeholder("grad", [B, M, H]),
            const("zero", [0]),
            const("one", [1]),
            const("two", [2]),
            const("three", [3]),
            node("outer", "Range", ["zero", "one", "one"], [("int32", [1])], Tidx=i32),
            node("moved_axis", "Pack", ["one"], [("int32", [1])], N=1, axis=0, T=i32),
            node("inner", "Range", ["two", "three", "one"], [("int32", [1])], Tidx=i32),
            node(
                "perm",
                "ConcatV2",
                ["outer", "moved_axis", "inner", "zero"],
                [("int32", [3])],
                N=3,
                T=i32,
                Tidx=i32,
            ),
            op("moved", "Transpose", ["grad", "perm"], [B, M, H], Tperm=i32),
            const("flat_shape", [B * M, H]),
            op("values", "Reshape", ["moved", "flat_shape"], [B * M, H], Tshape=i32),
            const("batch", [B]),
            node("examples", "Range", ["zero", "batch", "one"], [("int32", [B])], Tidx=i32),
            node("column", "ExpandDims", ["examples", "one"], [("int32", [B, 1])], T=i32, Tdim=i32),
            const("length", [S]),
            node("offsets", "Mul", ["column", "length"], [("int32", [B, 1])], T=i32),
            node("ids", "AddV2", ["positions", "offsets"], [("int32", [B, M])], T=i32),
            const("ids_shape", [B * M]),
            node(
                "flat_ids", "Reshape", ["ids", "ids_shape"], [("int32", [B * M])], T=i32, Tshape=i32
            ),
            const("segments", [B * S]),
            node(
                "summed",
                "UnsortedSegmentSum",
                ["values", "flat_ids", "segments"],
                [("float32", [B * S, H])],
                T=F32,
                Tindices=i32,
                Tnumsegments=i32,
            ),
            const("back", [B, S, H]),
            op("dparams", "Reshape", ["summed", "back"], [B, S, H], Tshape=i32),
            op("total", "AddV2", ["dparams", "params"], [B, S, H]),
        ],
        inputs=("params", "positions", "grad"),
    )
    assert (p.axis("moved"), p.category("moved")) == (0, CONCAT)
    assert (p.axis("examples"), p.category("examples")) == (0, CONCAT)
    assert p.category("outer") == NONE  # a range that is not the examples'
    assert (p.axis("summed"), p.category("summed")) == (0, CONCAT)
    assert p.aggregation("summed") == Aggregation.CONCAT
    assert (p.axis("dparams"), p.category("dparams")) == (0, CONCAT)


def test_concat_along_the_batch_is_not_splittable() -> None:
    p = Probe(
        [
            placeholder("x", [B, 4]),
            const("a0", [0]),
            const("a1", [1]),
            op("cat_features", "ConcatV2", ["x", "x", "a1"], [B, 8], N=2),
            op("cat_batch", "ConcatV2", ["x", "x", "a0"], [2 * B, 4], N=2),
        ]
    )
    assert (p.axis("cat_features"), p.category("cat_features")) == (0, CONCAT)
    assert p.category("cat_batch") == NONE


def test_unknown_ops_are_never_split_and_shape_ops_describe_their_replica() -> None:
    p = Probe(
        [
            placeholder("x", [B, 4]),
            node("mystery", "MyCustomOp", ["x"], [("float32", [B, 4])]),
            node("shape", "Shape", ["x"], [("int32", [2])], T=F32, out_type={"type": "int32"}),
        ]
    )
    assert p.category("mystery") == NONE
    assert p.axis("mystery") == -1
    # a replica's Shape reads its own slice (what a split Conv2DBackpropInput needs)
    assert p.category("shape") == CONCAT
    assert p.aggregation("shape") == Aggregation.LOCAL


def test_batch_sized_tensors_built_from_constants_are_marked() -> None:
    """The mean's gradient: a scalar tiled over the batch meets the per-example loss."""
    p = Probe(
        [
            placeholder("x", [B]),
            placeholder("g", [1]),
            const("multiples", [B]),
            op("tiled", "Tile", ["g", "multiples"], [B], Tmultiples={"type": "int32"}),
            op("scaled", "RealDiv", ["tiled", "g"], [B]),
            op("prod", "Mul", ["x", "scaled"], [B]),
        ]
    )
    assert p.axis("prod") == 0
    assert p.axis("scaled") == 0 and p.category("scaled") == CONCAT
    assert p.axis("tiled") == 0 and p.category("tiled") == NONE  # made from non-batch inputs


def test_a_zero_initial_state_concatenated_with_the_batch_carries_it() -> None:
    """A static RNN's first step concatenates its input with ``zeros([batch, units])``:
    the constant is split with the batch like the data beside it."""
    p = Probe(
        [
            placeholder("x", [B, 4]),
            op("h0", "Const", [], [B, 2]),
            const("axis", [1]),
            op("xh", "ConcatV2", ["x", "h0", "axis"], [B, 6], N=2, Tidx={"type": "int32"}),
        ]
    )
    assert (p.axis("xh"), p.axis("h0")) == (0, 0)


def test_linear_ops_over_partial_sums_are_split_sum() -> None:
    """Per-step weight gradients of an unrolled RNN, each summed over the batch, are added
    up (``AddN``) and reshaped: linear in the partials, so split-sum. Adding a value every
    replica has in full would count it once per replica: not split."""
    p = Probe(
        [
            placeholder("x", [B, 4]),
            placeholder("dy", [B, 3]),
            placeholder("w", [4, 3]),
            op("dw_0", "MatMul", ["x", "dy"], [4, 3], transpose_a=True),
            op("dw_1", "MatMul", ["x", "dy"], [4, 3], transpose_a=True),
            op("dw", "AddN", ["dw_0", "dw_1"], [4, 3], N=2),
            const("flat", [12]),
            op("dw_flat", "Reshape", ["dw", "flat"], [12], Tshape={"type": "int32"}),
            op("dw_plus_w", "AddV2", ["dw", "w"], [4, 3]),
        ],
        inputs=("x", "dy"),
    )
    for name in ("dw", "dw_flat"):
        assert (p.axis(name), p.category(name), p.aggregation(name)) == (-1, SUM, Aggregation.SUM)
    assert (p.category("dw_plus_w"), p.aggregation("dw_plus_w")) == (
        NONE,
        Aggregation.REPLICATED,
    )
