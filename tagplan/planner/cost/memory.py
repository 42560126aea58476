"""Op memory (docs/design.md §3): outputs, workspace, persistent state, framework reserve.

* **outputs**: the bytes of every output tensor, live from the op's end until its last
  consumer has run (TAG §4.3.2's reference counting, done by the simulator). Outputs
  that alias a buffer instead of allocating one — a variable read, a reshape — take no
  new memory (their input's buffer is charged once, to its producer);
* **workspace**: scratch memory an op holds only while it runs. Convolution kernels
  (cuDNN) ask for workspace to pick faster algorithms; we charge the size of the op's
  largest operand, a middle ground between the implicit-GEMM algorithms (none) and
  FFT/Winograd ones (several times the operands). Other ops need none;
* **persistent**: what variables hold for the whole run — parameters, optimizer slots
  (Adam's m and v), and state such as batch-norm running statistics;
* **framework reserve**: per GPU, the CUDA context, cuDNN/cuBLAS handles and allocator
  slack that TensorFlow never gives to tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tagplan.planner.graph.ir import GraphIR

__all__ = ["FRAMEWORK_RESERVE_BYTES", "OpMemory", "op_memory", "single_device_peak_bytes"]

FRAMEWORK_RESERVE_BYTES = 768 * 2**20
"""CUDA context (~300-500 MiB on recent drivers) plus cuDNN/cuBLAS handles and allocator
slack; a device's usable memory is its capacity minus this."""

_WORKSPACE_OPS = frozenset(
    {
        "Conv2D",
        "Conv2DBackpropInput",
        "Conv2DBackpropFilter",
        "Conv3D",
        "Conv3DBackpropInputV2",
        "Conv3DBackpropFilterV2",
        "DepthwiseConv2dNative",
        "DepthwiseConv2dNativeBackpropInput",
        "DepthwiseConv2dNativeBackpropFilter",
    }
)


# Ops whose output shares its input's (or the variable's) buffer in TensorFlow.
_ALIASING_OPS = frozenset(
    {"ReadVariableOp", "Reshape", "Squeeze", "ExpandDims", "Identity", "Snapshot", "StopGradient"}
)


@dataclass(frozen=True)
class OpMemory:
    """Per-op memory figures of a graph at its batch size, in bytes."""

    tensor_bytes: np.ndarray  # int64 per tensor: new memory it allocates (0 for aliases)
    output_bytes: np.ndarray  # int64: sum of the op's new outputs
    workspace_bytes: np.ndarray  # int64: held only while the op runs
    persistent_bytes: np.ndarray  # int64: variables (parameters, slots, state)

    @property
    def param_bytes(self) -> int:
        return int(self.persistent_bytes.sum())


def op_memory(ir: GraphIR) -> OpMemory:
    """Output, workspace and persistent bytes of every op of ``ir``."""
    aliasing = np.array([t in _ALIASING_OPS for t in ir.op_types], dtype=bool)
    tensor_bytes = np.where(aliasing[ir.tensor_producer], 0, ir.tensor_bytes).astype(np.int64)
    output_bytes = np.add.reduceat(
        np.append(tensor_bytes, 0), ir.op_output_ptr[:-1].astype(np.int64)
    )
    has_outputs = np.diff(ir.op_output_ptr) > 0
    output_bytes = np.where(has_outputs, output_bytes, 0).astype(np.int64)
    workspace = np.zeros(ir.num_ops, dtype=np.int64)
    for op, op_type in enumerate(ir.op_types):
        if op_type in _WORKSPACE_OPS:
            operands = [int(ir.tensor_bytes[t]) for t in ir.inputs(op)]
            operands += [int(ir.tensor_bytes[t]) for t in ir.outputs(op)]
            workspace[op] = max(operands, default=0)
    return OpMemory(
        tensor_bytes=tensor_bytes,
        output_bytes=output_bytes,
        workspace_bytes=workspace,
        persistent_bytes=ir.variable_bytes.astype(np.int64),
    )


def single_device_peak_bytes(ir: GraphIR, memory: OpMemory | None = None) -> int:
    """Peak memory of running the whole step on one device in topological order.

    Persistent bytes plus the high-water mark of live tensors (freed after their last
    consumer, TAG §4.3.2) plus the running op's workspace; excludes the framework reserve.
    """
    memory = memory or op_memory(ir)
    remaining = np.diff(ir.tensor_consumer_ptr).astype(np.int64)
    live = 0
    peak = 0
    for op in range(ir.num_ops):
        live += int(memory.output_bytes[op])
        peak = max(peak, live + int(memory.workspace_bytes[op]))
        for tensor in ir.inputs(op):
            remaining[tensor] -= 1
            if remaining[tensor] == 0:
                live -= int(memory.tensor_bytes[tensor])
        for tensor in ir.outputs(op):
            if remaining[tensor] == 0:
                live -= int(memory.tensor_bytes[tensor])
    return int(memory.param_bytes + peak)
