"""The analyzer's output: a training graph as flat numpy arrays (docs/design.md §2).

The search walks this millions of times, so there is no Python object per op. Ops are
numbered in topological order; tensors are numbered so that the outputs of op ``i`` are
``op_output_ptr[i]:op_output_ptr[i + 1]``. Adjacency is CSR: the input tensors of op ``i``
are ``op_input_tensor[op_input_ptr[i]:op_input_ptr[i + 1]]`` (in input order), the
consumers of tensor ``t`` are ``tensor_consumer_op[tensor_consumer_ptr[t]:...]``, and the
control predecessors of op ``i`` are ``control_pred[control_ptr[i]:control_ptr[i + 1]]``.
Byte counts and shapes are at the job's batch size.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from tagplan.planner.graph.batch import Aggregation, SplitCategory

__all__ = ["GraphIR", "Parameters", "SparseParameters"]


@dataclass(frozen=True, eq=False)
class Parameters:
    """Trainable parameters, one row each; op and tensor indices refer to the IR."""

    names: tuple[str, ...]
    variable_op: np.ndarray  # int32: the variable (VarHandleOp / resource placeholder)
    bytes: np.ndarray  # int64: parameter bytes
    gradient_tensor: np.ndarray  # int32
    gradient_bytes: np.ndarray  # int64
    apply_op: np.ndarray  # int32
    slot_bytes: np.ndarray  # int64: optimizer slots (Adam's m and v) of this parameter
    slot_ptr: np.ndarray  # int32 CSR over slot_op
    slot_op: np.ndarray  # int32: slot variable ops
    region_ptr: np.ndarray  # int32 CSR over region_op
    region_op: np.ndarray  # int32: update ops kept with the parameter (TAG §4.1.1)

    def __len__(self) -> int:
        return len(self.names)


@dataclass(frozen=True, eq=False)
class SparseParameters:
    """Trainable variables updated through scatter ops (embedding tables), one row each;
    op indices refer to the IR. Their update ops are placed like any other op; the rows
    say what they hold (``bytes`` 0: the graph gives no shape for the variable)."""

    names: tuple[str, ...]
    variable_op: np.ndarray  # int32
    bytes: np.ndarray  # int64
    slot_bytes: np.ndarray  # int64: optimizer slots scattered into with the table
    slot_ptr: np.ndarray  # int32 CSR over slot_op
    slot_op: np.ndarray  # int32
    update_ptr: np.ndarray  # int32 CSR over update_op
    update_op: np.ndarray  # int32: the batch-dependent writes and scatters

    def __len__(self) -> int:
        return len(self.names)

    @classmethod
    def empty(cls) -> SparseParameters:
        none = np.zeros(0, dtype=np.int32)
        start = np.zeros(1, dtype=np.int32)
        return cls((), none, none.astype(np.int64), none.astype(np.int64), start, none, start, none)


@dataclass(frozen=True, eq=False)
class GraphIR:
    """An analyzed training graph. See the module docstring for the array layout."""

    batch_size: int
    graph_batch_size: int
    fingerprint: str

    op_names: tuple[str, ...]
    op_types: tuple[str, ...]
    cost_keys: tuple[str, ...]
    split_category: np.ndarray  # int8 SplitCategory
    colocation: np.ndarray  # int32: ops with the same id must share a device
    known_op: np.ndarray  # bool: the op type is in TensorFlow's registry
    batch_statistics: np.ndarray  # bool: splitting changes batch statistics (batch norm)
    stateful: np.ndarray  # bool: reads or writes variables, or is random
    variable_bytes: np.ndarray  # int64: bytes a variable op holds (parameters, slots, state)

    op_input_ptr: np.ndarray
    op_input_tensor: np.ndarray
    op_output_ptr: np.ndarray
    control_ptr: np.ndarray
    control_pred: np.ndarray

    tensor_producer: np.ndarray  # int32
    tensor_slot: np.ndarray  # int32: output index on the producer
    tensor_dtype: np.ndarray  # int32 TensorFlow DataType
    tensor_bytes: np.ndarray  # int64 at batch_size
    tensor_batch_axis: np.ndarray  # int8, -1 when the tensor does not carry the batch
    tensor_aggregation: np.ndarray  # int8 Aggregation of the replicas' outputs
    tensor_shapes: tuple[tuple[int, ...] | None, ...]  # at batch_size; -1 unknown size
    tensor_consumer_ptr: np.ndarray
    tensor_consumer_op: np.ndarray

    parameters: Parameters
    batch_input_ops: np.ndarray  # int32
    loss_op: int  # -1 when unknown
    aliases: dict[str, int] = field(repr=False)  # dropped identity name -> op index
    dropped: dict[str, tuple[str, ...]] = field(repr=False)  # reason -> original names
    unknown_op_types: tuple[str, ...] = ()
    sparse_parameters: SparseParameters = field(default_factory=SparseParameters.empty)

    @property
    def num_ops(self) -> int:
        return len(self.op_names)

    @property
    def num_tensors(self) -> int:
        return len(self.tensor_producer)

    def op_index(self, name: str) -> int:
        """IR index of an original node name (also for dropped identities)."""
        return self._name_index()[name]

    def op_indices(self, names: Sequence[str]) -> np.ndarray:
        """:meth:`op_index` of each of ``names``; ``KeyError`` names the first unknown."""
        index = self._name_index()
        try:
            return np.fromiter(map(index.__getitem__, names), dtype=np.int64, count=len(names))
        except KeyError:
            raise KeyError(next(n for n in names if n not in index)) from None

    def _name_index(self) -> dict[str, int]:
        """Every original node name's IR index: the ops' own, then the dropped
        identities' (an alias wins where a name is both)."""
        cached = self.__dict__.get("_names")
        if cached is None:
            cached = {n: i for i, n in enumerate(self.op_names)} | self.aliases
            object.__setattr__(self, "_names", cached)
        return cached

    def inputs(self, op: int) -> np.ndarray:
        return self.op_input_tensor[self.op_input_ptr[op] : self.op_input_ptr[op + 1]]

    def outputs(self, op: int) -> range:
        return range(int(self.op_output_ptr[op]), int(self.op_output_ptr[op + 1]))

    def consumers(self, tensor: int) -> np.ndarray:
        return self.tensor_consumer_op[
            self.tensor_consumer_ptr[tensor] : self.tensor_consumer_ptr[tensor + 1]
        ]

    @cached_property
    def input_reader(self) -> np.ndarray:
        """The op reading each input slot, aligned with ``op_input_tensor``: with
        ``tensor_producer[op_input_tensor]`` the graph's data edges as arrays."""
        return np.repeat(np.arange(self.num_ops), np.diff(self.op_input_ptr))

    @cached_property
    def input_lists(self) -> list[list[int]]:
        """Each op's input tensors as Python lists, for walks that visit ops one by one
        (``inputs(op)`` slices a numpy array per call)."""
        bounds, flat = self.op_input_ptr.tolist(), self.op_input_tensor.tolist()
        return [flat[bounds[i] : bounds[i + 1]] for i in range(self.num_ops)]

    def control_preds(self, op: int) -> np.ndarray:
        return self.control_pred[self.control_ptr[op] : self.control_ptr[op + 1]]

    @property
    def param_bytes(self) -> int:
        return int(self.parameters.bytes.sum())

    @cached_property
    def trainable_names(self) -> frozenset[str]:
        """Node names of every trainable variable: dense and sparse parameters."""
        return frozenset(self.parameters.names) | frozenset(self.sparse_parameters.names)

    def split_category_counts(self) -> dict[str, int]:
        counts = Counter(SplitCategory(int(c)).label for c in self.split_category)
        return {c.label: counts.get(c.label, 0) for c in SplitCategory}

    def summary(self) -> dict[str, object]:
        """The figures ``tagplan analyze --json`` prints."""
        batch = self.tensor_batch_axis >= 0
        return {
            "fingerprint": self.fingerprint,
            "batch_size": self.batch_size,
            "graph_batch_size": self.graph_batch_size,
            "ops": self.num_ops,
            "tensors": self.num_tensors,
            "op_types": len(set(self.op_types)),
            "parameters": len(self.parameters),
            "gradients": len(self.parameters),
            "param_bytes": self.param_bytes,
            "optimizer_slot_bytes": int(self.parameters.slot_bytes.sum()),
            "sparse_parameters": len(self.sparse_parameters),
            "sparse_param_bytes": int(self.sparse_parameters.bytes.sum()),
            "sparse_slot_bytes": int(self.sparse_parameters.slot_bytes.sum()),
            "unsized_sparse_parameters": [
                name
                for name, size in zip(
                    self.sparse_parameters.names, self.sparse_parameters.bytes, strict=True
                )
                if size == 0
            ],
            "trainable_variables": len(self.parameters) + len(self.sparse_parameters),
            "trainable_bytes": self.param_bytes + int(self.sparse_parameters.bytes.sum()),
            "gradient_bytes": int(self.parameters.gradient_bytes.sum()),
            "tensor_bytes": int(self.tensor_bytes.sum()),
            "batch_tensors": int(batch.sum()),
            "batch_tensor_bytes": int(self.tensor_bytes[batch].sum()),
            "split_categories": self.split_category_counts(),
            "aggregations": {
                a.name.lower(): int((self.tensor_aggregation[batch] == a).sum())
                for a in Aggregation
                if a != Aggregation.LOST
            },
            "batch_statistics_ops": int(self.batch_statistics.sum()),
            "dropped": {reason: len(names) for reason, names in self.dropped.items()},
            "unknown_op_types": list(self.unknown_op_types),
            "loss": self.op_names[self.loss_op] if self.loss_op >= 0 else None,
            "batch_inputs": [self.op_names[i] for i in self.batch_input_ops],
        }
