"""Baechi's memory-constrained model-parallel placers (Baechi §2), as baselines.

All three place *co-placement units* (Baechi §3.2: ops TensorFlow colocates — a variable with
its reads and updates — move together; here also a parameter with its optimizer slots and
update region):

* **m-TOPO** (§2.2): units in topological order fill the GPUs one after another; each
  GPU takes up to its share of the total memory — Baechi's cap Σ m / n + max m, with the
  share made proportional to the GPU's speed (Baechi's non-uniform m-TOPO) — and never
  more than it holds;
* **m-ETF** (§2.3): Baechi's execution simulator (§4.2) run as a list scheduler: time
  advances from event to event, and at each instant the ready (op, device) pairs that
  can start now are taken in priority order (topological rank), each op on the free
  GPU where it finishes first. So every op starts at the earliest time any pair could
  (ETF's rule; finishing first among equal starts is its form for GPUs of different
  speed). An input from another GPU goes through the one transfer queue of the sender
  and then of the receiver (§3.4: transfers serialize at both ends) and is cached
  there; GPUs without memory for an op's unit are excluded (§2.3, §3.1);
* **m-SCT** (§2.4): SCT's favourite children from the LP relaxation of its ILP, then
  the same simulator, where a free GPU whose last op's favourite child can begin there
  no later than anywhere waits for it, taking meanwhile only urgent ops (those that
  can begin now on every GPU they may use).

m-ETF and m-SCT see the allocation as Baechi does (§4.1): every op at the time profiled on
one GPU (the first), every transfer at the cost measured between one pair (the first two
GPUs), each GPU with its own memory. On equal GPUs that is the allocation itself; on a
mixed one it is what Baechi's own code would be given, and scheduling with each GPU's and
each link's real figures instead came out worse there (BERT-Large on ``cloud``: 8.9 s
against the original's 2.9 s), so the baselines keep Baechi's view.

Memory is Baechi's dynamic estimate (§4.2): a unit's variables from its first op on,
each op's outputs until their last reader has run; m-TOPO charges a unit its variables
plus all its ops' outputs. The result is a ``model-parallel`` strategy with every op
placed. The schedules match Baechi's code on the same inputs (see
``bench/baechi_original.py``).

Why one module: the three placers share the co-placement units, the device times and the
memory accounting; m-ETF and m-SCT share the simulator, the bulk of the module.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import pulp

from tagplan.planner.cost.memory import FRAMEWORK_RESERVE_BYTES, op_memory
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.csr import row_ranges
from tagplan.planner.errors import BudgetExhausted, InvalidInput
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.search.grouping import atoms_of
from tagplan.planner.strategy import GroupDecision, Option, Strategy
from tagplan.planner.topology import Cluster

__all__ = [
    "OpGraph",
    "ProfiledView",
    "favourite_children",
    "m_etf",
    "m_sct",
    "m_topo",
    "placement_strategy",
    "sct_schedule",
]

# Baechi's profiles give every op at least a microsecond; with less, a chain of ops
# that do no work would hold a device free and draw every op after it by tie.
MIN_OP_TIME_S = 1e-6
SAME_TIME_S = 1e-12  # events closer than this happen at once
HEAD_OPS = 32  # ready ops of highest priority looked at before all of them
KEPT_EDGE_US = 1e-3  # the LP's price of a favourite edge, against the makespan in µs
CONTROL_MESSAGE_BYTES = 4  # what a control dependency sends across devices (Baechi §4.1)


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


def placement_strategy(
    ir: GraphIR, cluster: Cluster, device_of_op: np.ndarray, name: str
) -> Strategy:
    """A ``model-parallel`` strategy placing op ``i`` on device ``device_of_op[i]``."""
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
    return placement_strategy(ir, cluster, device_of_unit[units], "m-topo")


# ------------------------------------------------------------- m-SCT's favourite children


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
    r"""Each op's favourite child from the LP relaxation of SCT's ILP (Baechi §2.4, eq. 2).

    Over the DAG's edges i -> j with compute times p and communication times c, with
    ``y = 1 - x`` (the share of the edge kept on one device):

    .. math::

        \min w \;\text{s.t.}\; s_j \ge s_i + p_i + c_{ij} (1 - y_{ij}),\;
        s_i + p_i \le w,\; \sum_j y_{ij} \le 1,\; \sum_i y_{ij} \le 1,\;
        0 \le y \le 1,\; s \ge 0

    ``y_ij = 1`` means j is i's favourite child (it runs on i's device, so the edge costs
    nothing); the two degree constraints allow one favourite child and one favourite
    parent per op. The LP's optimum is degenerate: an edge off the critical paths may
    take any ``y``. Baechi's interior-point solver (§4.2) leaves such an edge mid-way,
    so only the edges the makespan needs become favourites; a simplex vertex may put
    any of them at 1. So each unit of ``y`` costs :data:`KEPT_EDGE_US` (microseconds, a
    thousandth): the LP keeps on one device only what the makespan needs. An edge is a
    favourite when ``x < threshold`` (§4.3: 0.1 in practice); any op still
    left with two favourite children, or two favourite parents, keeps the edge with
    the smallest ``x`` (then the first). Edges not ``eligible`` (ops that share a device
    anyway) are never favourites. Solved with CBC through PuLP, in microseconds, within
    ``time_limit_s``.

    Returns the favourite child of every op, ``-1`` for none.

    Shapes: ``src``, ``dst``, ``comm_s``, ``eligible``: (|E|,); ``compute_s``: (num_ops,).

    >>> favourite_children(3, np.array([0, 0]), np.array([1, 2]),
    ...                    np.array([1.0, 1.0, 3.0]), np.array([1.0, 1.0])).tolist()
    [2, -1, -1]
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    if len(src) == 0:
        return np.full(num_ops, -1, dtype=np.int64)
    eligible = np.ones(len(src), bool) if eligible is None else np.asarray(eligible, bool)
    scale = 1e6  # seconds -> microseconds keeps the LP away from CBC's tolerances
    problem, kept = _favourite_lp(
        num_ops,
        src,
        dst,
        np.asarray(compute_s, dtype=np.float64) * scale,
        np.asarray(comm_s, dtype=np.float64) * scale,
        eligible,
    )
    _solve(problem, time_limit_s)
    x = np.full(len(src), np.inf)  # edges never favourites
    for e, y in kept.items():
        x[e] = 1.0 - (y.value() or 0.0)
    return _rounded(num_ops, src, dst, x, threshold)


def _favourite_lp(
    num_ops: int,
    src: np.ndarray,
    dst: np.ndarray,
    compute: np.ndarray,
    comm: np.ndarray,
    eligible: np.ndarray,
) -> tuple[pulp.LpProblem, dict[int, pulp.LpVariable]]:
    """SCT's relaxed LP (see :func:`favourite_children`) and its ``y`` by edge (eligible
    edges only: the others are always cut). ``s_i + p_i <= w`` is written for the ops
    without successors only; the edges imply it for the others."""
    problem = pulp.LpProblem("sct_favourite_child", pulp.LpMinimize)
    makespan = pulp.LpVariable("w", lowBound=0)
    start = [pulp.LpVariable(f"s{i}", lowBound=0) for i in range(num_ops)]
    kept = {e: pulp.LpVariable(f"y{e}", lowBound=0, upBound=1) for e in np.flatnonzero(eligible)}
    problem += makespan + KEPT_EDGE_US * pulp.lpSum(kept.values())
    for e, (i, j) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
        terms = [(start[j], 1.0), (start[i], -1.0)]
        if e in kept:
            terms.append((kept[e], float(comm[e])))
        problem += _constraint(terms, pulp.LpConstraintGE, float(compute[i] + comm[e]))
    for i in np.setdiff1d(np.arange(num_ops), src).tolist():
        problem += _constraint(
            [(start[i], 1.0), (makespan, -1.0)], pulp.LpConstraintLE, -compute[i]
        )
    for ends in (src, dst):
        order = np.argsort(ends, kind="stable")
        bounds = np.searchsorted(ends[order], np.arange(num_ops + 1))
        for op in range(num_ops):
            edges = [e for e in order[bounds[op] : bounds[op + 1]].tolist() if e in kept]
            if len(edges) > 1:
                problem += _constraint([(kept[e], 1.0) for e in edges], pulp.LpConstraintLE, 1.0)
    return problem, kept


def _constraint(
    terms: list[tuple[pulp.LpVariable, float]], sense: int, rhs: float
) -> pulp.LpConstraint:
    """``sum(coefficient * variable) <sense> rhs``, built without PuLP's operators (slow
    on tens of thousands of rows)."""
    return pulp.LpConstraint(pulp.LpAffineExpression(terms), sense=sense, rhs=float(rhs))


def _solve(problem: pulp.LpProblem, time_limit_s: float | None) -> None:
    problem.solve(_cbc(time_limit_s))
    if time_limit_s is not None and pulp.LpStatus[problem.status] != "Optimal":
        raise BudgetExhausted(f"SCT's favourite-child LP did not finish in {time_limit_s:.1f} s")
    if pulp.LpStatus[problem.status] != "Optimal":
        raise InvalidInput(f"SCT's favourite-child LP: {pulp.LpStatus[problem.status]}")


def _rounded(
    num_ops: int, src: np.ndarray, dst: np.ndarray, x: np.ndarray, threshold: float
) -> np.ndarray:
    """Favourite child per op: edges with ``x < threshold``, smallest ``x`` first, so
    conflicts keep the LP's clearest choice."""
    favourite = np.full(num_ops, -1, dtype=np.int64)
    parent = np.full(num_ops, -1, dtype=np.int64)
    for e in np.lexsort((np.arange(len(src)), x)).tolist():
        if x[e] >= threshold:
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


# ------------------------------------------------------------------ list scheduling


@dataclass(frozen=True)
class OpGraph:
    """The ops' dependencies as m-ETF and m-SCT schedule them: one edge per pair of
    communicating ops, carrying the tensors the consumer reads from the producer.

    A control dependency carries a message of :data:`CONTROL_MESSAGE_BYTES`, one per
    producer (TensorFlow sends one across devices; Baechi's graph generator charges it
    so, §4.1). Edges are sorted by (producer, consumer); edge ``e`` carries
    ``edge_tensor[edge_tensor_ptr[e]:edge_tensor_ptr[e + 1]]``, indices into
    ``tensor_bytes``.
    """

    num_ops: int
    src: np.ndarray  # (|E|,) producer op
    dst: np.ndarray  # (|E|,) consumer op
    edge_tensor_ptr: np.ndarray  # (|E| + 1,)
    edge_tensor: np.ndarray  # tensor ids, grouped by edge
    tensor_bytes: np.ndarray  # (num_tensors,)

    @classmethod
    def from_ir(cls, ir: GraphIR) -> OpGraph:
        """Every tensor to each distinct consumer, and every control dependency."""
        counts = np.diff(ir.tensor_consumer_ptr)
        data_tensor = np.repeat(np.arange(ir.num_tensors), counts)
        signalling, message = np.unique(ir.control_pred, return_inverse=True)
        src = np.concatenate([ir.tensor_producer[data_tensor], ir.control_pred])
        dst = np.concatenate(
            [ir.tensor_consumer_op, np.repeat(np.arange(ir.num_ops), np.diff(ir.control_ptr))]
        )
        tensor = np.concatenate([data_tensor, ir.num_tensors + message])
        nbytes = np.concatenate(
            [ir.tensor_bytes, np.full(len(signalling), CONTROL_MESSAGE_BYTES)]
        ).astype(np.float64)
        return cls._grouped(ir.num_ops, src.astype(np.int64), dst.astype(np.int64), tensor, nbytes)

    @classmethod
    def from_edges(
        cls, num_ops: int, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray
    ) -> OpGraph:
        """Each edge carries a tensor of its own of ``nbytes``."""
        src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
        tensor = np.arange(len(src))
        return cls._grouped(num_ops, src, dst, tensor, np.asarray(nbytes, dtype=np.float64))

    @classmethod
    def _grouped(
        cls, num_ops: int, src: np.ndarray, dst: np.ndarray, tensor: np.ndarray, nbytes: np.ndarray
    ) -> OpGraph:
        keep = src != dst
        key = src[keep] * num_ops + dst[keep]
        edges, edge_of = np.unique(key, return_inverse=True)
        pairs = np.unique(np.stack([edge_of, tensor[keep]], axis=1), axis=0)  # once per tensor
        ptr = np.searchsorted(pairs[:, 0], np.arange(len(edges) + 1))
        return cls(num_ops, edges // num_ops, edges % num_ops, ptr, pairs[:, 1], nbytes)

    def edge_bytes(self) -> np.ndarray:
        """Bytes each edge carries."""
        per_edge = np.repeat(np.arange(len(self.src)), self.tensor_counts())
        return np.bincount(
            per_edge, weights=self.tensor_bytes[self.edge_tensor], minlength=len(self.src)
        )

    def tensor_counts(self) -> np.ndarray:
        """Tensors each edge carries."""
        return np.diff(self.edge_tensor_ptr)

    def topological_rank(self) -> np.ndarray:
        """Each op's position in Kahn's breadth-first order (ready ops by index): the
        priority Baechi gives ops that can start at the same time."""
        indegree = np.bincount(self.dst, minlength=self.num_ops)
        bounds = np.searchsorted(self.src, np.arange(self.num_ops + 1))
        queue = deque(np.flatnonzero(indegree == 0).tolist())
        rank = np.empty(self.num_ops, dtype=np.int64)
        for position in range(self.num_ops):
            op = queue.popleft()
            rank[op] = position
            for j in self.dst[bounds[op] : bounds[op + 1]].tolist():
                indegree[j] -= 1
                if indegree[j] == 0:
                    queue.append(j)
        return rank


class _ListScheduler:
    """Baechi's execution simulator for m-ETF and m-SCT (§2.3, §2.4, §3.4, §4.2).

    Time advances from event to event. At each instant a free device takes the ready op
    of highest priority (topological rank) whose inputs are there; among the devices
    that could take the same op, the one where it finishes first (then the lowest id).
    That is ETF's rule: every op starts at the earliest time any (op, device) pair
    could. A transfer occupies the one communication queue of both its ends in turn
    (§3.4: sequential at both ends), and a tensor received once is cached on the
    receiver. With favourite children (m-SCT), a free device whose last op's favourite
    child is ready and starts there no later than anywhere is *awake*: it takes an
    *urgent* op (one that can start now on every device it may use) or else waits for
    the favourite child. The first op of a co-placement unit pins the unit and reserves
    its memory; a device without room is excluded for an unpinned unit (§2.3, §3.1).
    """

    def __init__(
        self,
        times: np.ndarray,
        graph: OpGraph,
        *,
        latency_s: np.ndarray,
        bandwidth_bytes_per_s: np.ndarray,
        units: np.ndarray,
        unit_bytes: np.ndarray,
        output_bytes: np.ndarray,
        capacity: np.ndarray,
        favourite: np.ndarray,
    ) -> None:
        self.times, self.graph = times, graph
        self.latency_s, self.bandwidth = latency_s, bandwidth_bytes_per_s
        self.units, self.unit_bytes, self.capacity = units, unit_bytes, capacity
        self.output_bytes = output_bytes
        self.favourite = favourite
        self.waits_for_children = bool((favourite >= 0).any())  # m-SCT; m-ETF has none
        self.least_capacity = float(capacity.min())
        num_devices, num_ops = times.shape
        self.devices = np.arange(num_devices)
        self.rank = graph.topological_rank()
        self.in_order = np.argsort(graph.dst, kind="stable")
        self.in_ptr = np.searchsorted(graph.dst[self.in_order], np.arange(num_ops + 1))
        self.out_ptr = np.searchsorted(graph.src, np.arange(num_ops + 1))
        self._init_transfers(num_devices)
        self.device_of_op = np.full(num_ops, -1, dtype=np.int64)
        self.device_of_unit = np.full(len(unit_bytes), -1, dtype=np.int64)
        self.finish = np.zeros(num_ops)
        self.free_at = np.zeros(num_devices)
        self.used = np.zeros(num_devices)
        self.last_op = np.full(num_devices, -1, dtype=np.int64)
        self.waiting = np.bincount(graph.dst, minlength=num_ops)
        self.unread = np.diff(self.out_ptr)
        self.running: list[tuple[float, int]] = []
        self.op_at_rank = np.argsort(self.rank)
        self.ready_at_rank = np.zeros(num_ops, dtype=bool)
        self.ready_at_rank[self.rank[self.waiting == 0]] = True
        self.num_ready = int(self.ready_at_rank.sum())
        # when each ready op's inputs could be on each device, valid while no queue changes
        self.data_ready = np.zeros((num_ops, num_devices))
        self.estimated_at = np.full(num_ops, -1, dtype=np.int64)
        self.queue_changes = 0
        self.t = 0.0

    def _init_transfers(self, num_devices: int) -> None:
        """Per edge and device: tensors still to send, their bytes, and the arrival of
        those already cached there; per tensor: its edges, its arrival on each device."""
        graph = self.graph
        counts = graph.tensor_counts()
        self.uncached_count = np.repeat(counts[:, None], num_devices, axis=1)
        self.uncached_bytes = np.repeat(graph.edge_bytes()[:, None], num_devices, axis=1)
        self.cached_arrival = np.full((len(graph.src), num_devices), -np.inf)
        by_tensor = np.argsort(graph.edge_tensor, kind="stable")
        self.tensor_edge = np.repeat(np.arange(len(graph.src)), counts)[by_tensor]
        self.tensor_edge_ptr = np.searchsorted(
            graph.edge_tensor[by_tensor], np.arange(len(graph.tensor_bytes) + 1)
        )
        self.arrival = np.full((len(graph.tensor_bytes), num_devices), np.inf)
        self.queue_free_at = np.zeros(num_devices)

    def run(self) -> np.ndarray:
        """Each op's device."""
        self._release_finished()
        while self.num_ready or self.running:
            self._step()
            self._release_finished()
        return self.device_of_op

    @property
    def _now(self) -> float:
        """The current instant, up to rounding: events closer than this coincide."""
        return self.t + SAME_TIME_S

    def _step(self) -> None:
        """Start one op now, or move on to the next event. The ops of highest priority
        are looked at first: when one of them starts now, no other can come first."""
        free = np.flatnonzero(self.free_at <= self._now)
        if len(free) == 0 or self.num_ready == 0:
            self.t = self._next_release()
            return
        ordered = self.op_at_rank[np.flatnonzero(self.ready_at_rank)]
        if len(ordered) > HEAD_OPS and not self._may_await(free):
            chosen = self._choose(self._view(ordered[:HEAD_OPS]), free)
            if chosen is not None:
                self._commit(*chosen)
                return
        view = self._view(ordered)
        chosen = self._choose(view, free)
        if chosen is None:
            self.t = self._next_event(view, free)
        else:
            self._commit(*chosen)

    def _next_release(self) -> float:
        """The next time a busy device frees up."""
        later = self.free_at[self.free_at > self._now].min(initial=np.inf)
        return float(min(later, self.running[0][0])) if self.running else float(later)

    def _may_await(self, free: np.ndarray) -> bool:
        """Whether a free device may be awake for a favourite child (m-SCT)."""
        if not self.waits_for_children:
            return False
        last = self.last_op[free]
        child = np.where(last >= 0, self.favourite[np.maximum(last, 0)], -1)
        child = child[child >= 0]
        return bool(self.ready_at_rank[self.rank[child]].any())

    def _release_finished(self) -> None:
        while self.running and self.running[0][0] <= self._now:
            _, op = heapq.heappop(self.running)
            for j in self.graph.dst[self.out_ptr[op] : self.out_ptr[op + 1]].tolist():
                self.waiting[j] -= 1
                if self.waiting[j] == 0:
                    self.ready_at_rank[self.rank[j]] = True
                    self.num_ready += 1

    def _data_ready(self, ops: np.ndarray) -> np.ndarray:
        """When each op's inputs could be on each device (ops x devices), each input edge
        sent now through both ends' queues (Baechi's estimate: one edge at a time)."""
        slots, lengths = row_ranges(self.in_ptr, ops)
        edges = self.in_order[slots]
        producer = self.graph.src[edges]
        source = self.device_of_op[producer]
        done = self.finish[producer]
        start = np.maximum(
            np.maximum(done, self.queue_free_at[source])[:, None], self.queue_free_at
        )
        transfer = (
            start
            + self.uncached_count[edges] * self.latency_s[source]
            + self.uncached_bytes[edges] / self.bandwidth[source]
        )
        remote = np.maximum(
            np.where(self.uncached_count[edges] > 0, transfer, -np.inf),
            self.cached_arrival[edges],
        )
        per_edge = np.where(source[:, None] == self.devices, done[:, None], remote)
        ready = np.zeros((len(ops), len(self.devices)))
        has_inputs = lengths > 0
        if has_inputs.any():
            starts = (np.cumsum(lengths) - lengths)[has_inputs]
            ready[has_inputs] = np.maximum(np.maximum.reduceat(per_edge, starts, axis=0), 0.0)
        return ready

    def _allowed(self, ops: np.ndarray) -> np.ndarray:
        """Devices each op may use: its unit's, or any with room for the unit (the
        roomiest when none has)."""
        unit = self.units[ops]
        pinned = self.device_of_unit[unit]
        needed = self.unit_bytes[unit] + self.output_bytes[ops]
        if self.used.max() + needed.max(initial=0.0) <= self.least_capacity:  # room anywhere
            return (pinned < 0)[:, None] | (self.devices == pinned[:, None])
        fits = self.used + needed[:, None] <= self.capacity
        fits[~fits.any(axis=1), int(np.argmax(self.capacity - self.used))] = True
        return np.where((pinned >= 0)[:, None], self.devices == pinned[:, None], fits)

    def _view(self, ops: np.ndarray) -> dict[str, np.ndarray]:
        """What the devices see of ``ops`` now: devices allowed, earliest begin on each,
        and the time each could begin everywhere it may go (its urgency)."""
        stale = ops[self.estimated_at[ops] != self.queue_changes]
        if len(stale):
            self.data_ready[stale] = self._data_ready(stale)
            self.estimated_at[stale] = self.queue_changes
        allowed = self._allowed(ops)
        begin = np.maximum(self.data_ready[ops], np.maximum(self.free_at, self.t))
        begin = np.where(allowed, begin, np.inf)
        urgent = np.where(allowed, begin, -np.inf).max(axis=1)
        return {"ops": ops, "allowed": allowed, "begin": begin, "urgent": urgent}

    def _awake(self, view: dict[str, np.ndarray], free: np.ndarray) -> dict[int, int]:
        """Free devices awake for a favourite child, with its row (m-SCT, §2.4): the
        last op's favourite child is ready, its unit not yet placed, and it can begin
        on the device no later than anywhere."""
        awake: dict[int, int] = {}
        if not self.waits_for_children:
            return awake
        for device in free.tolist():
            last = self.last_op[device]
            child = int(self.favourite[last]) if last >= 0 else -1
            if child < 0 or self.device_of_unit[self.units[child]] >= 0:
                continue
            rows = np.flatnonzero(view["ops"] == child)
            if len(rows) and view["begin"][rows[0], device] <= view["begin"][rows[0]].min():
                awake[device] = int(rows[0])
        return awake

    def _awake_pick(self, view: dict[str, np.ndarray], device: int, child_row: int) -> int:
        """Row an awake device takes now, or -1: an urgent op, else the favourite child."""
        pinned = self.device_of_unit[self.units[view["ops"]]]
        urgent = (view["urgent"] <= self._now) & ((pinned < 0) | (pinned == device))
        if urgent.any():
            return int(urgent.argmax())
        return child_row if view["begin"][child_row, device] <= self._now else -1

    def _choose(self, view: dict[str, np.ndarray], free: np.ndarray) -> tuple[int, int] | None:
        """(op, device) to start now: the highest-priority pick of the free devices (the
        view's rows are in priority order), on the one where it finishes first."""
        startable = view["begin"][:, free] <= self._now
        rows = np.where(startable.any(axis=0), startable.argmax(axis=0), -1)
        awake = self._awake(view, free)
        for k, device in enumerate(free.tolist()):
            if device in awake:
                rows[k] = self._awake_pick(view, device, awake[device])
        if (rows < 0).all():
            return None
        taking = rows >= 0
        ops, devices = view["ops"][rows[taking]], free[taking]
        best = np.lexsort((devices, self.times[devices, ops], rows[taking]))[0]
        return int(ops[best]), int(devices[best])

    def _next_event(self, view: dict[str, np.ndarray], free: np.ndarray) -> float:
        """The next time a device could act: a busy one frees, data arrives."""
        candidates = [np.array([self._next_release()])]
        awake = self._awake(view, free)
        for d in free.tolist():
            if d in awake:
                candidates.append(view["begin"][[awake[d]], d])
                candidates.append(view["urgent"])
            else:
                candidates.append(view["begin"][:, d])
        later = np.concatenate(candidates)
        return float(later[later > self._now].min())

    def _commit(self, op: int, device: int) -> None:
        """Run ``op`` on ``device``: send its inputs edge by edge, tensor by tensor."""
        data_ready = 0.0
        for slot in range(self.in_ptr[op], self.in_ptr[op + 1]):
            edge = int(self.in_order[slot])
            producer = int(self.graph.src[edge])
            if self.device_of_op[producer] == device:
                data_ready = max(data_ready, float(self.finish[producer]))
                continue
            for k in range(self.graph.edge_tensor_ptr[edge], self.graph.edge_tensor_ptr[edge + 1]):
                tensor = int(self.graph.edge_tensor[k])
                if not np.isfinite(self.arrival[tensor, device]):
                    self._send(tensor, producer, device)
                data_ready = max(data_ready, float(self.arrival[tensor, device]))
        self._allocate(op, device)
        self.device_of_op[op] = device
        self.finish[op] = max(self.t, data_ready) + self.times[device, op]
        self.free_at[device] = self.finish[op]
        self.last_op[device] = op
        self.ready_at_rank[self.rank[op]] = False
        self.num_ready -= 1
        heapq.heappush(self.running, (float(self.finish[op]), op))

    def _allocate(self, op: int, device: int) -> None:
        """Reserve the unit's variables when it is pinned and ``op``'s outputs until
        their last reader runs (Baechi's dynamic memory, §4.2)."""
        unit = int(self.units[op])
        if self.device_of_unit[unit] < 0:
            self.device_of_unit[unit] = device
            self.used[device] += self.unit_bytes[unit]
        self.used[device] += self.output_bytes[op]
        producers = self.graph.src[self.in_order[self.in_ptr[op] : self.in_ptr[op + 1]]]
        self.unread[producers] -= 1
        for producer in producers[self.unread[producers] == 0].tolist():
            self.used[self.device_of_op[producer]] -= self.output_bytes[producer]
        if self.unread[op] == 0:
            self.used[device] -= self.output_bytes[op]

    def _send(self, tensor: int, producer: int, device: int) -> None:
        """Queue ``tensor`` at its sender, then at ``device`` (§3.4), and cache it there."""
        source = int(self.device_of_op[producer])
        size = float(self.graph.tensor_bytes[tensor])
        seconds = float(self.latency_s[source, device] + size / self.bandwidth[source, device])
        send = max(float(self.finish[producer]), float(self.queue_free_at[source]))
        self.queue_free_at[source] = send + seconds
        receive = max(send, float(self.queue_free_at[device]))
        self.queue_free_at[device] = receive + seconds
        self.queue_changes += 1
        self.arrival[tensor, device] = receive + seconds
        edges = self.tensor_edge[self.tensor_edge_ptr[tensor] : self.tensor_edge_ptr[tensor + 1]]
        self.uncached_count[edges, device] -= 1
        self.uncached_bytes[edges, device] -= size
        self.cached_arrival[edges, device] = np.maximum(
            self.cached_arrival[edges, device], receive + seconds
        )


def sct_schedule(
    times: np.ndarray,
    graph: OpGraph,
    *,
    latency_s: np.ndarray,
    bandwidth_bytes_per_s: np.ndarray,
    units: np.ndarray,
    unit_bytes: np.ndarray,
    output_bytes: np.ndarray,
    capacity: np.ndarray,
    favourite: np.ndarray | None = None,
) -> np.ndarray:
    """Each op's device under m-SCT's list scheduling (Baechi §2.4), or m-ETF's (§2.3)
    without ``favourite`` children; see :class:`_ListScheduler` for the rule.

    A tensor goes from device a to b in ``latency_s[a, b] + bytes /
    bandwidth_bytes_per_s[a, b]``. A unit holds ``unit_bytes`` (its variables) on its
    device from its first op on; an op's outputs hold ``output_bytes`` there until their
    last reader has run.

    Shapes: ``times``: (|D|, |V|) seconds; ``latency_s``, ``bandwidth_bytes_per_s``:
    (|D|, |D|); ``units``, ``output_bytes``, ``favourite``: (|V|,); ``unit_bytes``:
    (num_units,); ``capacity``: (|D|,) bytes.
    """
    no_favourite = np.full(graph.num_ops, -1, dtype=np.int64)
    return _ListScheduler(
        np.asarray(times, dtype=np.float64),
        graph,
        latency_s=latency_s,
        bandwidth_bytes_per_s=bandwidth_bytes_per_s,
        units=np.asarray(units, dtype=np.int64),
        unit_bytes=np.asarray(unit_bytes, dtype=np.float64),
        output_bytes=np.asarray(output_bytes, dtype=np.float64),
        capacity=np.asarray(capacity, dtype=np.float64),
        favourite=no_favourite if favourite is None else np.asarray(favourite, dtype=np.int64),
    ).run()


@dataclass(frozen=True)
class ProfiledView:
    """The allocation as Baechi's profiler and communication benchmark measure it (module
    docstring): every op's time on the first GPU, one link (the first pair's) for every
    pair of GPUs, and each GPU's memory for the placer."""

    op_time_s: np.ndarray  # (num_ops,) on the first GPU
    latency_s: float  # of the first pair (0 with one GPU)
    bandwidth_bytes_per_s: float  # of the first pair (infinite with one GPU)
    capacity_bytes: np.ndarray  # (num_devices,)

    @classmethod
    def of(cls, ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> ProfiledView:
        first_type = int(cluster.device_type[0])
        one_gpu = cluster.num_devices == 1
        return cls(
            op_time_s=costs.op_times(first_type, ir.batch_size).seconds,
            latency_s=0.0 if one_gpu else float(cluster.latency_s[0, 1]),
            bandwidth_bytes_per_s=np.inf if one_gpu else float(cluster.bandwidth_bytes_per_s[0, 1]),
            capacity_bytes=_capacity(cluster),
        )

    def transfer_s(self, tensors: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        """Seconds to send ``tensors`` tensors of ``nbytes`` in all between two GPUs."""
        return tensors * self.latency_s + nbytes / self.bandwidth_bytes_per_s


def _schedule(
    ir: GraphIR, view: ProfiledView, graph: OpGraph, favourite: np.ndarray | None
) -> np.ndarray:
    units = atoms_of(ir)
    memory = op_memory(ir)
    n = len(view.capacity_bytes)
    return sct_schedule(
        np.broadcast_to(np.maximum(view.op_time_s, MIN_OP_TIME_S), (n, ir.num_ops)),
        graph,
        latency_s=np.full((n, n), view.latency_s),
        bandwidth_bytes_per_s=np.full((n, n), view.bandwidth_bytes_per_s),
        units=units,
        unit_bytes=np.bincount(units, weights=memory.persistent_bytes, minlength=units.max() + 1),
        output_bytes=memory.output_bytes,
        capacity=view.capacity_bytes,
        favourite=favourite,
    )


def m_etf(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> Strategy:
    """Baechi §2.3's m-ETF over ops, with units kept together."""
    device_of_op = _schedule(ir, ProfiledView.of(ir, cluster, costs), OpGraph.from_ir(ir), None)
    return placement_strategy(ir, cluster, device_of_op, "m-etf")


def m_sct(
    ir: GraphIR, cluster: Cluster, costs: OpCostModel, *, time_limit_s: float | None = None
) -> Strategy:
    """Baechi §2.4's m-SCT over ops, with units kept together.

    ``time_limit_s`` bounds the LP's solve (:class:`~tagplan.planner.errors.BudgetExhausted`
    past it). The favourite-child LP (:func:`favourite_children`) and the list scheduling
    (:func:`sct_schedule`) both use Baechi's view of the allocation (module docstring);
    an edge's delay charges each tensor its own latency, as Baechi does.
    """
    graph = OpGraph.from_ir(ir)
    units = atoms_of(ir)
    view = ProfiledView.of(ir, cluster, costs)
    favourite = favourite_children(
        ir.num_ops,
        graph.src,
        graph.dst,
        view.op_time_s,
        view.transfer_s(graph.tensor_counts(), graph.edge_bytes()),
        eligible=units[graph.src] != units[graph.dst],
        time_limit_s=time_limit_s,
    )
    device_of_op = _schedule(ir, view, graph, favourite)
    return placement_strategy(ir, cluster, device_of_op, "m-sct")
