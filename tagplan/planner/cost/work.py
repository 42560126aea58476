"""Work of one op execution: floating-point operations and bytes moved (docs/design.md §3).

Without a measured profile, an op's time is estimated analytically (TAG §4.1.2 fallback) as
``max(flops / peak FLOP/s, bytes_moved / memory bandwidth) + launch overhead``. This module
supplies both numerators for every op of a :class:`~tagplan.planner.graph.ir.GraphIR`, from
the explicit formula table :data:`FORMULAS` (op type -> :class:`Formula`), listed in
``docs/cost-formulas.md``. Formulas read the input and output shapes of the IR and a few
node attributes, which :func:`attrs_from_cost_key` recovers from the op's cost key.

Conventions
-----------
* **A multiply-add counts as 2 flops.** The literature's "VGG19: 19.6 GFLOPs" at batch 1
  counts multiply-adds (19.5 G in the convolutions, 0.12 G in the dense layers); here the
  convolutions of the forward pass are ``2 * 19.5 = 39.0`` G flops.
* **Elementwise constants** (flops per output element): arithmetic, comparison and select 1;
  square root and reciprocal square root 2 (as TensorFlow's profiler counts ``Rsqrt``);
  transcendental functions (exp, log, sin, cos, tanh, erf) 4, since a GPU's special-function
  units run them at about a quarter of the FMA rate; composite functions add up their parts
  (sigmoid = exp + add + reciprocal = 6, pow = log + mul + exp = 9, softmax = max + sub +
  exp + sum + div = 8 per element).
* **Bytes moved are compulsory traffic**: every input read once and every output written
  once at its full size, unless a row says otherwise (a slice or gather reads only what it
  outputs). Caches, multi-pass kernels and workspaces are not modelled. Resource handles
  move nothing; ``ReadVariableOp`` returns a reference to the variable's buffer, not a copy;
  ``Reshape``-like ops only rewrite metadata.
* **Batch scaling**: all numbers are at ``ir.batch_size``. ``flops_batch_fraction`` is 1 for
  an op with flops that touches a tensor carrying the batch (its flops are proportional to
  the batch), else 0; ``bytes_batch_fraction`` is the share of its bytes that belongs to
  batch-carrying tensors. :meth:`GraphWork.at_batch` rescales to a replica's local batch.
* An op type missing from the table gets the bytes-only estimate (inputs read, outputs
  written, 0 flops) and ``formula == "fallback"``.

Units: flops and bytes, per execution (one training step).

Why one module: the formula table is one table (docs/cost-formulas.md mirrors it and a
test checks them against each other); its rows are short functions best read together.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.protos import DT_RESOURCE, DT_VARIANT

__all__ = [
    "FORMULAS",
    "Formula",
    "GraphWork",
    "OpWork",
    "attrs_from_cost_key",
    "graph_work",
    "op_work",
]

ARITHMETIC = 1  # add, mul, compare, select, ... per element
ROOT = 2  # sqrt, rsqrt
TRANSCENDENTAL = 4  # exp, log, sin, cos, tanh, erf
SOFTMAX = 4 * ARITHMETIC + TRANSCENDENTAL  # max, sub, exp, sum, div per element

_HANDLES = frozenset({DT_RESOURCE, DT_VARIANT, DT_RESOURCE + 100, DT_VARIANT + 100})
_ATTR_START = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


class _Traffic:
    """Bytes of the tensors an op reads and writes, split by whether they carry the batch."""

    __slots__ = ("batch", "fixed", "ir")

    def __init__(self, ir: GraphIR) -> None:
        self.ir = ir
        self.batch = 0.0
        self.fixed = 0.0

    def add(self, tensors: Iterable[int], times: float = 1.0) -> _Traffic:
        ir = self.ir
        for t in tensors:
            if int(ir.tensor_dtype[t]) in _HANDLES:
                continue  # a handle names a buffer; the row counts the buffer's traffic
            size = float(ir.tensor_bytes[t]) * times
            if ir.tensor_batch_axis[t] >= 0:
                self.batch += size
            else:
                self.fixed += size
        return self


Compute = Callable[[GraphIR, int], tuple[float, _Traffic]]


@dataclass(frozen=True)
class Formula:
    """One row of the table: its name (shared by a family), the formula in words, the code."""

    name: str
    doc: str
    compute: Compute


class OpWork(NamedTuple):
    """The work of one op execution at ``ir.batch_size``."""

    flops: float
    bytes_moved: float
    flops_batch_fraction: float
    bytes_batch_fraction: float
    formula: str


@dataclass(frozen=True, eq=False)
class GraphWork:
    """Per-op work of a graph at ``ir.batch_size``, each array indexed by IR op."""

    flops: np.ndarray  # float64
    bytes_moved: np.ndarray  # float64
    flops_batch_fraction: np.ndarray  # float64 in [0, 1]: share of flops that scales with batch
    bytes_batch_fraction: np.ndarray  # float64 in [0, 1]: share of bytes that scales with batch
    formula: tuple[str, ...]  # the table row used per op; "fallback" when none applies

    def at_batch(self, local_batch: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(flops, bytes) of a replica running ``local_batch`` of the ``batch_size`` samples.

        The fixed part stays; the batch part scales by ``local_batch / batch_size``.
        """
        if batch_size <= 0 or local_batch < 0:
            raise InvalidInput(
                f"need batch_size > 0 and local_batch >= 0, got {local_batch} of {batch_size}"
            )
        scale = local_batch / batch_size
        flops = self.flops * (1.0 + self.flops_batch_fraction * (scale - 1.0))
        moved = self.bytes_moved * (1.0 + self.bytes_batch_fraction * (scale - 1.0))
        return flops, moved


def attrs_from_cost_key(key: str) -> dict[str, str]:
    """Node attributes recorded in a cost key ``OpType|inputs|attr=value;...``.

    Only attributes set on the node appear (defaults are not filled in). A string value
    holding ``;`` stays whole: a piece that does not start with ``name=`` continues the
    previous value.
    """
    parts = key.split("|", 2)
    if len(parts) < 3 or not parts[2]:
        return {}
    attrs: dict[str, str] = {}
    last = None
    for piece in parts[2].split(";"):
        if _ATTR_START.match(piece) or last is None:
            name, _, value = piece.partition("=")
            attrs[name] = value
            last = name
        else:
            attrs[last] += ";" + piece
    return attrs


def _ints(value: str | None) -> list[int]:
    """``"(1,2,2,1)"`` -> ``[1, 2, 2, 1]``; empty for a missing or empty list."""
    if not value:
        return []
    return [int(v) for v in value.strip("()").split(",") if v]


def _numel(ir: GraphIR, t: int) -> int:
    """Elements of a tensor at the job batch size; an unknown size (-1) counts as 1."""
    shape = ir.tensor_shapes[t]
    return 0 if shape is None else math.prod(d if d >= 0 else 1 for d in shape)


def _dim(ir: GraphIR, t: int, axis: int) -> int:
    shape = ir.tensor_shapes[t]
    if shape is None or not -len(shape) <= axis < len(shape):
        return 1
    return max(shape[axis], 1)


def _known(ir: GraphIR, t: int) -> bool:
    shape = ir.tensor_shapes[t]
    return shape is not None and all(d >= 0 for d in shape)


def _attrs(ir: GraphIR, op: int) -> dict[str, str]:
    return attrs_from_cost_key(ir.cost_keys[op])


def _io(ir: GraphIR, op: int) -> _Traffic:
    return _Traffic(ir).add(ir.inputs(op)).add(ir.outputs(op))


def _out_elements(ir: GraphIR, op: int) -> int:
    return sum(_numel(ir, t) for t in ir.outputs(op))


# --- formulas ---------------------------------------------------------------------------


def _zero(ir: GraphIR, op: int) -> tuple[float, _Traffic]:
    return 0.0, _Traffic(ir)


def _copy(ir: GraphIR, op: int) -> tuple[float, _Traffic]:
    return 0.0, _io(ir, op)


def _elementwise(k: float, ir: GraphIR, op: int) -> tuple[float, _Traffic]:
    return k * _out_elements(ir, op), _io(ir, op)


def _add_n(ir: GraphIR, op: int) -> tuple[float, _Traffic]:
    return (len(ir.inputs(op)) - 1) * _out_elements(ir, op), _io(ir, op)


def _generate(k: float, ir: GraphIR, op: int) -> tuple[float, _Traffic]:
    # Inputs are shapes, scalars or (ZerosLike) a template whose values are not read.
    return k * _out_elements(ir, op), _Traffic(ir).add(ir.outputs(op))


def _reduction(finalize: float, ir: GraphIR, op: int) -> tuple[float, _Traffic]:
    x = ir.inputs(op)[0]
    return _numel(ir, x) + finalize * _out_elements(ir, op), _io(ir, op)


def _per_input_element(k: float, ir: GraphIR, op: int) -> tuple[float, _Traffic]:
    return k * _numel(ir, ir.inputs(op)[0]), _io(ir, op)


def _batch_norm(
    train: float, infer: float, rereads: int, ir: GraphIR, op: int
) -> tuple[float, _Traffic]:
    """Training reads its first ``rereads`` inputs twice: once for the per-channel sums,
    once to normalize (forward: x; gradient: dy and x)."""
    training = _attrs(ir, op).get("is_training", "True") == "True"
    flops = (train if training else infer) * _numel(ir, ir.inputs(op)[0])
    traffic = _io(ir, op)
    return flops, traffic.add(ir.inputs(op)[:rereads]) if training else traffic


def _take(ir: GraphIR, op: int) -> tuple[float, _Traffic]:
    # Reads the selected part of input 0 (as large as the output) and the indices.
    ins = ir.inputs(op)
    return 0.0, _Traffic(ir).add(ir.outputs(op), 2.0).add(ins[1:])


def _matmul(ir: GraphIR, op: int) -> tuple[float, _Traffic]:
    a = ir.inputs(op)[0]
    transposed = _attrs(ir, op).get("transpose_a") == "True"
    k = _dim(ir, a, -2 if transposed else -1)
    return 2.0 * _out_elements(ir, op) * k, _io(ir, op)


def _batch_matmul(ir: GraphIR, op: int) -> tuple[float, _Traffic]:
    x = ir.inputs(op)[0]
    adjoint = _attrs(ir, op).get("adj_x") == "True"
    k = _dim(ir, x, -2 if adjoint else -1)
    return 2.0 * _out_elements(ir, op) * k, _io(ir, op)


def _conv_output_elements(ir: GraphIR, op: int, out_channels: int) -> int:
    """Elements of a forward convolution's output from its input shape and attributes.

    Used when the output shape is unknown: ``Ho = ceil(H / s)`` for SAME padding,
    ``(H + pads - (K - 1) * d - 1) // s + 1`` otherwise (likewise ``Wo``).
    """
    x, f = ir.inputs(op)[0], ir.inputs(op)[1]
    attrs = _attrs(ir, op)
    spatial = (2, 3) if attrs.get("data_format", "NHWC") == "NCHW" else (1, 2)
    strides = _ints(attrs.get("strides")) or [1, 1, 1, 1]
    dilations = _ints(attrs.get("dilations")) or [1, 1, 1, 1]
    pads = _ints(attrs.get("explicit_paddings")) or [0] * 8
    padding = attrs.get("padding", "VALID")
    elements = _dim(ir, x, 0) * out_channels
    for j, axis in enumerate(spatial):
        size, stride = _dim(ir, x, axis), max(strides[axis], 1)
        if padding == "SAME":
            elements *= -(-size // stride)
        else:
            span = (_dim(ir, f, j) - 1) * dilations[axis] + 1
            total = size + (pads[2 * axis] + pads[2 * axis + 1] if padding == "EXPLICIT" else 0)
            elements *= max((total - span) // stride + 1, 1)
    return elements


def _conv(
    y_input: int | None, filter_input: int | None, depthwise: bool, ir: GraphIR, op: int
) -> tuple[float, _Traffic]:
    """2 * elements(y) * (multiply-adds per y element), y the forward output or its gradient.

    The filter is ``[Kh, Kw, Cin, Cout]`` (``[Kh, Kw, C, multiplier]`` for depthwise); each
    output element takes ``Kh * Kw * Cin`` multiply-adds (``Kh * Kw`` for depthwise). Strides
    are in ``y``'s shape: counting on ``y`` (not on the larger input-sized tensor) is exact.
    """
    ins = ir.inputs(op)
    f = ins[filter_input] if filter_input is not None else ir.outputs(op)[0]
    kh, kw, cin, cout = (_dim(ir, f, axis) for axis in range(4))
    per_output = kh * kw if depthwise else kh * kw * cin
    if y_input is not None:
        y_elements = _numel(ir, ins[y_input])
    else:
        y = ir.outputs(op)[0]
        channels = cin * cout if depthwise else cout
        y_elements = _numel(ir, y) if _known(ir, y) else _conv_output_elements(ir, op, channels)
    return 2.0 * y_elements * per_output, _io(ir, op)


def _pool(extra: int, grad: bool, ir: GraphIR, op: int) -> tuple[float, _Traffic]:
    """(window + extra) * elements(y), y the pooled output (its gradient for backprops)."""
    window = math.prod(_ints(_attrs(ir, op).get("ksize")) or [1])
    y = ir.inputs(op)[-1] if grad else ir.outputs(op)[0]
    return (window + extra) * _numel(ir, y), _io(ir, op)


def _apply(states: int, k: float, grad: int, ir: GraphIR, op: int) -> tuple[float, _Traffic]:
    """k * P flops; the variable and its slots (``states`` buffers) read and written.

    The first ``states`` inputs are the buffers (resource handles or reference tensors);
    P is the parameter size, read off the gradient.
    """
    ins = ir.inputs(op)
    g = ins[grad]
    traffic = _Traffic(ir).add([g], 2.0 * states).add(ins[states:])
    return k * _numel(ir, g), traffic


def _assign(k: float, reads: bool, ir: GraphIR, op: int) -> tuple[float, _Traffic]:
    """k * elements(value); value read, variable written (and read first for an update)."""
    value = ir.inputs(op)[1]
    return k * _numel(ir, value), _Traffic(ir).add([value], 3.0 if reads else 2.0)


def _fallback(ir: GraphIR, op: int) -> tuple[float, _Traffic]:
    return 0.0, _io(ir, op)


# --- the table --------------------------------------------------------------------------

_IO = "bytes: inputs read + outputs written"
FORMULAS: dict[str, Formula] = {}


def _rows(name: str, doc: str, compute: Compute, op_types: Iterable[str]) -> None:
    for op_type in op_types:
        FORMULAS[op_type] = Formula(name, doc, compute)


def _elementwise_rows(table: Iterable[tuple[float, tuple[str, ...]]], why: dict[str, str]) -> None:
    for k, op_types in table:
        for op_type in op_types:
            reason = f" ({why[op_type]})" if op_type in why else ""
            doc = f"{k:g} flop{'s' if k != 1 else ''} per output element{reason}; {_IO}"
            FORMULAS[op_type] = Formula("elementwise", doc, partial(_elementwise, k))


# fmt: off
_rows("none", "0: no device work (a constant is resident, a placeholder is fed, a handle "
      "names a buffer)", _zero,
      ("Const", "Placeholder", "VarHandleOp", "VariableV2", "Variable", "NoOp",
       "IteratorGetNext"))
_rows("reference", "0: returns a reference to the variable's buffer, not a copy", _zero,
      ("ReadVariableOp",))
_rows("metadata", "0 flops, 0 bytes: rewrites shape metadata or forwards its input", _zero,
      ("Reshape", "Squeeze", "ExpandDims", "Identity", "IdentityN", "Snapshot", "StopGradient",
       "PreventGradient", "EnsureShape", "PlaceholderWithDefault", "Shape", "ShapeN", "Size",
       "Rank"))
_rows("copy", f"0 flops; {_IO}", _copy,
      ("Transpose", "ConcatV2", "Concat", "Pack", "Unpack", "Split", "SplitV", "Tile", "Pad",
       "PadV2", "MirrorPad", "Cast", "ReverseV2", "BroadcastTo", "StridedSliceGrad", "ScatterNd",
       "DynamicStitch"))
_rows("slice", "0 flops; bytes: 2 * output (the part read, then written) + index inputs", _take,
      ("Slice", "StridedSlice"))
_rows("gather", "0 flops; bytes: 2 * output (rows read, then written) + indices", _take,
      ("GatherV2", "Gather", "GatherNd", "ResourceGather"))
_rows("segment_sum", f"elements(data) adds; {_IO} (the output is zero-filled once)",
      partial(_per_input_element, ARITHMETIC), ("UnsortedSegmentSum", "SegmentSum"))
_rows("fill", "0 flops; bytes: outputs written", partial(_generate, 0),
      ("Fill", "ZerosLike", "OnesLike"))
_rows("fill", "1 flop per output element (start + i * delta); bytes: outputs written",
      partial(_generate, ARITHMETIC), ("Range", "LinSpace"))
_rows("random", "4 flops per output element (Philox round + conversion); bytes: outputs "
      "written", partial(_generate, 4),
      ("RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
       "StatelessRandomUniformV2", "StatelessRandomNormalV2", "StatelessTruncatedNormalV2",
       "StatelessRandomGetKeyCounter"))
_elementwise_rows(
    (
        (ARITHMETIC, (
            "Neg", "Abs", "Sign", "Floor", "Ceil", "Round", "Rint", "Square", "Reciprocal",
            "Inv", "Relu", "LogicalNot", "IsFinite", "IsNan", "InvertPermutation", "Add",
            "AddV2", "Sub", "Mul", "MulNoNan", "RealDiv", "Div", "DivNoNan", "FloorDiv",
            "FloorMod", "TruncateDiv", "Mod", "Maximum", "Minimum", "Greater", "GreaterEqual",
            "Less", "LessEqual", "Equal", "NotEqual", "LogicalAnd", "LogicalOr", "ReluGrad",
            "Select", "SelectV2", "MatrixBandPart", "OneHot", "ConcatOffset",
            "BroadcastGradientArgs",
        )),
        (ROOT, ("Sqrt", "Rsqrt")),
        (2, ("SquaredDifference", "Relu6", "Relu6Grad", "LeakyRelu", "LeakyReluGrad", "EluGrad",
             "SqrtGrad", "ClipByValue")),
        (3, ("TanhGrad", "SigmoidGrad", "ReciprocalGrad", "InvGrad", "SeluGrad", "Softsign")),
        (4, ("RsqrtGrad",)),
        (TRANSCENDENTAL, ("Exp", "Expm1", "Log", "Log1p", "Sin", "Cos", "Tan", "Tanh", "Erf",
                          "Erfc")),
        (TRANSCENDENTAL + 1, ("Elu",)),
        (TRANSCENDENTAL + 2, ("Sigmoid", "Selu")),
        (TRANSCENDENTAL + 3, ("SoftplusGrad",)),
        (2 * TRANSCENDENTAL, ("Softplus",)),
        (2 * TRANSCENDENTAL + 1, ("Pow",)),
    ),
    {
        "Sqrt": "root", "Rsqrt": "root, as TensorFlow's profiler counts it",
        "SquaredDifference": "sub, mul", "Relu6": "max, min", "Relu6Grad": "two compares, select",
        "LeakyRelu": "mul, max", "LeakyReluGrad": "compare, mul", "EluGrad": "add, mul",
        "SqrtGrad": "dy * 0.5 / y", "ClipByValue": "max, min", "TanhGrad": "dy * (1 - y^2)",
        "SigmoidGrad": "dy * y * (1 - y)", "ReciprocalGrad": "-dy * y^2", "InvGrad": "-dy * y^2",
        "SeluGrad": "select, add, mul", "Softsign": "x / (1 + |x|)",
        "RsqrtGrad": "dy * -0.5 * y^3, as TensorFlow's profiler counts it",
        **{t: "transcendental" for t in ("Exp", "Expm1", "Log", "Log1p", "Sin", "Cos", "Tan",
                                         "Tanh", "Erf", "Erfc")},
        "Elu": "exp, select", "Sigmoid": "1 / (1 + exp(-x))", "Selu": "exp, select, mul",
        "SoftplusGrad": "dy / (1 + exp(-x))", "Softplus": "log(1 + exp(x))",
        "Pow": "exp(y * log(x))",
    },
)
_rows("add_n", f"(N - 1) flops per output element for N inputs; {_IO}", _add_n, ("AddN",))
_rows("bias_add", f"1 flop per output element; {_IO}", partial(_elementwise, ARITHMETIC),
      ("BiasAdd", "BiasAddV1"))
_rows("bias_add_grad", f"elements(dy) adds (sum over all but the channel axis); {_IO}",
      partial(_reduction, 0), ("BiasAddGrad",))
_rows("reduction", f"elements(input) flops; {_IO}", partial(_reduction, 0),
      ("Sum", "Prod", "Max", "Min", "All", "Any", "ArgMax", "ArgMin"))
_rows("reduction", f"elements(input) + elements(output) flops (sum, then divide); {_IO}",
      partial(_reduction, 1), ("Mean",))
_rows("l2_loss", f"2 * elements(input) flops (square, add); {_IO}",
      partial(_per_input_element, 2), ("L2Loss",))
_rows("softmax", f"{SOFTMAX} flops per input element (max, sub, exp, sum, div); {_IO}",
      partial(_per_input_element, SOFTMAX), ("Softmax", "LogSoftmax"))
_rows("softmax_cross_entropy", f"{SOFTMAX} flops per logit (softmax; the loss and "
      f"gradient are per row); {_IO}", partial(_per_input_element, SOFTMAX),
      ("SparseSoftmaxCrossEntropyWithLogits",))
_rows("softmax_cross_entropy", f"{SOFTMAX + 3} flops per logit (softmax, labels * log p, "
      f"p - labels); {_IO}", partial(_per_input_element, SOFTMAX + 3),
      ("SoftmaxCrossEntropyWithLogits",))
_rows("conv2d", f"2 * N*Ho*Wo*Cout * Kh*Kw*Cin (output shape, else from input, strides, "
      f"padding, data_format); {_IO}", partial(_conv, None, 1, False), ("Conv2D",))
_rows("conv2d_backprop_input", f"2 * elements(dy) * Kh*Kw*Cin, dy = input 2, filter = "
      f"input 1; {_IO}", partial(_conv, 2, 1, False), ("Conv2DBackpropInput",))
_rows("conv2d_backprop_filter", f"2 * elements(dy) * Kh*Kw*Cin, dy = input 2, filter "
      f"shape = output; {_IO}", partial(_conv, 2, None, False),
      ("Conv2DBackpropFilter",))
_rows("depthwise_conv2d", f"2 * N*Ho*Wo*C*M * Kh*Kw; {_IO}", partial(_conv, None, 1, True),
      ("DepthwiseConv2dNative",))
_rows("depthwise_backprop_input", f"2 * elements(dy) * Kh*Kw, dy = input 2; {_IO}",
      partial(_conv, 2, 1, True), ("DepthwiseConv2dNativeBackpropInput",))
_rows("depthwise_backprop_filter", f"2 * elements(dy) * Kh*Kw, filter shape = output; {_IO}",
      partial(_conv, 2, None, True), ("DepthwiseConv2dNativeBackpropFilter",))
_rows("matmul", f"2 * M*N*K, K = a.shape[0] if transpose_a else a.shape[1]; {_IO}", _matmul,
      ("MatMul",))
_rows("batch_matmul", f"2 * elements(output) * K (batch dims broadcast), K = x.shape[-2] if "
      f"adj_x else x.shape[-1]; {_IO}", _batch_matmul,
      ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"))
_rows("pool", f"window * elements(y) comparisons (window = prod(ksize)); {_IO}",
      partial(_pool, 0, False), ("MaxPool",))
_rows("pool", f"(window + 1) * elements(y) (adds, then a divide); {_IO}",
      partial(_pool, 1, False), ("AvgPool",))
_rows("pool_grad", f"(window + 1) * elements(dy) (find the max again, then add); {_IO}",
      partial(_pool, 1, True), ("MaxPoolGrad",))
_rows("pool_grad", f"(window + 1) * elements(dy) (divide, then add over the window); {_IO}",
      partial(_pool, 1, True), ("AvgPoolGrad",))
_rows("batch_norm", f"7 flops per element of x when training (mean 1, variance 3, normalize "
      f"3), 2 otherwise (x * a + b); {_IO}, and x read again when training (statistics, "
      f"then normalize)", partial(_batch_norm, 7, 2, 1),
      ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"))
_rows("batch_norm_grad", f"9 flops per element of dy when training (sums of dy and dy * x_hat, "
      f"x_hat 2, dx 4), 5 otherwise; {_IO}, and dy and x read again when training (sums, "
      f"then dx)", partial(_batch_norm, 9, 5, 2),
      ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3"))
_rows("apply_optimizer", "2 * P flops (var -= lr * g); bytes: var read + written, g read",
      partial(_apply, 1, 2, 2),
      ("ResourceApplyGradientDescent", "ApplyGradientDescent"))
_rows("apply_optimizer", "4 * P flops (accum = accum * mu + g; var -= lr * accum); bytes: "
      "var, accum read + written, g read", partial(_apply, 2, 4, 3),
      ("ResourceApplyMomentum", "ResourceApplyKerasMomentum", "ApplyMomentum"))
_rows("apply_optimizer", "7 * P flops (accum += g^2; var -= lr * g / sqrt(accum)); bytes: "
      "var, accum read + written, g read", partial(_apply, 2, 7, 3),
      ("ResourceApplyAdagrad", "ApplyAdagrad"))
_rows("apply_optimizer", "12 * P flops (ms update 4, mom update 7, var -= mom); bytes: var, "
      "ms, mom read + written, g read", partial(_apply, 3, 12, 7),
      ("ResourceApplyRMSProp", "ApplyRMSProp"))
_rows("apply_optimizer", "13 * P flops (m update 3, v update 4, var -= lr * m / (sqrt(v) + "
      "eps) 6); bytes: var, m, v read + written, g read", partial(_apply, 3, 13, 9),
      ("ResourceApplyAdam", "ApplyAdam"))
_rows("apply_optimizer", "14 * P flops (Adam + vhat = max(vhat, v)); bytes: var, m, v, vhat "
      "read + written, g read", partial(_apply, 4, 14, 10),
      ("ResourceApplyAdamWithAmsgrad",))
_rows("assign", "0 flops; bytes: value read + variable written", partial(_assign, 0, False),
      ("AssignVariableOp", "Assign"))
_rows("assign_update", "elements(value) flops; bytes: variable read + written, value read",
      partial(_assign, ARITHMETIC, True),
      ("AssignAddVariableOp", "AssignSubVariableOp", "AssignAdd", "AssignSub"))

# fmt: on

_FALLBACK = Formula("fallback", f"0 flops; {_IO} (op type not in the table)", _fallback)


# --- evaluation -------------------------------------------------------------------------


def _touches_batch(ir: GraphIR, op: int) -> bool:
    axes = ir.tensor_batch_axis
    return bool((axes[ir.inputs(op)] >= 0).any()) or any(axes[t] >= 0 for t in ir.outputs(op))


def op_work(ir: GraphIR, op: int) -> OpWork:
    """Flops, bytes moved, their batch fractions and the formula of one op.

    An op whose inputs do not match its row (a malformed graph) gets the fallback.
    """
    formula = FORMULAS.get(ir.op_types[op], _FALLBACK)
    try:
        flops, traffic = formula.compute(ir, op)
    except (IndexError, ValueError):
        formula = _FALLBACK
        flops, traffic = _fallback(ir, op)
    moved = traffic.batch + traffic.fixed
    flops_fraction = 1.0 if flops > 0 and _touches_batch(ir, op) else 0.0
    bytes_fraction = traffic.batch / moved if moved > 0 else 0.0
    return OpWork(float(flops), moved, flops_fraction, bytes_fraction, formula.name)


def graph_work(ir: GraphIR) -> GraphWork:
    """:func:`op_work` for every op of the graph, as arrays."""
    rows = [op_work(ir, op) for op in range(ir.num_ops)]
    columns = list(zip(*rows, strict=True)) if rows else [(), (), (), (), ()]
    return GraphWork(
        flops=np.array(columns[0], dtype=np.float64),
        bytes_moved=np.array(columns[1], dtype=np.float64),
        flops_batch_fraction=np.array(columns[2], dtype=np.float64),
        bytes_batch_fraction=np.array(columns[3], dtype=np.float64),
        formula=tuple(columns[4]),
    )
