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
* Communication, for ``replicate-*`` over two or more GPUs: a parameter whose gradient is
  produced by a batch-split op of group ``i`` and summed over the replicas (a ``Sum``
  aggregation) and whose update is in group ``i`` too is synchronized. Its gradient has
  ``B`` bytes; ``C`` is the least bytes per full batch of any set of batch-carrying
  tensors that cuts the gradient off its inputs within SFB's neighbourhood (a max-flow,
  :func:`_sfb_cut_bytes`): what sufficient-factor broadcast would send instead. A GPU ``d``
  holding a share ``s_d`` of the batch holds a partial sum every other replica's update
  needs: unless the gradient is rebuilt from factors, at least one value per element
  leaves ``d`` (``B`` bytes), else its factor rows do (``s_d C``). So its out-port carries
  ``min(B, s_d C)``; with ``allreduce`` its own update needs everyone else's partials, so
  its in-port carries ``min(B, (1 - s_d) C)``. The same holds per machine for its uplink and
  downlink when ``S`` spans two or more machines, with the machine's share ``s_m``. With a
  parameter server the update lives on one GPU: the GPU holding it and its machine are
  exempt (the LP chooses which machine; a device group's out-ports are charged less the
  largest of its GPUs' charges), and in-ports and downlinks are not charged.

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
from scipy.sparse.csgraph import maximum_flow

from tagplan.planner.compile.links import LinkLayout
from tagplan.planner.compile.placement import batch_slices, sums_partials
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.batch import Aggregation, SplitCategory
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.search.actions import Action, ActionSpace
from tagplan.planner.search.lower_bound import lower_bound
from tagplan.planner.search.sfb import neighbourhood
from tagplan.planner.strategy import GroupDecision, Option, decision_replicas
from tagplan.planner.topology import Cluster

__all__ = ["CommBound", "comm_bound"]

_SFB_DEPTH = 3  # apply_sfb's default neighbourhood
_FLOW_UNIT_BYTES = 1024  # max-flow capacities are int32: whole KiB, rounded down
_INFINITE = 2**30


@dataclass(frozen=True)
class CommBound:
    """The bound and what binds it at the LP's optimum."""

    step_time_s: float  # max(LP, communication-free bound)
    lp_s: float
    free_s: float  # :func:`.lower_bound.lower_bound`'s step
    busiest: str  # the resource whose load is the LP's optimum
    solve_time_s: float


def _movable(ir: GraphIR) -> np.ndarray:
    """Ops whose placement their own group's decision fixes (module docstring)."""
    params, tables = ir.parameters, ir.sparse_parameters
    fixed = np.zeros(ir.num_ops, dtype=bool)
    for ops in (params.variable_op, params.slot_op, params.region_op, params.apply_op):
        fixed[ops] = True
    fixed[tables.variable_op] = True
    fixed[tables.slot_op] = True
    fixed |= np.isin(ir.colocation, ir.colocation[ir.variable_bytes > 0])
    return ~fixed & ~sums_partials(ir)


def _batch_input(ir: GraphIR) -> np.ndarray:
    reader = np.repeat(np.arange(ir.num_ops), np.diff(ir.op_input_ptr))
    found = np.zeros(ir.num_ops, dtype=bool)
    found[reader[ir.tensor_batch_axis[ir.op_input_tensor] >= 0]] = True
    return found


def _sfb_cut_bytes(ir: GraphIR, gradient_op: int) -> float:
    """The least full-batch bytes of batch-carrying tensors that separate ``gradient_op``
    from everything outside SFB's neighbourhood of it (tensors without a batch dimension
    cost nothing: replicas may hold them in full). Each tensor is one edge of capacity
    its bytes between an in- and an out-node, so a tensor read twice is cut once."""
    ops = neighbourhood(ir, gradient_op, _SFB_DEPTH)
    node = {op: i for i, op in enumerate(ops)}
    source = len(ops)
    tensors = sorted({int(t) for op in ops for t in ir.inputs(op).tolist()})
    tensor_in = {t: source + 1 + 2 * k for k, t in enumerate(tensors)}
    rows, cols, caps = [], [], []
    for t in tensors:
        producer = int(ir.tensor_producer[t])
        carries = ir.tensor_batch_axis[t] >= 0
        rows += [node.get(producer, source), tensor_in[t]]
        cols += [tensor_in[t], tensor_in[t] + 1]
        caps += [_INFINITE, int(ir.tensor_bytes[t]) // _FLOW_UNIT_BYTES if carries else 0]
    for op in ops:
        for t in ir.inputs(op).tolist():
            rows.append(tensor_in[t] + 1)
            cols.append(node[op])
            caps.append(_INFINITE)
    size = source + 1 + 2 * len(tensors)
    graph = sp.csr_matrix((np.array(caps, dtype=np.int64), (rows, cols)), shape=(size, size))
    graph.sum_duplicates()  # an op reading one tensor twice
    graph.data = np.minimum(graph.data, _INFINITE)
    flow = maximum_flow(graph.astype(np.int32), source, node[gradient_op]).flow_value
    return float(flow) * _FLOW_UNIT_BYTES


@dataclass(frozen=True)
class _Synced:
    """Gradients summed over the replicas of their producer's group: the producer's op
    group, B and C bytes, and whether the update is in the producer's group too."""

    producer: np.ndarray  # the op producing the gradient
    group: np.ndarray
    gradient_bytes: np.ndarray
    cut_bytes: np.ndarray
    own: np.ndarray  # bool

    def charge(self, share: float, groups: int, own: bool | None = None) -> np.ndarray:
        """Per op group: the bytes a holder of ``share`` of the batch must move for the
        gradients with the update in their producer's group (``own``), the others
        (``not own``), or all (``None``)."""
        weights = np.minimum(self.gradient_bytes, share * self.cut_bytes)
        if own is not None:
            weights = np.where(self.own == own, weights, 0.0)
        return np.bincount(self.group, weights=weights, minlength=groups)

    def spread_s(self, shares: np.ndarray, bandwidth: np.ndarray, groups: int) -> np.ndarray:
        """Per op group: seconds the holders of ``shares`` (one per link of ``bandwidth``)
        must send in all for the gradients updated in other groups, less each gradient's
        largest sender (its update may be there)."""
        foreign = ~self.own
        sent = (
            np.minimum(
                self.gradient_bytes[foreign, None], shares[None, :] * self.cut_bytes[foreign, None]
            )
            / bandwidth[None, :]
        )
        weights = sent.sum(axis=1) - sent.max(axis=1, initial=0.0)
        return np.bincount(self.group[foreign], weights=weights, minlength=groups)


def _synced(ir: GraphIR, op_group: np.ndarray, split: np.ndarray) -> _Synced:
    params = ir.parameters
    producers, groups, gradient, cut, own = [], [], [], [], []
    for row in range(len(params)):
        tensor = int(params.gradient_tensor[row])
        if tensor < 0 or ir.tensor_aggregation[tensor] != Aggregation.SUM:
            continue
        producer = int(ir.tensor_producer[tensor])
        if not split[producer]:
            continue
        producers.append(producer)
        groups.append(int(op_group[producer]))
        own.append(int(op_group[params.apply_op[row]]) == groups[-1])
        gradient.append(float(ir.tensor_bytes[tensor]))
        cut.append(_sfb_cut_bytes(ir, producer))
    return _Synced(
        np.array(producers, dtype=np.int64),
        np.array(groups, dtype=np.int64),
        np.array(gradient, dtype=np.float64),
        np.array(cut, dtype=np.float64),
        np.array(own, dtype=bool),
    )


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


@dataclass
class _ActionUse:
    """What one action implies for every op group: resource loads (seconds, per op group
    x resource), its duration class, per synchronized gradient the least seconds from
    the gradient to the update, and the optional spread / exemption terms."""

    loads: np.ndarray
    duration_class: tuple
    sync_s: np.ndarray
    spread: np.ndarray | None = None  # model-parallel work per op group, to spread over S
    ps_uplinks: tuple[np.ndarray, np.ndarray] | None = None  # machines, seconds per group


def _second_largest(values: np.ndarray) -> np.ndarray:
    """Per row, the second largest entry (0 for one column): what a sender set must take
    once the largest sender may be exempt."""
    if values.shape[1] < 2:
        return np.zeros(values.shape[0])
    return np.sort(values, axis=1)[:, -2]


class _Bound:
    """One computation of :func:`comm_bound`."""

    def __init__(
        self, ir: GraphIR, cluster: Cluster, costs: OpCostModel, op_group: np.ndarray
    ) -> None:
        self.ir, self.cluster, self.costs = ir, cluster, costs
        self.op_group = op_group
        self.num_groups = int(op_group.max()) + 1 if len(op_group) else 0
        self.movable = _movable(ir)
        batch_input = _batch_input(ir)
        self.split = self.movable & batch_input & (ir.split_category != SplitCategory.NONE)
        self.no_batch = self.movable & ~batch_input
        self.first_only = self.movable & batch_input & ~self.split
        self.synced = _synced(ir, op_group, self.split)
        g_count, m_count = cluster.num_groups, cluster.num_machines
        self.compute, self.out_port, self.in_port = 0, g_count, 2 * g_count
        self.uplink, self.downlink = 3 * g_count, 3 * g_count + m_count
        self.network = 3 * g_count + 2 * m_count
        self.names = (
            [f"{_group_name(cluster, g)} compute" for g in range(g_count)]
            + [f"{_group_name(cluster, g)} out-ports" for g in range(g_count)]
            + [f"{_group_name(cluster, g)} in-ports" for g in range(g_count)]
            + [f"{m}/uplink" for m in cluster.machine_names]
            + [f"{m}/downlink" for m in cluster.machine_names]
            + ["network (uplinks on average)"]
        )
        links = LinkLayout(cluster)
        d_count = cluster.num_devices
        self.port_bw = links.bandwidth_bytes_per_s[:d_count]
        self.nic_bw = links.bandwidth_bytes_per_s[2 * d_count : 2 * d_count + m_count]
        self.device_group = np.empty(d_count, dtype=np.int64)
        for g in range(g_count):
            self.device_group[cluster.group_devices(g)] = g
        self.k = cluster.group_size.astype(np.float64)
        self._seconds: dict[tuple[int, int], np.ndarray] = {}
        self._per_group: dict[tuple[str, int, int], np.ndarray] = {}

    def seconds(self, gpu_type: int, local: int) -> np.ndarray:
        key = (gpu_type, local)
        found = self._seconds.get(key)
        if found is None:
            found = self._seconds[key] = self.costs.op_times(gpu_type, local).seconds
        return found

    def group_seconds(self, kind: str, gpu_type: int, local: int) -> np.ndarray:
        key = (kind, gpu_type, local)
        found = self._per_group.get(key)
        if found is None:
            mask = {"split": self.split, "no_batch": self.no_batch, "movable": self.movable}[kind]
            found = self._per_group[key] = np.bincount(
                self.op_group,
                weights=np.where(mask, self.seconds(gpu_type, local), 0.0),
                minlength=self.num_groups,
            )
        return found

    def durations(self, key: tuple) -> np.ndarray:
        """Per op, the least time of one of its instances in duration class ``key``."""
        batch = self.ir.batch_size
        if key[0] == "full":  # duplicate, model-parallel: full batch on a type of S
            least = np.min([self.seconds(t, batch) for t in key[1]], axis=0)
            return np.where(self.movable, least, 0.0)
        _, holders, first_type = key
        split = np.min([self.seconds(t, local) for t, local in holders], axis=0)
        whole = np.min([self.seconds(t, batch) for t in {t for t, _ in holders}], axis=0)
        return np.select(
            [self.split, self.no_batch, self.first_only],
            [split, whole, self.seconds(first_type, batch)],
            0.0,
        )

    def use(self, action: Action, decision: GroupDecision) -> _ActionUse:
        cluster, batch, n = self.cluster, self.ir.batch_size, self.num_groups
        groups = list(action.device_groups)
        types = tuple(sorted({int(cluster.group_type[g]) for g in groups}))
        loads = np.zeros((n, len(self.names)))
        sync_s = np.zeros(len(self.synced.group))
        if action.option == Option.DUPLICATE:
            for g in groups:
                t = int(cluster.group_type[g])
                loads[:, self.compute + g] += self.group_seconds("movable", t, batch)
            return _ActionUse(loads, ("full", types), sync_s)
        if action.option == Option.MODEL_PARALLEL:
            spread = np.min([self.group_seconds("movable", t, batch) for t in types], axis=0)
            return _ActionUse(loads, ("full", types), sync_s, spread=spread)
        devices, weights = decision_replicas(decision, cluster)
        rows = np.diff(batch_slices(weights, batch))
        holders = np.unique(devices[rows > 0])
        local = np.bincount(devices, weights=rows, minlength=cluster.num_devices).astype(int)
        device_type = cluster.device_type
        for d in holders.tolist():
            g, t = int(self.device_group[d]), int(device_type[d])
            per_gpu = self.group_seconds("split", t, int(local[d]))
            per_gpu = per_gpu + self.group_seconds("no_batch", t, batch)
            loads[:, self.compute + g] += per_gpu / self.k[g]
        key = (
            "replicate",
            tuple(sorted({(int(device_type[d]), int(local[d])) for d in holders.tolist()})),
            int(device_type[holders[0]]),
        )
        use = _ActionUse(loads, key, sync_s)
        if len(holders) > 1 and len(self.synced.group):
            allreduce = action.option == Option.REPLICATE_ALLREDUCE
            self._communication(use, allreduce, holders, local / batch)
        return use

    def _communication(
        self, use: _ActionUse, allreduce: bool, holders: np.ndarray, share: np.ndarray
    ) -> None:
        synced, n, loads = self.synced, self.num_groups, use.loads
        for g in np.unique(self.device_group[holders]).tolist():
            members = holders[self.device_group[holders] == g].tolist()
            largest = max(float(share[d]) for d in members)
            out = sum(synced.charge(float(share[d]), n) for d in members)
            # one GPU may hold the update: a parameter server's, or another group's
            out -= synced.charge(largest, n, own=False if allreduce else None)
            loads[:, self.out_port + g] += out / self.k[g] / self.port_bw[members[0]]
            if allreduce:
                got = sum(synced.charge(1.0 - float(share[d]), n, own=True) for d in members)
                loads[:, self.in_port + g] += got / self.k[g] / self.port_bw[members[0]]
        bytes_b, bytes_c = synced.gradient_bytes[:, None], synced.cut_bytes[:, None]
        holder_share = share[holders][None, :]
        sent = np.minimum(bytes_b, holder_share * bytes_c) / self.port_bw[holders][None, :]
        got = np.minimum(bytes_b, (1.0 - holder_share) * bytes_c) / self.port_bw[holders][None, :]
        exempt_one = _second_largest(sent)
        use.sync_s[:] = np.where(synced.own & allreduce, got.max(axis=1), exempt_one)
        machines = np.unique(self.cluster.device_machine[holders])
        if len(machines) < 2:
            return
        m_count = self.cluster.num_machines
        machine_share = np.bincount(self.cluster.device_machine, weights=share, minlength=m_count)
        nic = self.nic_bw[machines]
        loads[:, self.network] += synced.spread_s(machine_share[machines], nic, n) / m_count
        mine = machine_share[machines][None, :]
        up_s = np.minimum(bytes_b, mine * bytes_c) / nic[None, :]
        down_s = np.minimum(bytes_b, (1.0 - mine) * bytes_c) / nic[None, :]
        network_s = np.where(synced.own & allreduce, down_s.max(axis=1), _second_largest(up_s))
        use.sync_s[:] = np.maximum(use.sync_s, network_s)
        up = np.zeros((n, m_count))
        for j, m in enumerate(machines.tolist()):
            up[:, m] = np.bincount(
                synced.group, weights=np.where(synced.own, up_s[:, j], 0.0), minlength=n
            )
            if allreduce:
                loads[:, self.downlink + m] += np.bincount(
                    synced.group, weights=np.where(synced.own, down_s[:, j], 0.0), minlength=n
                )
        if allreduce:
            loads[:, self.uplink : self.uplink + m_count] += up
        else:
            use.ps_uplinks = (machines, up)


def comm_bound(
    ir: GraphIR,
    cluster: Cluster,
    costs: OpCostModel,
    op_group: np.ndarray,
    space: ActionSpace,
    *,
    time_limit_s: float | None = None,
) -> CommBound | None:
    """The bound of the module docstring for the op groups ``op_group`` and the candidate
    actions of ``space``; ``None`` when the LP is not solved within ``time_limit_s``."""
    started = time.perf_counter()
    free = lower_bound(ir, cluster, costs).step_time_s
    bound = _Bound(ir, cluster, costs, op_group)
    n, r = bound.num_groups, len(bound.names)
    scale = 1.0 / free if free > 0 else 1.0  # seconds in units of the free bound
    program = _Program()
    resource_row = program.new_rows(False, r)  # load - T <= 0, one row per resource
    program.rows(False, resource_row + np.arange(r), np.zeros(r), np.full(r, -1.0))
    x_of_group: list[list[int]] = [[] for _ in range(n)]
    classes: dict[tuple, int] = {}  # duration class -> index
    class_actions: list[list[tuple[int, int]]] = []  # per class: (group, x column)
    sync_cols: list[list[tuple[int, float]]] = [[] for _ in range(len(bound.synced.group))]
    for action in space.actions:
        use = bound.use(action, space.decision(action))
        c = classes.setdefault(use.duration_class, len(classes))
        if c == len(class_actions):
            class_actions.append([])
        first_x = program.new(n)
        for i in range(n):
            x = first_x + i
            x_of_group[i].append(x)
            class_actions[c].append((i, x))
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
    _critical_path(program, bound, classes, class_actions, sync_cols, scale)
    if time_limit_s is not None:
        time_limit_s -= time.perf_counter() - started
        if time_limit_s <= 0:
            return None
    solved = _solve(program, bound.names, resource_row, time_limit_s)
    if solved is None:
        return None
    lp_s, busiest = solved[0] / scale, solved[1]
    return CommBound(
        step_time_s=max(lp_s, free),
        lp_s=lp_s,
        free_s=free,
        busiest=busiest,
        solve_time_s=time.perf_counter() - started,
    )


def _spread(
    program: _Program, bound: _Bound, action: Action, x: int, work: float, resource_row: int
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
    bound: _Bound,
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
    bound: _Bound,
    classes: dict[tuple, int],
    class_actions: list[list[tuple[int, int]]],
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
    for key, c in classes.items():
        weights = bound.durations(key) * scale
        members: dict[int, list[int]] = {}
        for i, x in class_actions[c]:
            members.setdefault(i, []).append(x)
        for i, xs in members.items():
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


def _group_name(cluster: Cluster, group: int) -> str:
    machine = cluster.machine_names[int(cluster.group_machine[group])]
    return f"{machine}/{cluster.group_type_name(group)}"


def _solve(
    program: _Program, names: list[str], resource_row: int, time_limit_s: float | None
) -> tuple[float, str] | None:
    """Minimize ``T`` (HiGHS); returns it and what binds it: the busiest resource, or the
    critical path when every resource is less busy than ``T``; ``None`` at the time
    limit."""
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
        method="highs",
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
