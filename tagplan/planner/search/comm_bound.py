"""A step-time bound that counts communication: no strategy the search can build beats it.

The bound of :mod:`.lower_bound` treats communication as free, so on clusters with slow
links every plan reads many times "above the limit" and the ratio says nothing. This
bound prices what each of the search's candidate actions (:mod:`.actions`) must use, and
lets a linear program choose the actions of every op group *fractionally* so as to
minimize the busiest resource.

**Resources.** Per device group ``g``: its GPUs' compute, out-ports and in-ports, each as
the *average* over the group's ``k_g`` GPUs of their busy time (the busiest GPU is busy
at least that long); per machine: its network uplink and downlink (the links of
:mod:`~tagplan.planner.compile.links`). The simulator runs a GPU's tasks one at a time and
carries at most a link's bandwidth through it (its busy time is the bytes it carried over
its bandwidth, :mod:`~tagplan.planner.sim.engine`), so a step lasts at least as long as
any resource is busy.

**What an action uses at the least**, for op group ``i`` taking action ``a`` on device
groups ``S``, counting only ops whose placement the group's own decision fixes (not
parameters, their slots and updates, nor ops colocated with a variable, nor the ``AddN``
of partials whose layout depends on its producers' groups):

* ``replicate-*``: every GPU ``d`` with ``r_d > 0`` rows of the batch runs the group's
  batch-split ops at ``r_d`` examples and its ops without batch input at the full batch,
  at the cost model's times (the simulator's durations, :mod:`~tagplan.planner.compile.placement`'s
  rules). SFB may replace a split op by its full-batch copy on every replica, which only
  takes longer.
* ``duplicate``: every GPU of ``S`` runs every op at the full batch.
* ``model-parallel``: each op once, on some GPU of ``S``, taking at least its time on the
  fastest type of ``S``: the LP spreads that work over ``S``'s device groups as it likes.
* Communication, for ``replicate-*`` over two or more GPUs: a gradient produced by a
  batch-split op of group ``i`` and summed over the replicas (a ``Sum`` aggregation) is
  synchronized. It has ``B`` bytes; ``C`` is the least bytes per full batch of any set of
  batch-carrying tensors that cuts it off its inputs within SFB's neighbourhood (a
  max-flow, :func:`.action_use.sfb_cut_bytes`): what sufficient-factor broadcast would
  send instead. A GPU ``d`` holding a share ``s_d`` of the batch holds a partial sum the
  update needs: unless the gradient is rebuilt from factors, at least one value per
  element leaves ``d`` (``B`` bytes), else its factor rows do (``s_d C``); so its out-port
  carries ``min(B, s_d C)``, and likewise a machine's uplink with the machine's share
  ``s_m`` when ``S`` spans two or more machines. When the update is in group ``i`` too and
  mirrored (``allreduce``), every replica needs everyone else's partials: its in-port (and
  its machine's downlink) carries ``min(B, (1 - s_d) C)``. When the update sits on one GPU
  (a parameter server, or another group's placement) that GPU and its machine may send
  nothing: a device group's out-ports are charged less their largest charge, a parameter
  server's machine is chosen by the LP, and an update elsewhere charges the machines'
  uplinks on average less each gradient's largest sender. Each synchronized gradient also
  delays the step: ``T`` is at least its producer's finish plus the least time its bytes
  take through the slowest receiving port or link (less the exempt sender).

**Why it is a bound.** A strategy whose every op group takes one candidate action (with
or without SFB) is an integral point of the LP below, and each resource's load at that
point is no more than its busy time in the simulated step, so its step is at least the
LP's value at that point, which is at least the LP's optimum:

.. math::

    \\min T \\quad\\text{s.t.}\\quad \\sum_a x_{ia} = 1,\\quad
    \\sum_{i,a} x_{ia} L_{iar} + (\\text{spread and exemption terms}) \\le T \\ \\ \\forall r,
    \\quad x \\ge 0.

The reported bound is the larger of the LP's optimum and :func:`.lower_bound.lower_bound`
(valid for every strategy). It covers the search's candidate actions with their own batch
shares; a strategy outside that space (a baseline with other shares, a hand-written
placement) is covered by the communication-free bound alone. Latencies are left out;
comm times are taken at the links' stated bandwidths (a measured communication profile
faster than those would lower the simulator's busy time below them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.search.action_use import ActionCharges
from tagplan.planner.search.actions import Action, ActionSpace
from tagplan.planner.topology import Cluster

__all__ = ["CommBound", "comm_bound"]


@dataclass(frozen=True)
class CommBound:
    """The bound and what binds it at the LP's optimum."""

    step_time_s: float  # max(LP, communication-free bound)
    lp_s: float
    free_s: float  # :func:`.lower_bound.lower_bound`'s step
    busiest: str  # the resource whose load is the LP's optimum


class _Program:
    """The LP as sparse rows: ``A_ub z <= b_ub`` and ``A_eq z = b_eq`` over columns that
    are handed out as they are needed (column 0 is ``T``)."""

    def __init__(self) -> None:
        self.columns = 1
        self.ub: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]] = ([], [], [])
        self.eq: tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]] = ([], [], [])
        self.num_ub = self.num_eq = 0
        self.b_eq: list[float] = []

    def new(self, count: int = 1) -> int:
        """``count`` new columns; returns the first."""
        self.columns += count
        return self.columns - count

    def rows(self, eq: bool, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> None:
        """Entries of rows already counted (row indices are absolute)."""
        target = self.eq if eq else self.ub
        target[0].append(np.asarray(rows, dtype=np.int64))
        target[1].append(np.asarray(cols, dtype=np.int64))
        target[2].append(np.asarray(vals, dtype=np.float64))

    def new_rows(self, eq: bool, count: int, rhs: float = 0.0) -> int:
        if eq:
            self.num_eq += count
            self.b_eq += [rhs] * count
            return self.num_eq - count
        self.num_ub += count
        return self.num_ub - count

    def fractions_of(self, parts: np.ndarray, whole: int) -> None:
        """``sum(parts) = whole``: columns that split another column."""
        row = self.new_rows(True, 1)
        cols = np.append(parts, whole)
        self.rows(True, np.full(len(cols), row), cols, np.append(np.ones(len(parts)), -1.0))

    def pairs(self, first: np.ndarray, second: np.ndarray, vals: list[float]) -> None:
        """One new ``<=`` row per entry: ``vals[0] z[first] + vals[1] z[second] <= 0``."""
        rows = np.arange(len(first)) + self.new_rows(False, len(first))
        cols = np.stack([first, second], 1).ravel()
        self.rows(False, np.repeat(rows, 2), cols, np.tile(vals, len(first)))

    def matrix(self, eq: bool) -> sp.csr_matrix:
        rows, cols, vals = self.eq if eq else self.ub
        shape = (self.num_eq if eq else self.num_ub, self.columns)
        if not rows:
            return sp.csr_matrix(shape)
        return sp.csr_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=shape
        )


def comm_bound(
    ir: GraphIR,
    cluster: Cluster,
    costs: OpCostModel,
    op_group: np.ndarray,
    space: ActionSpace,
    *,
    free_s: float,
    time_limit_s: float | None = None,
) -> CommBound | None:
    """The bound of the module docstring for the op groups ``op_group`` and the candidate
    actions of ``space``, given ``free_s``, the communication-free bound
    (:func:`.lower_bound.lower_bound`); ``None`` when the LP is not solved within
    ``time_limit_s``."""
    started = time.perf_counter()
    bound = ActionCharges(ir, cluster, costs, op_group)
    n, r = bound.num_groups, len(bound.names)
    scale = 1.0 / free_s if free_s > 0 else 1.0  # seconds in units of the free bound
    program = _Program()
    resource_row = program.new_rows(False, r)  # load - T <= 0, one row per resource
    program.rows(False, resource_row + np.arange(r), np.zeros(r), np.full(r, -1.0))
    x_of_group: list[list[int]] = [[] for _ in range(n)]
    # duration class -> op group -> the columns of its actions in that class
    classes: dict[tuple, dict[int, list[int]]] = {}
    sync_cols: list[list[tuple[int, float]]] = [[] for _ in range(len(bound.synced.group))]
    for action in space.actions:
        use = bound.use(action, space.decision(action))
        in_class = classes.setdefault(use.duration_class, {})
        first_x = program.new(n)
        for i in range(n):
            x = first_x + i
            x_of_group[i].append(x)
            in_class.setdefault(i, []).append(x)
            hit = np.flatnonzero(use.loads[i] > 0)
            program.rows(False, resource_row + hit, np.full(len(hit), x), use.loads[i, hit] * scale)
            if use.spread is not None and use.spread[i] > 0:
                _spread(program, bound, action, x, use.spread[i] * scale, resource_row)
            if use.ps_uplinks is not None and use.ps_uplinks[1][i].any():
                _exempt_one(program, bound, x, use.ps_uplinks, i, scale, resource_row)
        for p in np.flatnonzero(use.sync_s > 0).tolist():
            sync_cols[p].append((first_x + int(bound.synced.group[p]), use.sync_s[p] * scale))
    for xs in x_of_group:
        row = program.new_rows(True, 1, 1.0)
        program.rows(True, np.full(len(xs), row), xs, np.ones(len(xs)))
    _critical_path(program, bound, classes, sync_cols, scale)
    if time_limit_s is not None:
        time_limit_s -= time.perf_counter() - started
        if time_limit_s <= 0:
            return None
    solved = _solve(program, bound.names, resource_row, time_limit_s)
    if solved is None:
        return None
    lp_s, busiest = solved[0] / scale, solved[1]
    return CommBound(step_time_s=max(lp_s, free_s), lp_s=lp_s, free_s=free_s, busiest=busiest)


def _spread(
    program: _Program, bound: ActionCharges, action: Action, x: int, work: float, resource_row: int
) -> None:
    """Model-parallel work of ``x`` spread over the action's device groups: u_g >= 0 with
    sum_g u_g = x, device group g carrying u_g * work / k_g."""
    groups = np.array(action.device_groups)
    first_u = program.new(len(groups))
    cols = first_u + np.arange(len(groups))
    program.rows(False, resource_row + bound.compute + groups, cols, work / bound.k[groups])
    program.fractions_of(cols, x)


def _exempt_one(
    program: _Program,
    bound: ActionCharges,
    x: int,
    ps_uplinks: tuple[np.ndarray, np.ndarray],
    group: int,
    scale: float,
    resource_row: int,
) -> None:
    """Parameter-server uplinks: ``x`` pays every machine's uplink and p_m (sum x, each
    >= 0) takes back the machine holding the parameters."""
    machines, up = ps_uplinks
    seconds = up[group, machines] * scale
    program.rows(False, resource_row + bound.uplink + machines, np.full(len(machines), x), seconds)
    first_p = program.new(len(machines))
    cols = first_p + np.arange(len(machines))
    program.rows(False, resource_row + bound.uplink + machines, cols, -seconds)
    program.fractions_of(cols, x)


def _critical_path(
    program: _Program,
    bound: ActionCharges,
    classes: dict[tuple, dict[int, list[int]]],
    sync_cols: list[list[tuple[int, float]]],
    scale: float,
) -> None:
    """Finish times ``f_o`` along every data and control edge, each op lasting at least
    ``dur_o = sum_c y_{i,c} w_o(c)`` (``y_{i,c}``: the share of group ``i``'s actions in
    duration class ``c``), ``T >= f_o``, and ``T >= f_g + sync`` after a synchronized
    gradient's producer ``g``."""
    ir, n = bound.ir, bound.num_groups
    num_ops = ir.num_ops
    f0 = program.new(num_ops)
    dur0 = program.new(num_ops)
    ops_of_group = [np.flatnonzero(bound.op_group == i) for i in range(n)]
    # dur_o - sum_c y_{i,c} w_o(c) = 0
    dur_row = program.new_rows(True, num_ops)
    program.rows(True, dur_row + np.arange(num_ops), dur0 + np.arange(num_ops), np.ones(num_ops))
    for key, in_class in classes.items():
        weights = bound.durations(key) * scale
        for i, xs in in_class.items():
            y = program.new()
            program.fractions_of(np.array(xs), y)
            ops = ops_of_group[i]
            ops = ops[weights[ops] > 0]
            program.rows(True, dur_row + ops, np.full(len(ops), y), -weights[ops])
    # f_p - f_o + dur_o <= 0 over data and control edges; dur_o - f_o <= 0; f_o - T <= 0
    consumer = ir.tensor_consumer_op.astype(np.int64)
    producer = np.repeat(ir.tensor_producer, np.diff(ir.tensor_consumer_ptr)).astype(np.int64)
    succ = np.concatenate([consumer, np.repeat(np.arange(num_ops), np.diff(ir.control_ptr))])
    pred = np.concatenate([producer, ir.control_pred.astype(np.int64)])
    edge_rows = np.arange(len(succ)) + program.new_rows(False, len(succ))
    cols = np.stack([f0 + pred, f0 + succ, dur0 + succ], 1).ravel()
    program.rows(False, np.repeat(edge_rows, 3), cols, np.tile([1.0, -1.0, 1.0], len(succ)))
    ops = np.arange(num_ops)
    program.pairs(dur0 + ops, f0 + ops, [1.0, -1.0])
    program.pairs(f0 + ops, np.zeros(num_ops, dtype=np.int64), [1.0, -1.0])
    # f_g + sum_a x_a sync_a - T <= 0
    gradient_ops = bound.synced.producer
    for p, terms in enumerate(sync_cols):
        if not terms:
            continue
        row = program.new_rows(False, 1)
        cols = [f0 + int(gradient_ops[p]), 0] + [x for x, _ in terms]
        vals = [1.0, -1.0] + [s for _, s in terms]
        program.rows(False, np.full(len(cols), row), cols, vals)


def _solve(
    program: _Program, names: list[str], resource_row: int, time_limit_s: float | None
) -> tuple[float, str] | None:
    """Minimize ``T`` (HiGHS's interior point method: timed once against its simplex on
    four zoo programs of 16-37k rows, 1.05-2.7x faster to the same optimum); returns it and what
    binds it: the busiest resource, or the critical path when every resource is less busy
    than ``T``; ``None`` at the time limit."""
    a_ub = program.matrix(False)
    objective = np.zeros(program.columns)
    objective[0] = 1.0
    solved = linprog(
        objective,
        A_ub=a_ub,
        b_ub=np.zeros(program.num_ub),
        A_eq=program.matrix(True),
        b_eq=np.array(program.b_eq),
        bounds=(0, None),
        method="highs-ipm",
        options={} if time_limit_s is None else {"time_limit": time_limit_s},
    )
    if solved.status == 1:  # the time limit
        return None
    if not solved.success:
        raise RuntimeError(f"the communication bound's LP failed: {solved.message}")
    t = float(solved.x[0])
    busy = a_ub[resource_row : resource_row + len(names)] @ solved.x + t
    top = int(np.argmax(busy))
    return t, names[top] if busy[top] >= t * (1 - 1e-6) else "critical path"
