"""Where a model-parallel op group's ops run: the default split of a group's ops over its
GPUs (contiguous runs of the topological order with balanced work) and a strategy's
explicit placement, both keeping the ops TensorFlow must colocate together."""

from __future__ import annotations

import numpy as np

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.ir import GraphIR

__all__ = ["model_parallel_placement", "op_or_none", "place_explicitly"]


def model_parallel_placement(
    ir: GraphIR, ops: np.ndarray, devices: np.ndarray, work: np.ndarray
) -> np.ndarray:
    """Default model-parallel split: contiguous runs of the topological order with
    balanced work (the ops of a group are numbered in topological order already)."""
    if len(devices) == 1:
        return np.full(len(ops), devices[0], dtype=np.int32)
    cumulative = np.cumsum(work[ops]) if len(ops) else np.zeros(0)
    total = cumulative[-1] if len(cumulative) and cumulative[-1] > 0 else 1.0
    chunk = np.minimum((cumulative / total * len(devices)).astype(int), len(devices) - 1)
    placed = devices[chunk].astype(np.int32)
    # ops TensorFlow must colocate (a variable, its reads and updates) follow the first
    return _colocate(ir, ops, placed)


def _colocate(ir: GraphIR, ops: np.ndarray, placed: np.ndarray) -> np.ndarray:
    """Move every op onto the device of the first op of its colocation class."""
    first: dict[int, int] = {}
    for position, op in enumerate(ops.tolist()):
        placed[position] = first.setdefault(int(ir.colocation[op]), int(placed[position]))
    return placed


def op_or_none(ir: GraphIR, name: str) -> int | None:
    """IR index of an original node name, ``None`` when the graph has no such op."""
    try:
        return ir.op_index(name)
    except KeyError:
        return None


def place_explicitly(
    ir: GraphIR,
    placement: dict[str, str],
    ops: np.ndarray,
    devices: np.ndarray,
    names: dict[str, int],
    op_device: np.ndarray,
    where: str,
) -> None:
    """Apply a model-parallel group's explicit ``placement`` (op name -> device name) to
    ``op_device``; ``ops`` are the group's ops in index order.

    TensorFlow colocates a variable with its reads and updates, so each named op moves
    with the group's ops of its colocation class, and a placement that puts two of them
    on different GPUs is refused. The classes are gathered once and each is checked once
    per device it is sent to: linear in the group's ops and the placement's entries.
    """
    allowed = set(devices.tolist())
    classes: dict[int, list[int]] = {}  # colocation class -> the group's ops in it
    for op, colocation in zip(ops.tolist(), ir.colocation[ops].tolist(), strict=True):
        classes.setdefault(colocation, []).append(op)
    in_group = set(ops.tolist())
    placed: set[tuple[int, str]] = set()  # (class, device name) already moved
    for name, device_name in placement.items():
        device = names.get(device_name)
        if device is None or device not in allowed:
            raise InvalidInput(
                f"{where}: placement puts {name!r} on {device_name!r}, not one of the group's GPUs"
            )
        op = op_or_none(ir, name)
        if op is None or op not in in_group:
            raise InvalidInput(f"{where}: placement names op {name!r}, not in the group")
        colocation = int(ir.colocation[op])
        if (colocation, device_name) in placed:
            continue
        colocated = classes[colocation]
        clash = [
            ir.op_names[i]
            for i in colocated
            if placement.get(ir.op_names[i], device_name) != device_name
        ]
        if clash:
            raise InvalidInput(
                f"{where}: placement splits ops TensorFlow must colocate "
                f"({name!r} and {clash[0]!r})"
            )
        op_device[colocated] = device
        placed.add((colocation, device_name))
