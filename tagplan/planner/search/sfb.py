"""Sufficient-factor broadcasting (TAG §4.2.3): for a gradient synchronized across D
replicas, duplicate the subgraph that computes it instead, broadcasting its inputs (the
sufficient factors) when that moves fewer bytes.

For the gradient produced by op g and applied by op l, over the ops V near g (the
ancestors of g within ``depth`` data edges, TAG's op group being replaced by this
neighbourhood so the cut is not bound to group boundaries) and the tensors E into them, TAG's ILP
chooses α_i (duplicate op i) and b_ji (tensor (j, i) crosses the cut):

    min  (D-1) Σ α_i T_i  +  D(D-1) Σ b_ji L_ji / τ  -  2 α_g (D-1)/D · L_gl / τ
    s.t. α_k <= Σ_{(k,i) ∈ E} α_i   for k in V \\ {g}   (only what feeds the duplication)
         b_ji >= α_i - α_j           for (j, i) ∈ E
         α, b binary

T_i is op i's time on the replica, L_ji the bytes of tensor (j, i) on one replica (a
batch slice is 1/D of the tensor; a tensor every replica already has in full costs
nothing to broadcast), L_gl the gradient's bytes and τ the bottleneck bandwidth among
the D replica GPUs. Solved with CBC through PuLP, in bytes and seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pulp

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.batch import Aggregation
from tagplan.planner.graph.ir import GraphIR

__all__ = ["SfbDecision", "solve_sfb"]


@dataclass(frozen=True)
class SfbDecision:
    """The ILP's answer for one gradient."""

    parameter: str
    duplicate_ops: tuple[str, ...]  # empty when synchronizing is cheaper
    saving_s: float  # objective improvement over plain synchronization (>= 0)
    solve_time_s: float


def _neighbourhood(ir: GraphIR, gradient_op: int, depth: int) -> list[int]:
    """Ancestors of the gradient's producer within ``depth`` data edges (and itself),
    leaving out ops without inputs (batch inputs, constants) and stateful ops."""
    found = {gradient_op}
    frontier = [gradient_op]
    for _ in range(depth):
        nxt = []
        for op in frontier:
            for tensor in ir.inputs(op).tolist():
                producer = int(ir.tensor_producer[tensor])
                # inputs arrive split and variables are where they are: never duplicated
                source = len(ir.inputs(producer)) == 0 or bool(ir.stateful[producer])
                if producer not in found and not source:
                    found.add(producer)
                    nxt.append(producer)
        frontier = nxt
    return sorted(found)


def solve_sfb(
    ir: GraphIR,
    parameter: int,
    *,
    replicas: int,
    op_time_s: np.ndarray,
    bandwidth_bytes_per_s: float,
    depth: int = 3,
) -> SfbDecision:
    """TAG's SFB ILP for row ``parameter`` of ``ir.parameters`` on ``replicas`` GPUs.

    ``op_time_s`` is each op's time on one replica (its local batch).
    """
    if replicas < 2:
        raise InvalidInput("sufficient-factor broadcast needs at least two replicas")
    if not bandwidth_bytes_per_s > 0:
        raise InvalidInput("the bottleneck bandwidth must be positive")
    started = time.perf_counter()
    params = ir.parameters
    gradient = int(params.gradient_tensor[parameter])
    g = int(ir.tensor_producer[gradient])
    ops = _neighbourhood(ir, g, depth)
    inside = set(ops)
    d, tau = replicas, bandwidth_bytes_per_s
    problem = pulp.LpProblem("sfb", pulp.LpMinimize)
    alpha = {i: pulp.LpVariable(f"a{i}", cat="Binary") for i in ops}
    cut_terms = []
    edges: list[tuple[int, int, float]] = []
    for i in ops:
        for tensor in ir.inputs(i).tolist():
            j = int(ir.tensor_producer[tensor])
            batch = ir.tensor_batch_axis[tensor] >= 0
            everywhere = (not batch) and ir.tensor_aggregation[tensor] == Aggregation.REPLICATED
            size = 0.0 if everywhere else float(ir.tensor_bytes[tensor]) / (d if batch else 1)
            edges.append((j, i, size))
    for j, i, size in edges:
        b = pulp.LpVariable(f"b{j}_{i}_{len(cut_terms)}", cat="Binary")
        problem += b >= alpha[i] - (alpha[j] if j in inside else 0)
        cut_terms.append(d * (d - 1) * size / tau * b)
    for k in ops:
        if k == g:
            continue
        consumers = [i for j, i, _ in edges if j == k]
        problem += alpha[k] <= pulp.lpSum(alpha[i] for i in consumers)
    synchronize = 2 * (d - 1) / d * float(params.gradient_bytes[parameter]) / tau
    problem += (
        pulp.lpSum((d - 1) * float(op_time_s[i]) * alpha[i] for i in ops)
        + pulp.lpSum(cut_terms)
        - synchronize * alpha[g]
    )
    problem.solve(
        pulp.COIN_CMD(msg=False) if pulp.COIN_CMD().available() else pulp.PULP_CBC_CMD(msg=False)
    )
    if pulp.LpStatus[problem.status] != "Optimal":
        raise InvalidInput(f"SFB ILP for {params.names[parameter]!r}: {problem.status}")
    chosen = [i for i in ops if (alpha[i].value() or 0) > 0.5]
    value = float(pulp.value(problem.objective) or 0.0)
    return SfbDecision(
        parameter=params.names[parameter],
        duplicate_ops=tuple(ir.op_names[i] for i in chosen) if value < 0 else (),
        saving_s=max(0.0, -value),
        solve_time_s=time.perf_counter() - started,
    )
