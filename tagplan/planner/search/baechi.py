"""Baechi's memory-constrained model-parallel placers (Baechi §2), as baselines.

All three place *co-placement units* (Baechi §3.2: ops TensorFlow colocates — a variable with
its reads and updates — move together; here also a parameter with its optimizer slots and
update region) and all are heterogeneity-aware in compute time:

* **m-TOPO** (§2.2): units in topological order fill the GPUs one after another; each
  GPU takes up to its share of the total memory — Baechi's cap Σ m / n + max m, with the
  share made proportional to the GPU's speed — and never more than it holds;
* **m-ETF** (§2.3): list scheduling; the next ready op goes to the GPU where it finishes
  earliest — its inputs transferred (latency + bytes / bandwidth of the path), the GPU
  free, then its own compute time on that GPU (earliest start is ETF's rule; finishing
  time is its form for GPUs of different speed) — among the GPUs with memory left for
  its unit;
* **m-SCT** (§2.4): SCT's favourite children from the LP relaxation of its ILP, then
  list scheduling that keeps a favourite child on its parent's GPU when that GPU is
  free for it and otherwise prefers urgent ops, GPUs out of memory excluded.

Memory per unit is what Baechi charges: the variables it holds plus the outputs of its
ops. The result is a ``model-parallel`` strategy with every op placed.

Why one module: the three placers share the co-placement units, the device times and the
memory accounting; m-SCT's LP and schedule are the bulk, and belong with the others.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
import pulp

from tagplan.planner.cost.memory import FRAMEWORK_RESERVE_BYTES, op_memory
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.errors import BudgetExhausted, InvalidInput
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.search.grouping import atoms_of
from tagplan.planner.strategy import GroupDecision, Option, Strategy
from tagplan.planner.topology import Cluster

__all__ = ["favourite_children", "m_etf", "m_sct", "m_topo", "sct_schedule"]


def _device_times(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> np.ndarray:
    """Seconds of every op on every device (devices x ops), at the full batch."""
    by_type = {
        t: costs.op_times(t, ir.batch_size).seconds for t in set(cluster.device_type.tolist())
    }
    return np.stack([by_type[t] for t in cluster.device_type.tolist()])


def _unit_memory(ir: GraphIR, units: np.ndarray) -> np.ndarray:
    memory = op_memory(ir)
    per_op = memory.output_bytes + memory.persistent_bytes
    return np.bincount(units, weights=per_op, minlength=int(units.max()) + 1)


def _capacity(cluster: Cluster) -> np.ndarray:
    return np.maximum(cluster.device_memory_bytes - FRAMEWORK_RESERVE_BYTES, 0).astype(float)


def _strategy(ir: GraphIR, cluster: Cluster, device_of_op: np.ndarray, name: str) -> Strategy:
    placement = {ir.op_names[op]: str(cluster.device_names[d]) for op, d in enumerate(device_of_op)}
    decision = GroupDecision(
        device_groups=list(range(cluster.num_groups)),
        option=Option.MODEL_PARALLEL,
        placement=placement,
    )
    return Strategy(name=name, default=decision)


def m_topo(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> Strategy:
    """Baechi §2.2's m-TOPO with speed-proportional memory shares."""
    units = atoms_of(ir)
    memory = _unit_memory(ir, units)
    times = _device_times(ir, cluster, costs)
    speed = 1.0 / np.maximum(times.sum(axis=1), 1e-30)
    share = speed / speed.sum()
    capacity = _capacity(cluster)
    caps = np.minimum(memory.sum() * share + memory.max(), capacity)
    used = np.zeros(cluster.num_devices)
    device_of_unit = np.full(len(memory), -1, dtype=np.int64)
    current = 0
    first_op = np.full(len(memory), ir.num_ops, dtype=np.int64)
    np.minimum.at(first_op, units, np.arange(ir.num_ops))
    for unit in np.argsort(first_op, kind="stable").tolist():
        while current < cluster.num_devices - 1 and used[current] + memory[unit] > caps[current]:
            current += 1
        device_of_unit[unit] = current
        used[current] += memory[unit]
    return _strategy(ir, cluster, device_of_unit[units], "m-topo")


def m_etf(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> Strategy:
    """Baechi §2.3's m-ETF over ops, with units kept together."""
    latency, bandwidth = cluster.latency_s, cluster.bandwidth_bytes_per_s
    units = atoms_of(ir)
    memory = _unit_memory(ir, units)
    times = _device_times(ir, cluster, costs)
    step_time = times.sum(axis=1)
    capacity = _capacity(cluster)
    devices = np.arange(cluster.num_devices)
    used = np.zeros(cluster.num_devices)
    free_at = np.zeros(cluster.num_devices)
    finish = np.zeros(ir.num_ops)
    device_of_op = np.full(ir.num_ops, -1, dtype=np.int64)
    device_of_unit = np.full(len(memory), -1, dtype=np.int64)
    waiting = np.diff(ir.op_input_ptr).astype(np.int64) + np.diff(ir.control_ptr)
    consumers_of_op: list[list[int]] = [[] for _ in range(ir.num_ops)]
    for op in range(ir.num_ops):
        for tensor in ir.inputs(op).tolist():
            consumers_of_op[int(ir.tensor_producer[tensor])].append(op)
        for pred in ir.control_preds(op).tolist():
            consumers_of_op[pred].append(op)
    ready = [(0.0, op) for op in np.flatnonzero(waiting == 0).tolist()]
    heapq.heapify(ready)
    while ready:
        _, op = heapq.heappop(ready)
        unit = int(units[op])
        if device_of_unit[unit] >= 0:
            candidates = devices[[device_of_unit[unit]]]
        else:
            fits = devices[used + memory[unit] <= capacity]
            candidates = fits if len(fits) else devices[[int(np.argmax(capacity - used))]]
        arrival = np.zeros(len(candidates))
        for tensor in ir.inputs(op).tolist():
            producer = int(ir.tensor_producer[tensor])
            source = int(device_of_op[producer])
            cost = (
                latency[source, candidates]
                + ir.tensor_bytes[tensor] / bandwidth[source, candidates]
            )
            arrival = np.maximum(arrival, finish[producer] + cost)
        for pred in ir.control_preds(op).tolist():
            arrival = np.maximum(arrival, finish[pred])
        start = np.maximum(arrival, free_at[candidates])
        end = start + times[candidates, op]
        # ties (ops that take no time) go to the faster GPU
        choice = int(np.lexsort((step_time[candidates], end))[0])
        device = int(candidates[choice])
        if device_of_unit[unit] < 0:
            device_of_unit[unit] = device
            used[device] += memory[unit]
        device_of_op[op] = device
        finish[op] = end[choice]
        free_at[device] = end[choice]
        for consumer in consumers_of_op[op]:
            waiting[consumer] -= 1
            if waiting[consumer] == 0:
                heapq.heappush(ready, (float(finish[op]), consumer))
    return _strategy(ir, cluster, device_of_op, "m-etf")


# --------------------------------------------------------------------------- m-SCT


def _op_dag(ir: GraphIR) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Distinct op-to-op edges: (src, dst, bytes summed over the tensors, carries data)."""
    counts = np.diff(ir.tensor_consumer_ptr)
    data_src = np.repeat(ir.tensor_producer, counts).astype(np.int64)
    data_dst = ir.tensor_consumer_op.astype(np.int64)
    data_bytes = np.repeat(ir.tensor_bytes, counts).astype(np.float64)
    control_dst = np.repeat(np.arange(ir.num_ops), np.diff(ir.control_ptr))
    src = np.concatenate([data_src, ir.control_pred.astype(np.int64)])
    dst = np.concatenate([data_dst, control_dst.astype(np.int64)])
    nbytes = np.concatenate([data_bytes, np.zeros(len(control_dst))])
    data = np.concatenate([np.ones(len(data_src), bool), np.zeros(len(control_dst), bool)])
    keep = src != dst
    key = src[keep] * ir.num_ops + dst[keep]
    unique, index = np.unique(key, return_inverse=True)
    summed = np.bincount(index, weights=nbytes[keep], minlength=len(unique))
    carries = np.bincount(index, weights=data[keep], minlength=len(unique)) > 0
    return unique // ir.num_ops, unique % ir.num_ops, summed, carries


def favourite_children(
    num_ops: int,
    src: np.ndarray,
    dst: np.ndarray,
    compute_s: np.ndarray,
    comm_s: np.ndarray,
    *,
    eligible: np.ndarray | None = None,
    threshold: float = 0.1,
    time_limit_s: float | None = None,
) -> np.ndarray:
    """Each op's favourite child from the LP relaxation of SCT's ILP (Baechi §2.4, eq. 2).

    Over the DAG's edges i -> j with compute times p and communication times c:

    .. math::

        \\min w \\;\\text{s.t.}\\; s_j \\ge s_i + p_i + c_{ij} x_{ij},\\;
        s_i + p_i \\le w,\\; \\sum_j x_{ij} \\ge d^+(i) - 1,\\;
        \\sum_i x_{ij} \\ge d^-(j) - 1,\\; 0 \\le x \\le 1,\\; s \\ge 0

    ``x_ij = 0`` means j is i's favourite child (it runs on i's device, so the edge costs
    nothing); the two degree constraints allow at most one favourite child per op and
    one favourite parent per op. The relaxed ``x`` is rounded with Baechi's threshold
    (§4, "LP Modifications": an edge is a favourite when ``x < threshold``, 0.1 in
    practice, which leaves almost no op with two); any op still left with two
    favourite children, or two favourite parents, keeps the edge with the smallest
    ``x`` (then the first). Edges not ``eligible`` (ops that share a device anyway) are
    never favourites. Solved with CBC through PuLP, in microseconds.

    Returns the favourite child of every op, ``-1`` for none.

    Shapes: ``src``, ``dst``, ``comm_s``, ``eligible``: (|E|,); ``compute_s``: (num_ops,).

    >>> favourite_children(3, np.array([0, 0]), np.array([1, 2]),
    ...                    np.array([1.0, 1.0, 3.0]), np.array([1.0, 1.0])).tolist()
    [2, -1, -1]
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    favourite = np.full(num_ops, -1, dtype=np.int64)
    if len(src) == 0:
        return favourite
    eligible = np.ones(len(src), bool) if eligible is None else np.asarray(eligible, bool)
    scale = 1e6  # seconds -> microseconds keeps the LP away from CBC's tolerances
    p = np.asarray(compute_s, dtype=np.float64) * scale
    c = np.asarray(comm_s, dtype=np.float64) * scale
    problem = pulp.LpProblem("sct_favourite_child", pulp.LpMinimize)
    makespan = pulp.LpVariable("w", lowBound=0)
    start = [pulp.LpVariable(f"s{i}", lowBound=0) for i in range(num_ops)]
    x = [
        pulp.LpVariable(f"x{e}", lowBound=0 if eligible[e] else 1, upBound=1)
        for e in range(len(src))
    ]
    problem += makespan
    for e, (i, j) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
        problem += start[j] - start[i] - float(c[e]) * x[e] >= float(p[i])
    for i in range(num_ops):
        problem += start[i] - makespan <= -float(p[i])
    for ends in (src, dst):
        order = np.argsort(ends, kind="stable")
        bounds = np.searchsorted(ends[order], np.arange(num_ops + 1))
        for op in range(num_ops):
            edges = order[bounds[op] : bounds[op + 1]]
            if len(edges) > 1:
                problem += pulp.lpSum(x[e] for e in edges.tolist()) >= len(edges) - 1
    problem.solve(_cbc(time_limit_s))
    if time_limit_s is not None and pulp.LpStatus[problem.status] != "Optimal":
        raise BudgetExhausted(f"SCT's favourite-child LP did not finish in {time_limit_s:.1f} s")
    if pulp.LpStatus[problem.status] != "Optimal":
        raise InvalidInput(f"SCT's favourite-child LP: {pulp.LpStatus[problem.status]}")
    value = np.array([xe.value() or 0.0 for xe in x])
    parent = np.full(num_ops, -1, dtype=np.int64)
    # smallest x first, so conflicts keep the LP's clearest choice
    for e in np.lexsort((np.arange(len(src)), value)).tolist():
        if value[e] >= threshold or not eligible[e]:
            break
        i, j = int(src[e]), int(dst[e])
        if favourite[i] < 0 and parent[j] < 0:
            favourite[i], parent[j] = j, i
    return favourite


def _cbc(time_limit_s: float | None = None) -> pulp.LpSolver:
    """CBC, the system's if installed, stopped after ``time_limit_s`` (whole seconds, at
    least one: CBC's own resolution)."""
    limit = None if time_limit_s is None else max(1, math.ceil(time_limit_s))
    if pulp.COIN_CMD().available():
        return pulp.COIN_CMD(msg=False, timeLimit=limit)
    return pulp.PULP_CBC_CMD(msg=False, timeLimit=limit)


def sct_schedule(
    times: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    nbytes: np.ndarray,
    *,
    latency_s: np.ndarray,
    bandwidth_bytes_per_s: np.ndarray,
    favourite: np.ndarray,
    units: np.ndarray,
    unit_memory: np.ndarray,
    capacity: np.ndarray,
) -> np.ndarray:
    """SCT's list scheduling for a finite number of devices with Baechi's memory rule
    (Baechi §2.4), over co-placement units (§3.1–3.2); returns each op's device.

    Time advances from event to event (a device frees up, data arrives). A free device
    whose last op's favourite child is ready, and gets its data there first, is *awake*:
    it runs the favourite child as soon as its inputs are there, and meanwhile only an
    *urgent* op (one whose inputs are on every device it may use, so it can begin right
    away anywhere); otherwise it takes a ready op whose inputs are there, urgent ones
    first, then the earliest arrived. For GPUs of different speed a non-favourite op is
    only taken by a device on which it finishes no later than on any other that would
    take it (ETF's earliest-start rule in its finishing-time form, as in :func:`m_etf`;
    an awake device would not take a non-urgent op). The first op
    of a unit pins the unit to its device and reserves the unit's memory; a device
    without room for a unit is excluded for it (m-SCT's rule: a full device takes no
    more placements); when no device has room the one with the most left takes it. Ops
    without work that read only such ops (constants, variable handles and reads), and
    ops reading only those whose output a single op reads (a ``Fill`` of a constant
    shape), are not scheduled themselves: their unit goes with the first op placed that
    reads them or shares their unit, and their work runs just before that reader
    (Baechi fuses such ops into their neighbours, §3.2–3.3). Otherwise an op that
    depends on nothing would start at time 0 on any idle GPU, far from its reader.

    Edge e's data goes from device a to b in ``latency_s[a, b] + nbytes[e] /
    bandwidth_bytes_per_s[a, b]`` (nothing on one device; ``nbytes`` is NaN for a
    control edge, which carries no data).

    Shapes: ``times``: (|D|, |V|) seconds; ``src``, ``dst``, ``nbytes``: (|E|,);
    ``latency_s``, ``bandwidth_bytes_per_s``: (|D|, |D|); ``favourite``, ``units``: (|V|,);
    ``unit_memory``: (num_units,); ``capacity``: (|D|,) bytes.
    """
    num_devices, num_ops = times.shape
    preds: list[list[int]] = [[] for _ in range(num_ops)]  # edge ids into each op
    succs: list[list[int]] = [[] for _ in range(num_ops)]
    for e, (i, j) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
        preds[j].append(e)
        succs[i].append(e)
    # ops that follow their reader (see the docstring); they hold back no consumer
    free = times.max(axis=0) == 0
    for op in _topological_order(num_ops, src, dst).tolist():
        free[op] = free[op] and all(free[src[e]] for e in preds[op])
    readers = np.array([len({int(dst[e]) for e in s}) for s in succs])
    follower = free | ((readers == 1) & np.array([all(free[src[e]] for e in p) for p in preds]))
    waiting = np.array([sum(not follower[src[e]] for e in p) for p in preds], dtype=np.int64)
    arrival = np.full((num_ops, num_devices), np.inf)
    finish = np.zeros(num_ops)
    device_of_op = np.full(num_ops, -1, dtype=np.int64)
    device_of_unit = np.full(len(unit_memory), -1, dtype=np.int64)
    used = np.zeros(num_devices)
    free_at = np.zeros(num_devices)
    last_op = np.full(num_devices, -1, dtype=np.int64)
    # faster devices look first, so ties go to them
    device_order = np.lexsort((np.arange(num_devices), times.sum(axis=1))).tolist()
    ready: list[int] = []

    def make_ready(op: int) -> None:
        row = np.zeros(num_devices)
        for e in preds[op]:
            i = int(src[e])
            a = device_of_op[i]
            if follower[i] and a < 0:  # placed with its unit later, at no cost here
                continue
            if np.isnan(nbytes[e]):
                row = np.maximum(row, finish[i])
            else:
                transfer = latency_s[a] + nbytes[e] / bandwidth_bytes_per_s[a]
                transfer[a] = 0.0
                row = np.maximum(row, finish[i] + transfer)
        arrival[op] = row
        ready.append(op)

    def pin(unit: int, d: int) -> None:
        if device_of_unit[unit] >= 0:
            return
        if used[d] + unit_memory[unit] > capacity[d]:  # the nearest GPU with room
            fits = np.flatnonzero(used + unit_memory[unit] <= capacity)
            if len(fits):
                d = int(fits[np.lexsort((latency_s[d, fits], -bandwidth_bytes_per_s[d, fits]))[0]])
            else:
                d = int(np.argmax(capacity - used))
        device_of_unit[unit] = d
        used[d] += unit_memory[unit]
        device_of_op[follower & (units == unit)] = d

    def attach(op: int, d: int) -> float:
        work = 0.0
        for e in preds[op]:
            i = int(src[e])
            if follower[i] and device_of_op[i] < 0:
                pin(int(units[i]), d)
                work += times[device_of_op[i], i] + attach(i, int(device_of_op[i]))
        return work

    for op in np.flatnonzero((waiting == 0) & ~follower).tolist():
        make_ready(op)
    t = 0.0
    relaxed = False  # set only if no rule lets any device move (never expected)
    while ready:
        ops = np.array(ready, dtype=np.int64)
        unit_of = units[ops]
        pinned = device_of_unit[unit_of]
        fits = used[None, :] + unit_memory[unit_of][:, None] <= capacity[None, :]
        roomiest = np.argmax(capacity - used)
        fits[~fits.any(axis=1), roomiest] = True
        allowed = np.where(
            (pinned >= 0)[:, None], np.arange(num_devices)[None, :] == pinned[:, None], fits
        )
        here = arrival[ops]
        urgent = np.where(allowed, here, -np.inf).max(axis=1)
        now_urgent = urgent <= t
        position = {op: k for k, op in enumerate(ops.tolist())}
        awake: dict[int, int] = {}  # free device -> row of the favourite child it awaits
        for d in range(num_devices):
            if free_at[d] <= t and last_op[d] >= 0:
                k = position.get(int(favourite[last_op[d]]), -1)
                if k >= 0 and allowed[k, d] and here[k, d] <= here[k][allowed[k]].min():
                    awake[d] = k
        begin = np.maximum(np.maximum(here, free_at[None, :]), t)
        end = np.where(allowed, begin + times[:, ops].T, np.inf)
        for d, k in awake.items():  # an awake device takes nothing else but urgent ops
            others = ~now_urgent
            others[k] = False
            end[others, d] = np.inf
        best_end = end.min(axis=1)
        tol = 1e-12 + 1e-9 * np.abs(best_end)
        chosen = None
        for d in device_order:
            if free_at[d] > t:
                continue
            arrived = allowed[:, d] & (here[:, d] <= t)
            k = awake.get(d, -1)
            if k >= 0 and arrived[k]:
                chosen = (int(ops[k]), d)
                break
            fine = arrived & ((t + times[d, ops] <= best_end + tol) | relaxed)
            if k >= 0 and not relaxed:
                fine &= now_urgent
            if fine.any():
                candidates = np.flatnonzero(fine)
                rank = np.lexsort((ops[candidates], here[candidates, d], ~now_urgent[candidates]))
                chosen = (int(ops[candidates[rank[0]]]), d)
                break
        if chosen is None:
            later = np.concatenate([free_at[free_at > t], here[allowed & (here > t)]])
            if len(later):
                t, relaxed = float(later.min()), False
            else:
                relaxed = True
            continue
        op, d = chosen
        ready.remove(op)
        unit = int(units[op])
        pin(unit, d)
        fused = attach(op, d)  # work of followers placed with it runs first
        device_of_op[op] = d
        finish[op] = t + fused + times[d, op]
        free_at[d] = finish[op]
        last_op[d] = op
        relaxed = False
        for e in succs[op]:
            j = int(dst[e])
            waiting[j] -= 1
            if waiting[j] == 0:
                make_ready(j)
    for op in np.flatnonzero(device_of_op < 0).tolist():  # read by nothing placed
        pin(int(units[op]), device_order[0])
    return device_of_op


def _topological_order(num_ops: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Kahn's order of the DAG's ops (by index among the ready ones)."""
    indegree = np.bincount(dst, minlength=num_ops)
    order = np.argsort(src, kind="stable")
    bounds = np.searchsorted(src[order], np.arange(num_ops + 1))
    ready = list(np.flatnonzero(indegree == 0)[::-1])
    out = []
    while ready:
        op = int(ready.pop())
        out.append(op)
        for e in order[bounds[op] : bounds[op + 1]].tolist():
            j = int(dst[e])
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    return np.array(out, dtype=np.int64)


def m_sct(
    ir: GraphIR, cluster: Cluster, costs: OpCostModel, *, time_limit_s: float | None = None
) -> Strategy:
    """Baechi §2.4's m-SCT over ops, with units kept together.

    ``time_limit_s`` bounds the LP's solve (:class:`~tagplan.planner.errors.BudgetExhausted`
    past it).

    The favourite-child LP (:func:`favourite_children`) uses each op's mean time over
    the GPUs and each edge's transfer over the slowest link between two GPUs (SCT
    assumes one delay per edge: the largest latency plus the bytes over the smallest
    bandwidth); list scheduling (:func:`sct_schedule`) then uses the
    real times on each GPU and the real path between each pair.
    """
    units = atoms_of(ir)
    memory = _unit_memory(ir, units)
    times = _device_times(ir, cluster, costs)
    src, dst, nbytes, data = _op_dag(ir)
    latency, bandwidth = cluster.latency_s, cluster.bandwidth_bytes_per_s
    off_diagonal = ~np.eye(cluster.num_devices, dtype=bool)
    if off_diagonal.any():  # the slowest link between two GPUs
        worst = latency[off_diagonal].max() + nbytes / bandwidth[off_diagonal].min()
    else:
        worst = np.zeros(len(src))
    favourite = favourite_children(
        ir.num_ops,
        src,
        dst,
        times.mean(axis=0),
        np.where(data, worst, 0.0),
        eligible=units[src] != units[dst],
        time_limit_s=time_limit_s,
    )
    device_of_op = sct_schedule(
        times,
        src,
        dst,
        np.where(data, nbytes, np.nan),
        latency_s=latency,
        bandwidth_bytes_per_s=bandwidth,
        favourite=favourite,
        units=units,
        unit_memory=memory,
        capacity=_capacity(cluster),
    )
    return _strategy(ir, cluster, device_of_op, "m-sct")
