"""How much memory a verification (:mod:`.check`) needs, and how much the machine has: a
step that cannot fit is refused with the figures before TensorFlow starts, instead of
being killed by the kernel halfway through."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tagplan.planner.compile.graphdef import DistributedGraph
from tagplan.planner.graph.ir import GraphIR

__all__ = ["GIB", "available_bytes", "verification_bytes"]

GIB = 1 << 30
_PROCESS_BYTES = GIB  # TensorFlow, both graphs and a batch of values moving


def verification_bytes(ir: GraphIR, compiled: DistributedGraph, double: bool) -> int:
    """The peak of one verification of ``compiled``: every variable copy the compiled graph
    makes (parameters, optimizer slots, state), each parameter's gradient twice per
    instance of the op computing it (computed, then summed), the largest variable's copies
    read back with its expected value beside them, and 1 GiB for the process.
    The reference step holds less (one copy, one instance), and the initial and updated
    values wait on disk. Float64 doubles every floating-point byte. How the estimate
    compares with measured peaks: docs/verification.md."""
    copies = compiled.variable_replicas()
    sizes = {n: int(ir.variable_bytes[ir.op_index(n)]) for n in copies}
    variables = sum(sizes[n] * len(copies[n]) for n in copies)
    # the largest variable read back from every copy, next to its expected value
    moving = max(((len(copies[n]) + 1) * sizes[n] for n in copies), default=0)
    params = ir.parameters
    producers = ir.tensor_producer[params.gradient_tensor]
    instances = np.diff(compiled.placement.inst_ptr)[producers]
    gradients = 2 * int((params.gradient_bytes * instances).sum())
    return (variables + gradients + moving) * (2 if double else 1) + _PROCESS_BYTES


def available_bytes() -> int | None:
    """The memory the machine can give a new process now (Linux ``MemAvailable``), or
    ``None`` where that cannot be read."""
    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None
