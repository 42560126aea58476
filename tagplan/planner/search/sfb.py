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

Every term but the last is non-negative, so when duplicating g alone costs at least
what the broadcast saves, ``(D-1) T_g >= 2 (D-1)/D · L_gl / τ``, no α with α_g = 1 beats
synchronizing (objective 0, nothing duplicated) and the ILP is not built: most gradients
of convolutional networks (a filter gradient is slow to compute and small to send).

:func:`apply_sfb` runs the ILP for every gradient a strategy synchronizes and keeps the
answers the simulator confirms: all of them, none, or those that make the step faster
added or dropped one at a time, whichever steps fastest.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
import pulp

from tagplan.planner.compile.placement import batch_slices, place
from tagplan.planner.cost.comm import CommModel
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.errors import InvalidInput
from tagplan.planner.evaluate import Evaluation, Evaluator, resolve_planned
from tagplan.planner.graph.batch import Aggregation
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.strategy import Mode, Option, Strategy
from tagplan.planner.topology import Cluster

__all__ = ["SfbApplied", "SfbDecision", "apply_sfb", "neighbourhood", "solve_sfb"]

_SFB_PATIENCE = 4  # changes in a row not kept before a pass of _Toggle stops


@dataclass(frozen=True)
class SfbDecision:
    """The ILP's answer for one gradient."""

    parameter: str
    duplicate_ops: tuple[str, ...]  # empty when synchronizing is cheaper
    saving_s: float  # objective improvement over plain synchronization (>= 0)
    solve_time_s: float
    applied: bool = False  # the strategy apply_sfb returns duplicates these ops


def neighbourhood(
    ir: GraphIR, gradient_op: int, depth: int, allowed: np.ndarray | None = None
) -> list[int]:
    """Ancestors of the gradient's producer within ``depth`` data edges (and itself),
    leaving out ops without inputs (batch inputs, constants), stateful ops and ops not
    ``allowed`` (the search does not go past them)."""
    found = {gradient_op}
    frontier = [gradient_op]
    for _ in range(depth):
        nxt = []
        for op in frontier:
            for tensor in ir.inputs(op).tolist():
                producer = int(ir.tensor_producer[tensor])
                # inputs arrive split and variables are where they are: never duplicated
                source = len(ir.inputs(producer)) == 0 or bool(ir.stateful[producer])
                source = source or (allowed is not None and not allowed[producer])
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
    allowed: np.ndarray | None = None,
    synchronized_tensor: int | None = None,
) -> SfbDecision:
    """TAG's SFB ILP for row ``parameter`` of ``ir.parameters`` on ``replicas`` GPUs.

    ``op_time_s`` is each op's time on one replica (its local batch); ``allowed`` (bool
    per op, default all) marks the ops that may be duplicated; ``synchronized_tensor``
    is the tensor whose synchronization SFB would replace when it is not the gradient
    itself (a partial ``Sum`` the gradient is a ``Reshape`` of).
    """
    if replicas < 2:
        raise InvalidInput("sufficient-factor broadcast needs at least two replicas")
    if not bandwidth_bytes_per_s > 0:
        raise InvalidInput("the bottleneck bandwidth must be positive")
    started = time.perf_counter()
    params = ir.parameters
    gradient = int(
        params.gradient_tensor[parameter] if synchronized_tensor is None else synchronized_tensor
    )
    g = int(ir.tensor_producer[gradient])
    name = params.names[parameter]
    synchronize_s = (
        2 * (replicas - 1) / replicas * float(ir.tensor_bytes[gradient]) / bandwidth_bytes_per_s
    )
    if (replicas - 1) * float(op_time_s[g]) >= synchronize_s:
        # the module docstring's bound: synchronizing is optimal
        return SfbDecision(name, (), 0.0, time.perf_counter() - started)
    duplicate_ops, saving_s = _solve_ilp(
        ir, name, g, synchronize_s, replicas, op_time_s, bandwidth_bytes_per_s, depth, allowed
    )
    return SfbDecision(
        parameter=name,
        duplicate_ops=duplicate_ops,
        saving_s=saving_s,
        solve_time_s=time.perf_counter() - started,
    )


def _solve_ilp(
    ir: GraphIR,
    name: str,
    g: int,
    synchronize_s: float,
    replicas: int,
    op_time_s: np.ndarray,
    bandwidth_bytes_per_s: float,
    depth: int,
    allowed: np.ndarray | None,
) -> tuple[tuple[str, ...], float]:
    """The ILP of the module docstring for parameter ``name``, whose gradient op ``g``
    produces and synchronizing costs ``synchronize_s``: the ops to duplicate (none when
    synchronizing is cheaper) and the saving."""
    ops = neighbourhood(ir, g, depth, allowed)
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
    problem += (
        pulp.lpSum((d - 1) * float(op_time_s[i]) * alpha[i] for i in ops)
        + pulp.lpSum(cut_terms)
        - synchronize_s * alpha[g]
    )
    problem.solve(
        pulp.COIN_CMD(msg=False) if pulp.COIN_CMD().available() else pulp.PULP_CBC_CMD(msg=False)
    )
    if pulp.LpStatus[problem.status] != "Optimal":
        raise InvalidInput(f"SFB ILP for {name!r}: {problem.status}")
    chosen = [i for i in ops if (alpha[i].value() or 0) > 0.5]
    value = float(pulp.value(problem.objective) or 0.0)
    return tuple(ir.op_names[i] for i in chosen) if value < 0 else (), max(0.0, -value)


class _Modes:
    """What :func:`_sync_point` walks, as Python lists (it runs once per gradient and
    visits every duplicated op above it)."""

    def __init__(self, ir: GraphIR, mode: np.ndarray) -> None:
        self.mode = mode.tolist()
        self.producer = ir.tensor_producer.tolist()
        partial = np.isin(ir.tensor_aggregation, (Aggregation.SUM, Aggregation.MEAN))
        self.partial = partial.tolist()
        self.inputs = ir.input_lists


_SPLIT, _DUPLICATE = int(Mode.SPLIT), int(Mode.DUPLICATE)


def _sync_point(walk: _Modes, gradient: int) -> int | None:
    """The tensor whose synchronization carries ``gradient``, or ``None``.

    A split producer's output is summed over the replicas: the gradient itself. A
    duplicated producer works on sums taken before it: the partial sums (or means) of
    split ops it reads, directly or through other duplicated ops. With one such sum
    (a ``Reshape`` of a ``Sum`` over the batch) that tensor is the one SFB can replace;
    with several read directly (an ``AddN`` of partial gradients) the gradient stays
    the anchor and the sums are cuts of its ILP; otherwise ``None`` (not decided).
    """
    mode, producer_of, partial = walk.mode, walk.producer, walk.partial
    g = producer_of[gradient]
    if mode[g] == _SPLIT:
        return gradient
    if mode[g] != _DUPLICATE:
        return None
    sums: set[int] = set()
    seen, stack = {g}, [g]
    while stack:
        for tensor in walk.inputs[stack.pop()]:
            producer = producer_of[tensor]
            if partial[tensor] and mode[producer] == _SPLIT:
                sums.add(tensor)
            elif producer not in seen and mode[producer] == _DUPLICATE:
                seen.add(producer)
                stack.append(producer)
    if len(sums) == 1:
        return sums.pop()
    if sums and sums <= set(walk.inputs[g]):
        return gradient
    return None


def _synchronized_gradients(
    ir: GraphIR, strategy: Strategy, cluster: Cluster, costs: OpCostModel
) -> Iterator[tuple[int, int, np.ndarray, int, np.ndarray]]:
    """Every gradient the strategy synchronizes across two or more GPUs, largest first
    (found as they are asked for, so a time budget bounds the search for them too):
    (parameter row, the tensor synchronized, the GPUs, the largest local batch, ops that
    may be duplicated with it).

    A gradient is synchronized when its producer belongs to a ``replicate-allreduce``
    or ``replicate-ps`` group with batch rows on two or more GPUs and its value sums
    the replicas' partial results, at the tensor :func:`_sync_point` finds. The compiler
    duplicates an SFB op on the GPUs of its own group, but keeps parameter state (a
    variable, its slots and update region, and the ops colocated with a variable) where
    the synchronization puts it; so the ops that may join a gradient's subgraph are the
    other ops of replicated groups on the same GPUs.
    """
    resolved = resolve_planned(strategy, ir, cluster, work=costs.work)
    placement = place(ir, resolved)
    replicated = np.array(
        [
            resolved.option(group) in (Option.REPLICATE_ALLREDUCE, Option.REPLICATE_PS)
            for group in range(resolved.num_groups)
        ]
    )
    gpus_of_group: list[frozenset[int]] = []
    local_batch: list[int] = []
    for group in range(resolved.num_groups):
        devices, weights = resolved.replicas(group)
        rows = np.diff(batch_slices(weights, ir.batch_size))
        gpus_of_group.append(frozenset(devices[rows > 0].tolist()))
        local_batch.append(int(rows.max()))
    params = ir.parameters
    state = np.zeros(ir.num_ops, dtype=bool)
    for row in range(len(params)):
        state[params.variable_op[row]] = state[params.apply_op[row]] = True
        state[params.slot_op[params.slot_ptr[row] : params.slot_ptr[row + 1]]] = True
        state[params.region_op[params.region_ptr[row] : params.region_ptr[row + 1]]] = True
    state |= np.isin(ir.colocation, ir.colocation[ir.variable_bytes > 0])
    op_gpus = [gpus_of_group[int(group)] for group in resolved.op_group]
    allowed_on: dict[frozenset[int], np.ndarray] = {}
    walk = _Modes(ir, placement.op_mode)
    for row in np.argsort(-params.gradient_bytes, kind="stable").tolist():
        tensor = int(params.gradient_tensor[row])
        if tensor < 0:
            continue
        g = int(ir.tensor_producer[tensor])
        group = int(resolved.op_group[g])
        gpus = gpus_of_group[group]
        anchor = _sync_point(walk, tensor)
        if len(gpus) < 2 or not replicated[group] or anchor is None:
            continue
        allowed = allowed_on.get(gpus)
        if allowed is None:
            same = np.array([other == gpus for other in op_gpus])
            allowed = allowed_on[gpus] = replicated[resolved.op_group] & ~state & same
        if not allowed[ir.tensor_producer[anchor]]:
            continue
        yield row, anchor, np.array(sorted(gpus)), local_batch[group], allowed


class SfbApplied(NamedTuple):
    """What :func:`apply_sfb` decided: the strategy, one decision per synchronized
    gradient, and the strategy's simulation where the check made one."""

    strategy: Strategy
    decisions: list[SfbDecision]
    evaluation: Evaluation | None = None


def apply_sfb(
    strategy: Strategy,
    ir: GraphIR,
    cluster: Cluster,
    costs: OpCostModel,
    comm: CommModel | None = None,
    *,
    depth: int = 3,
    time_budget_s: float | None = None,
    evaluator: Evaluator | None = None,
) -> SfbApplied:
    """Decide sufficient-factor broadcast for every gradient ``strategy`` synchronizes
    (TAG §4.2.3: "double checking opportunities of applying SFB on op groups for which
    MCTS has produced a replication option").

    For each parameter whose gradient is summed over replicas on two or more GPUs (a
    ``replicate-allreduce`` or ``replicate-ps`` group), :func:`solve_sfb` is given the
    replica GPUs' bottleneck bandwidth (the slowest path between two of them), the op
    times at the largest local batch on the slowest of their GPU types, and only ops the
    compiler can duplicate with the gradient (ops of replicated groups on the same
    GPUs; stateful ops never). Gradients are taken largest first; with
    ``time_budget_s`` the remaining ones are left synchronized once it is spent.

    The ILP prices communication in isolation, so the simulator decides which of its
    proposals are kept (:class:`_Toggle`): every one, none, or those kept by adding them
    one at a time or dropping them one at a time, whichever steps fastest (a strategy
    that runs out of memory loses to one that fits); with ``time_budget_s`` the passes
    stop once it is spent. Any ``sfb`` the strategy already has is decided afresh, so
    applying this twice gives the same strategy. ``evaluator``
    simulates them (one of this graph and cluster: a planner's, whose compiler already
    holds most of the strategy's parts); a new one with ``costs`` and ``comm`` otherwise.

    Returns the strategy with ``sfb`` filled in, one decision per synchronized gradient
    (``applied`` when the returned strategy duplicates its ops), and the simulation of the
    returned strategy when the check made one (a planner answers with it rather than
    simulating it again). A pipelined strategy comes back as it is: its stages accumulate
    gradients over micro-batches, which duplicating a gradient's subgraph on every
    replica would undo.
    """
    if strategy.pipeline is not None:  # micro-batches accumulate their own gradients
        return SfbApplied(strategy, [])
    started = time.perf_counter()
    plain = strategy.model_copy(update={"sfb": {}})
    candidates = _synchronized_gradients(ir, plain, cluster, costs)
    decisions: list[SfbDecision] = []
    times: dict[tuple[int, int], np.ndarray] = {}
    for row, anchor, gpus, local, allowed in candidates:
        if time_budget_s is not None and time.perf_counter() - started > time_budget_s:
            break
        per_type = []
        for t in sorted({int(cluster.device_type[d]) for d in gpus.tolist()}):
            if (t, local) not in times:
                times[t, local] = costs.op_times(t, local).seconds
            per_type.append(times[t, local])
        slowest = max(per_type, key=lambda seconds: float(seconds.sum()))
        decisions.append(
            solve_sfb(
                ir,
                row,
                replicas=len(gpus),
                op_time_s=slowest,
                bandwidth_bytes_per_s=cluster.min_bandwidth_bytes_per_s(gpus),
                depth=depth,
                allowed=allowed,
                synchronized_tensor=anchor,
            )
        )
    proposals = sorted((d for d in decisions if d.duplicate_ops), key=lambda d: -d.saving_s)
    if not proposals:
        return SfbApplied(plain, decisions)
    if evaluator is None:
        evaluator = Evaluator(ir, cluster, costs=costs, comm=comm)
    every = {d.parameter: list(d.duplicate_ops) for d in proposals}
    with_none = evaluator.evaluate(plain)
    with_every = evaluator.evaluate(plain.model_copy(update={"sfb": every}))
    found = [(every, with_every), ({}, with_none)]
    if len(proposals) > 1:  # with one, adding and dropping it are the two simulated above
        ends_at = started + time_budget_s if time_budget_s is not None else float("inf")
        toggle = _Toggle(plain, evaluator, ends_at)
        found[1:1] = [
            toggle.run(proposals, {}, with_none, add=True),
            toggle.run(proposals[::-1], every, with_every, add=False),
        ]
    chosen, kept = min(found, key=lambda f: (f[1].result.oom, f[1].step_time_s))
    applied = [replace(d, applied=d.parameter in chosen) for d in decisions]
    return SfbApplied(kept.strategy, applied, kept)


class _Toggle:
    """Proposals of the ILP added or dropped one at a time (TAG §3.2: the choice between
    SFB and synchronization "needs to be examined for each gradient").

    The ILP prices each gradient's traffic alone, so the step with every proposal is not
    the sum of their savings: each duplicated subgraph also lengthens the backward pass a
    little, and together they can cost more than they save, or a few of them can save more
    than all. :func:`apply_sfb` keeps the fastest of: every proposal, none, the proposals
    added one at a time from none (largest saving first), and dropped one at a time from
    every one (smallest saving first). A change is kept when the step with it is faster
    and fits wherever the step before it fits. A pass stops after ``_SFB_PATIENCE``
    changes in a row are not kept (the rest are alike or promise less) or at ``ends_at``
    (``time.perf_counter()``).
    """

    def __init__(self, plain: Strategy, evaluator: Evaluator, ends_at: float) -> None:
        self.plain, self.evaluator, self.ends_at = plain, evaluator, ends_at

    def run(
        self,
        order: list[SfbDecision],
        chosen: dict[str, list[str]],
        kept: Evaluation,
        *,
        add: bool,
    ) -> tuple[dict[str, list[str]], Evaluation]:
        """The subgraphs chosen after one pass over ``order`` from ``chosen`` (whose step
        ``kept`` simulates), and the simulation of the strategy with them."""
        rejected = 0
        for decision in order:
            if rejected >= _SFB_PATIENCE or time.perf_counter() > self.ends_at:
                break
            trial = dict(chosen)
            if add:
                trial[decision.parameter] = list(decision.duplicate_ops)
            else:
                del trial[decision.parameter]
            after = self.evaluator.evaluate(self.plain.model_copy(update={"sfb": trial}))
            if _fits_as_well(after, kept) and after.step_time_s < kept.step_time_s:
                chosen, kept, rejected = trial, after, 0
            else:
                rejected += 1
        return chosen, kept


def _fits_as_well(after: Evaluation, before: Evaluation) -> bool:
    """Whether ``after`` fits in memory wherever ``before`` does."""
    return not after.result.oom or before.result.oom
