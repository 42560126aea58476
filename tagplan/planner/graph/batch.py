"""Which tensors carry the batch dimension, and how each op may be split over it.

TAG §4.1.1 sorts ops into three categories: *split-concat* (accepts inputs split in the
batch dimension; outputs concatenate back), *split-sum* (accepts split inputs; outputs
must be summed, e.g. ``Conv2DBackpropFilter``) and *none* (needs full inputs; apply ops
are here). The category follows from where the batch dimension goes through each op, so
this module propagates a *batch axis* per tensor from the data inputs in topological
order. Common op families have exact rules (matrix products, reductions, reshapes,
transposes, gathers, ...); any other op TensorFlow knows uses a shape rule (the output
keeps the batch axis when it keeps its size), and an op TensorFlow does not know gets the
safe category *none*.

A second pass runs backwards: a tensor without a batch input that meets a batch tensor in
an elementwise op with the batch size at the same position (the ``Tile`` that broadcasts
the loss gradient over the batch), or is concatenated with one along another axis (a
recurrent network's initial state of zeros), is batch-sized too: it is scaled with the batch size
and split for replicas like the data it meets.

Every output also gets an *aggregation*: how the outputs of the replicas of a split op
recover the full tensor (concatenate on the batch axis, sum, average, or identical on
every replica). An output that none of these recovers makes its op *none*.

A linear op all of whose inputs are partial sums (the ``AddN`` that adds up a recurrent
weight's gradient over the time steps, each step's gradient summed over the batch) is
*split-sum* too: each replica adds up its own partials and the sum over replicas is
taken once, on the result, instead of once per partial.

Why one module: every op family's rule reads and writes the same per-output arrays in one
pass; the rules are a table, one short method each, best read side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from tagplan.planner.graph.constants import const_ints
from tagplan.planner.graph.parsed import ParsedGraph, Shape, attr_value

__all__ = [
    "Aggregation",
    "BatchAnalysis",
    "SplitCategory",
    "propagate_batch",
]


class SplitCategory(IntEnum):
    """TAG §4.1.1's op categories."""

    SPLIT_CONCAT = 0
    SPLIT_SUM = 1
    NONE = 2

    @property
    def label(self) -> str:
        return ("split-concat", "split-sum", "none")[self]


class Aggregation(IntEnum):
    """How the outputs of an op's replicas give back the full tensor."""

    CONCAT = 0  # concatenate on the batch axis
    SUM = 1  # partial sums over the local batch: add them
    MEAN = 2  # per-replica batch statistics: average them (batch norm)
    REPLICATED = 3  # does not depend on the split: every replica has the full value
    LOST = 4  # no aggregation recovers it: the op must not be split
    LOCAL = 5  # describes the replica's own slice (its shape): read by that replica


NO_AXIS = -1
_OutputRule = tuple[list[int], list[Aggregation]]


@dataclass(eq=False)
class BatchAnalysis:
    """Per-output batch axes and aggregations, flattened over ``(node, slot)``.

    ``output_offset[n] + slot`` indexes the flat arrays for output ``slot`` of node ``n``.
    """

    graph_batch_size: int
    output_offset: np.ndarray  # int64, len num_nodes + 1
    batch_axis: np.ndarray  # int8 per output, NO_AXIS when it does not carry the batch
    aggregation: np.ndarray  # int8 per output (Aggregation)
    batch_statistics: np.ndarray  # bool per node: splitting changes batch statistics
    category: np.ndarray  # int8 per node (SplitCategory)

    def axis(self, node: int, slot: int) -> int:
        return int(self.batch_axis[self.output_offset[node] + slot])


# --- op families -------------------------------------------------------------------------

# fmt: off
_ELEMENTWISE = frozenset({
    "Abs", "Acos", "Acosh", "Add", "AddN", "AddV2", "Asin", "Asinh", "Atan", "Atan2", "Atanh",
    "BiasAdd", "BiasAddV1", "Cast", "Ceil", "CheckNumerics", "ClipByValue", "Cos", "Cosh",
    "DivNoNan", "Div", "Elu", "EluGrad", "Equal", "Erf", "Erfc", "Exp", "Expm1", "Floor",
    "FloorDiv", "FloorMod", "Gelu", "GeluGrad", "Greater", "GreaterEqual", "Identity", "Inv",
    "InvGrad", "IsFinite", "IsInf", "IsNan", "LeakyRelu", "LeakyReluGrad", "Less", "LessEqual",
    "Log", "Log1p", "LogicalAnd", "LogicalNot", "LogicalOr", "Maximum", "Minimum", "Mod", "Mul",
    "MulNoNan", "Neg", "NotEqual", "OnesLike", "Pow", "PreventGradient", "RealDiv",
    "Reciprocal", "ReciprocalGrad", "Relu", "Relu6", "Relu6Grad", "ReluGrad", "Rint", "Round",
    "Rsqrt", "RsqrtGrad", "Select", "SelectV2", "Selu", "SeluGrad", "Sigmoid", "SigmoidGrad",
    "Sign", "Sin", "Sinh", "Snapshot", "Softplus", "SoftplusGrad", "Softsign", "SoftsignGrad",
    "Sqrt", "SqrtGrad", "Square", "SquaredDifference", "StopGradient", "Sub", "Tan", "Tanh",
    "TanhGrad", "TruncateDiv", "Xdivy", "Xlog1py", "Xlogy", "ZerosLike", "EnsureShape",
})
# fmt: on
_SUM_REDUCTIONS = frozenset({"Sum"})
_OTHER_REDUCTIONS = frozenset({"Mean", "Max", "Min", "Prod", "All", "Any", "EuclideanNorm"})
_FILTER_GRADIENTS = frozenset(
    {
        "Conv2DBackpropFilter",
        "Conv3DBackpropFilterV2",
        "DepthwiseConv2dNativeBackpropFilter",
        "Conv2DBackpropFilterV2",
        "BiasAddGrad",
        "L2Loss",
    }
)
_BATCH_NORMS = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
_BATCH_NORM_GRADS = frozenset(
    {"FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"}
)
# Linear ops: partial sums in, the partial sum of the result out; the second family
# rearranges its first input by arguments every replica has alike (a shape, axes).
_LINEAR = frozenset({"AddN", "Add", "AddV2", "Sub", "Neg", "Identity", "Snapshot"})
_LINEAR_IN_FIRST = frozenset({"Reshape", "ExpandDims", "Squeeze", "Transpose"})
# Ops whose output describes the input's shape: split, each replica gets its own slice's.
_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "BroadcastGradientArgs"})
# Elementwise-like ops along which the backward pass marks batch-sized inputs.
_ALIGNED = _ELEMENTWISE


def _aligned_axis(in_rank: int, in_axis: int, out_rank: int) -> int:
    return out_rank - in_rank + in_axis


def _reduction_axes(graph: ParsedGraph, node: int, rank: int) -> list[int] | None:
    producer, slot = graph.data_inputs[node][1]
    axes = const_ints(graph, producer, slot)
    if axes is None:
        return None
    return sorted({a % rank for a in axes}) if rank else []


class _Propagator:
    def __init__(self, graph: ParsedGraph, batch_size: int) -> None:
        self.graph = graph
        self.batch = batch_size
        self.offset = np.zeros(graph.num_nodes + 1, dtype=np.int64)
        self.offset[1:] = np.cumsum([len(d) for d in graph.output_dtypes])
        total = int(self.offset[-1])
        self.axis = np.full(total, NO_AXIS, dtype=np.int8)
        self.aggregation = np.full(total, Aggregation.REPLICATED, dtype=np.int8)
        self.batch_statistics = np.zeros(graph.num_nodes, dtype=bool)
        self.category = np.full(graph.num_nodes, SplitCategory.NONE, dtype=np.int8)
        self.accumulates = np.zeros(graph.num_nodes, dtype=bool)
        self.rules: dict[str, Callable[[int], _OutputRule | None]] = {}
        for ops, rule in (
            (("MatMul",), self._matmul),
            (("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"), self._batch_matmul),
            (_SUM_REDUCTIONS | _OTHER_REDUCTIONS, self._reduction),
            (_FILTER_GRADIENTS, self._sum_all),
            (_BATCH_NORMS, self._batch_norm),
            (_BATCH_NORM_GRADS, self._batch_norm_grad),
            (("Reshape",), self._reshape),
            (("Transpose",), self._transpose),
            (("ConcatV2",), self._concat),
            (("Pack",), self._pack),
            (("Unpack",), self._unpack),
            (("Split", "SplitV"), self._split),
            (("ExpandDims",), self._expand_dims),
            (("Squeeze",), self._squeeze),
            (("GatherV2", "ResourceGather", "Gather"), self._gather),
            (("UnsortedSegmentSum",), self._segment_sum),
            (("Tile",), self._tile),
            (("Pad", "PadV2", "MirrorPad"), self._pad),
        ):
            for op in ops:
                self.rules[op] = rule

    # helpers ------------------------------------------------------------------------------
    def shape(self, node: int, slot: int) -> Shape:
        return self.graph.output_shapes[node][slot]

    def in_axis(self, node: int, position: int) -> int:
        producer, slot = self.graph.data_inputs[node][position]
        return int(self.axis[self.offset[producer] + slot])

    def in_shape(self, node: int, position: int) -> Shape:
        producer, slot = self.graph.data_inputs[node][position]
        return self.shape(producer, slot)

    def outputs(self, node: int) -> int:
        return len(self.graph.output_dtypes[node])

    def first_batch_input(self, node: int) -> tuple[int, int] | None:
        for position in range(len(self.graph.data_inputs[node])):
            axis = self.in_axis(node, position)
            if axis != NO_AXIS:
                return position, axis
        return None

    def sums_partials(self, node: int) -> bool:
        """A linear op with one output whose every input is a partial sum (see the module
        docstring)."""
        inputs = self.graph.data_inputs[node]
        if self.outputs(node) != 1 or not inputs:
            return False
        kinds = [
            Aggregation.SUM
            if self.aggregation[self.offset[p] + s] == Aggregation.SUM
            and self.axis[self.offset[p] + s] == NO_AXIS
            else self.aggregation[self.offset[p] + s]
            for p, s in inputs
        ]
        op = self.graph.ops[node]
        if op in _LINEAR:
            return all(k == Aggregation.SUM for k in kinds)
        return (
            op in _LINEAR_IN_FIRST
            and kinds[0] == Aggregation.SUM
            and all(k == Aggregation.REPLICATED for k in kinds[1:])
        )

    def _lost(self, node: int) -> _OutputRule:
        n = self.outputs(node)
        return [NO_AXIS] * n, [Aggregation.LOST] * n

    def _concat_at(self, node: int, axes: list[int]) -> _OutputRule:
        return axes, [Aggregation.CONCAT if a != NO_AXIS else Aggregation.LOST for a in axes]

    # rules: each returns per-output (axis, aggregation), or None for the shape rule ----
    def _matmul(self, node: int) -> _OutputRule | None:
        transpose_a = bool(attr_value(self.graph.nodes[node], "transpose_a", False))
        transpose_b = bool(attr_value(self.graph.nodes[node], "transpose_b", False))
        a_axis, b_axis = self.in_axis(node, 0), self.in_axis(node, 1)
        a_rows, a_inner = (1, 0) if transpose_a else (0, 1)
        b_inner, b_cols = (1, 0) if transpose_b else (0, 1)
        if a_axis == a_inner and b_axis == b_inner:
            return [NO_AXIS], [Aggregation.SUM]
        if a_axis == a_rows and b_axis == NO_AXIS:
            return [0], [Aggregation.CONCAT]
        if b_axis == b_cols and a_axis == NO_AXIS:
            return [1], [Aggregation.CONCAT]
        return self._lost(node)

    def _batch_matmul(self, node: int) -> _OutputRule | None:
        x_shape, y_shape = self.in_shape(node, 0), self.in_shape(node, 1)
        out_shape = self.shape(node, 0)
        if x_shape is None or y_shape is None or out_shape is None:
            return self._lost(node)
        adj_x = bool(attr_value(self.graph.nodes[node], "adj_x", False))
        adj_y = bool(attr_value(self.graph.nodes[node], "adj_y", False))
        x_axis, y_axis = self.in_axis(node, 0), self.in_axis(node, 1)
        xr, yr, outr = len(x_shape), len(y_shape), len(out_shape)
        x_rows, x_inner = (xr - 1, xr - 2) if adj_x else (xr - 2, xr - 1)
        y_inner, y_cols = (yr - 1, yr - 2) if adj_y else (yr - 2, yr - 1)
        if x_axis == x_inner and y_axis == y_inner:
            return [NO_AXIS], [Aggregation.SUM]
        leading = [
            _aligned_axis(rank, axis, outr)
            for rank, axis in ((xr, x_axis), (yr, y_axis))
            if axis != NO_AXIS and axis < rank - 2
        ]
        matrix_batch = (x_axis != NO_AXIS and x_axis >= xr - 2) or (
            y_axis != NO_AXIS and y_axis >= yr - 2
        )
        if leading and not matrix_batch and len(set(leading)) == 1:
            return [leading[0]], [Aggregation.CONCAT]
        if x_axis == x_rows and y_axis == NO_AXIS:
            return [outr - 2], [Aggregation.CONCAT]
        if y_axis == y_cols and x_axis == NO_AXIS:
            return [outr - 1], [Aggregation.CONCAT]
        return self._lost(node)

    def _reduction(self, node: int) -> _OutputRule | None:
        axis = self.in_axis(node, 0)
        in_shape = self.in_shape(node, 0)
        if axis == NO_AXIS or in_shape is None:
            return self._lost(node)
        axes = _reduction_axes(self.graph, node, len(in_shape))
        if axes is None:
            return self._lost(node)
        if axis in axes:
            exact = self.graph.ops[node] in _SUM_REDUCTIONS
            return [NO_AXIS], [Aggregation.SUM if exact else Aggregation.LOST]
        keep = bool(attr_value(self.graph.nodes[node], "keep_dims", False))
        return [axis if keep else axis - sum(1 for a in axes if a < axis)], [Aggregation.CONCAT]

    def _sum_all(self, node: int) -> _OutputRule | None:
        return [NO_AXIS] * self.outputs(node), [Aggregation.SUM] * self.outputs(node)

    def _batch_norm(self, node: int) -> _OutputRule | None:
        if self.in_axis(node, 0) != 0:
            return self._lost(node)
        n = self.outputs(node)
        if bool(attr_value(self.graph.nodes[node], "is_training", True)):
            # Batch statistics over the local batch, as every data-parallel framework does.
            self.batch_statistics[node] = True
            return [0] + [NO_AXIS] * (n - 1), [Aggregation.CONCAT] + [Aggregation.MEAN] * (n - 1)
        return [0] + [NO_AXIS] * (n - 1), [Aggregation.CONCAT] + [Aggregation.REPLICATED] * (n - 1)

    def _batch_norm_grad(self, node: int) -> _OutputRule | None:
        if self.in_axis(node, 0) != 0:
            return self._lost(node)
        n = self.outputs(node)
        aggregations = [Aggregation.CONCAT, Aggregation.SUM, Aggregation.SUM]
        return [0] + [NO_AXIS] * (n - 1), aggregations + [Aggregation.REPLICATED] * (n - 3)

    def _reshape(self, node: int) -> _OutputRule | None:
        axis = self.in_axis(node, 0)
        in_shape, out_shape = self.in_shape(node, 0), self.shape(node, 0)
        if axis == NO_AXIS or in_shape is None or out_shape is None or -1 in out_shape:
            return self._lost(node)
        before = int(np.prod(in_shape[:axis], dtype=np.int64))
        running = 1
        for j, size in enumerate(out_shape):
            if running == before and size % self.batch == 0 and size > 0:
                return [j], [Aggregation.CONCAT]
            running *= size
            if running > before:
                break
        return self._lost(node)

    def _transpose(self, node: int) -> _OutputRule | None:
        axis = self.in_axis(node, 0)
        producer, slot = self.graph.data_inputs[node][1]
        perm = const_ints(self.graph, producer, slot)
        if axis == NO_AXIS or perm is None or axis not in perm:
            return self._lost(node)
        return [perm.index(axis)], [Aggregation.CONCAT]

    def _axis_const(self, node: int, position: int, rank: int) -> int | None:
        producer, slot = self.graph.data_inputs[node][position]
        values = const_ints(self.graph, producer, slot)
        if not values or rank <= 0:
            return None
        return values[0] % rank

    def _concat(self, node: int) -> _OutputRule | None:
        inputs = self.graph.data_inputs[node]
        out_shape = self.shape(node, 0)
        if out_shape is None:
            return self._lost(node)
        concat_axis = self._axis_const(node, len(inputs) - 1, len(out_shape))
        axes = {self.in_axis(node, p) for p in range(len(inputs) - 1)} - {NO_AXIS}
        if concat_axis is None or len(axes) != 1 or concat_axis in axes:
            return self._lost(node)
        return [axes.pop()], [Aggregation.CONCAT]

    def _pack(self, node: int) -> _OutputRule | None:
        axes = {self.in_axis(node, p) for p in range(len(self.graph.data_inputs[node]))}
        axes.discard(NO_AXIS)
        out_shape = self.shape(node, 0)
        if len(axes) != 1 or out_shape is None:
            return self._lost(node)
        axis = axes.pop()
        pack_axis = int(attr_value(self.graph.nodes[node], "axis", 0)) % len(out_shape)
        return [axis if axis < pack_axis else axis + 1], [Aggregation.CONCAT]

    def _unpack(self, node: int) -> _OutputRule | None:
        axis, in_shape = self.in_axis(node, 0), self.in_shape(node, 0)
        if in_shape is None:
            return self._lost(node)
        unpack_axis = int(attr_value(self.graph.nodes[node], "axis", 0)) % len(in_shape)
        if axis == unpack_axis:
            return self._lost(node)
        out_axis = axis if axis < unpack_axis else axis - 1
        return self._concat_at(node, [out_axis] * self.outputs(node))

    def _split(self, node: int) -> _OutputRule | None:
        value_position, dim_position = (1, 0) if self.graph.ops[node] == "Split" else (0, 2)
        axis, in_shape = self.in_axis(node, value_position), self.in_shape(node, value_position)
        if axis == NO_AXIS or in_shape is None:
            return self._lost(node)
        if self._axis_const(node, dim_position, len(in_shape)) in (None, axis):
            return self._lost(node)
        return self._concat_at(node, [axis] * self.outputs(node))

    def _expand_dims(self, node: int) -> _OutputRule | None:
        axis, out_shape = self.in_axis(node, 0), self.shape(node, 0)
        if out_shape is None:
            return self._lost(node)
        new_axis = self._axis_const(node, 1, len(out_shape))
        if new_axis is None:
            return self._lost(node)
        return [axis if axis < new_axis else axis + 1], [Aggregation.CONCAT]

    def _squeeze(self, node: int) -> _OutputRule | None:
        axis, in_shape = self.in_axis(node, 0), self.in_shape(node, 0)
        if in_shape is None:
            return self._lost(node)
        dims = attr_value(self.graph.nodes[node], "squeeze_dims", []) or [
            i for i, size in enumerate(in_shape) if size == 1
        ]
        dims = [d % len(in_shape) for d in dims]
        if axis in dims:
            return self._lost(node)
        return [axis - sum(1 for d in dims if d < axis)], [Aggregation.CONCAT]

    def _gather(self, node: int) -> _OutputRule | None:
        params_axis, indices_axis = self.in_axis(node, 0), self.in_axis(node, 1)
        params_shape = self.in_shape(node, 0)
        gather_axis = 0
        if self.graph.ops[node] == "GatherV2":
            rank = len(params_shape) if params_shape is not None else 0
            found = self._axis_const(node, 2, rank) if rank else None
            if found is None:
                return self._lost(node)
            gather_axis = found
        indices_shape = self.in_shape(node, 1)
        batch_dims = int(attr_value(self.graph.nodes[node], "batch_dims", 0))
        if batch_dims > 0 and params_axis == indices_axis and 0 <= params_axis < batch_dims:
            # per-example gather (e.g. BERT's masked positions): the batch stays in front
            return [params_axis], [Aggregation.CONCAT]
        if params_axis == NO_AXIS and indices_axis != NO_AXIS:
            return [gather_axis + indices_axis], [Aggregation.CONCAT]
        if indices_axis == NO_AXIS and params_axis not in (NO_AXIS, gather_axis):
            if indices_shape is None:
                return self._lost(node)
            shift = len(indices_shape) - 1
            return [params_axis if params_axis < gather_axis else params_axis + shift], [
                Aggregation.CONCAT
            ]
        return self._lost(node)

    def _segment_sum(self, node: int) -> _OutputRule | None:
        data_axis, ids_axis = self.in_axis(node, 0), self.in_axis(node, 1)
        if data_axis == ids_axis and data_axis != NO_AXIS:
            return [NO_AXIS], [Aggregation.SUM]
        return self._lost(node)

    def _tile(self, node: int) -> _OutputRule | None:
        axis = self.in_axis(node, 0)
        producer, slot = self.graph.data_inputs[node][1]
        multiples = const_ints(self.graph, producer, slot)
        if axis == NO_AXIS or multiples is None or multiples[axis] != 1:
            return self._lost(node)
        return [axis], [Aggregation.CONCAT]

    def _pad(self, node: int) -> _OutputRule | None:
        axis = self.in_axis(node, 0)
        producer, slot = self.graph.data_inputs[node][1]
        paddings = const_ints(self.graph, producer, slot)
        if axis == NO_AXIS or paddings is None or paddings[2 * axis : 2 * axis + 2] != [0, 0]:
            return self._lost(node)
        return [axis], [Aggregation.CONCAT]

    def _shape_rule(self, node: int) -> _OutputRule:
        """Default for ops TensorFlow knows: an output keeps the batch axis of an input
        when it has the same size at the same (right-aligned for elementwise ops) position."""
        found = self.first_batch_input(node)
        assert found is not None
        position, axis = found
        in_shape = self.in_shape(node, position)
        aligned = self.graph.ops[node] in _ALIGNED
        axes: list[int] = []
        for slot in range(self.outputs(node)):
            out_shape = self.shape(node, slot)
            out_axis = NO_AXIS
            if in_shape is not None and out_shape is not None:
                target = _aligned_axis(len(in_shape), axis, len(out_shape)) if aligned else axis
                if 0 <= target < len(out_shape) and out_shape[target] == in_shape[axis]:
                    out_axis = target
            axes.append(out_axis)
        return self._concat_at(node, axes)

    # passes -------------------------------------------------------------------------------
    def forward(self, batch_inputs: list[int], known_op: list[bool]) -> None:
        graph = self.graph
        inputs = set(batch_inputs)
        for node in graph.topo_order.tolist():
            start = self.offset[node]
            if node in inputs:
                for slot, shape in enumerate(graph.output_shapes[node]):
                    if shape is not None and len(shape) >= 1:
                        self.axis[start + slot] = 0
                        self.aggregation[start + slot] = Aggregation.CONCAT
                continue
            if self.first_batch_input(node) is None:
                if known_op[node] and self.sums_partials(node):
                    self.aggregation[start] = Aggregation.SUM
                    self.accumulates[node] = True
                continue
            op = graph.ops[node]
            if op in _SHAPE_OPS:
                # a replica reads the shape of its own slice, as its split ops need
                count = self.outputs(node)
                rule: _OutputRule = ([NO_AXIS] * count, [Aggregation.LOCAL] * count)
            elif not known_op[node]:
                rule = self._lost(node)
            else:
                found = self.rules[op](node) if op in self.rules else None
                rule = found if found is not None else self._shape_rule(node)
            axes, aggregations = rule
            self.axis[start : start + len(axes)] = axes
            self.aggregation[start : start + len(axes)] = aggregations

    def _input_axis(self, node: int, position: int, out_axis: int) -> int:
        """The axis of input ``position`` that becomes ``out_axis`` of output 0, or NO_AXIS."""
        op = self.graph.ops[node]
        out_shape, shape = self.shape(node, 0), self.in_shape(node, position)
        if out_shape is None or shape is None:
            return NO_AXIS
        if op in _ALIGNED:
            axis = _aligned_axis(len(out_shape), out_axis, len(shape))
        elif op == "ExpandDims" and position == 0:
            new_axis = self._axis_const(node, 1, len(out_shape))
            if new_axis is None or new_axis == out_axis:
                return NO_AXIS
            axis = out_axis if out_axis < new_axis else out_axis - 1
        elif op == "Transpose" and position == 0:
            producer, slot = self.graph.data_inputs[node][1]
            perm = const_ints(self.graph, producer, slot)
            axis = perm[out_axis] if perm is not None else NO_AXIS
        elif op == "ConcatV2" and position < len(self.graph.data_inputs[node]) - 1:
            # an initial state of zeros concatenated with a step's input (a static RNN)
            count = len(self.graph.data_inputs[node])
            if self._axis_const(node, count - 1, len(out_shape)) in (None, out_axis):
                return NO_AXIS
            axis = out_axis
        elif op == "Reshape" and position == 0 and out_axis == 0 and shape:
            # a leading batch block keeps its rows through a reshape, whatever its width
            return 0 if shape[0] % self.batch == 0 else NO_AXIS
        else:
            return NO_AXIS
        if 0 <= axis < len(shape) and shape[axis] == out_shape[out_axis] > 1:
            return axis
        return NO_AXIS

    def backward(self) -> None:
        """Mark batch-sized tensors that meet batch tensors in elementwise ops."""
        graph = self.graph
        for node in graph.topo_order[::-1].tolist():
            if not graph.output_dtypes[node]:
                continue
            out_axis = int(self.axis[self.offset[node]])
            if out_axis == NO_AXIS:
                continue
            for position, (producer, slot) in enumerate(graph.data_inputs[node]):
                index = self.offset[producer] + slot
                if self.axis[index] != NO_AXIS:
                    continue
                axis = self._input_axis(node, position, out_axis)
                if axis != NO_AXIS:
                    self.axis[index] = axis
                    self.aggregation[index] = Aggregation.CONCAT

    def counts_rows(self, node: int) -> bool:
        """A ``Range(0, n, 1)`` whose output carries the batch (a batch tensor reads it
        row by row: the positions of the examples, as a gradient of a gather with
        ``batch_dims`` offsets them): split, each replica counts its own rows, as it
        would from its own input's shape."""
        graph = self.graph
        if graph.ops[node] != "Range" or self.axis[self.offset[node]] != 0:
            return False
        start, _, delta = graph.data_inputs[node]
        return const_ints(graph, *start) == [0] and const_ints(graph, *delta) == [1]

    def categorize(self, stateful: list[bool], known_op: list[bool]) -> None:
        for node in range(self.graph.num_nodes):
            if not known_op[node] or stateful[node]:
                continue
            if self.counts_rows(node):
                self.category[node] = SplitCategory.SPLIT_CONCAT
                continue
            if self.first_batch_input(node) is None and not self.accumulates[node]:
                continue
            aggregations = self.aggregation[self.offset[node] : self.offset[node + 1]]
            if (aggregations == Aggregation.LOST).any():
                continue
            summed = (aggregations == Aggregation.SUM).any()
            self.category[node] = SplitCategory.SPLIT_SUM if summed else SplitCategory.SPLIT_CONCAT


def propagate_batch(
    graph: ParsedGraph,
    *,
    batch_inputs: list[int],
    graph_batch_size: int,
    stateful: list[bool],
) -> BatchAnalysis:
    """Batch axes, aggregations and split categories for every node of ``graph``.

    ``batch_inputs`` are the nodes whose output 0 carries the batch on axis 0, and
    ``stateful`` marks nodes that must never be split (variables, apply and assign ops).
    """
    propagator = _Propagator(graph, graph_batch_size)
    propagator.forward(batch_inputs, graph.known_op)
    propagator.backward()
    propagator.categorize(stateful, graph.known_op)
    return BatchAnalysis(
        graph_batch_size=graph_batch_size,
        output_offset=propagator.offset,
        batch_axis=propagator.axis,
        aggregation=propagator.aggregation,
        batch_statistics=propagator.batch_statistics,
        category=propagator.category,
    )
