"""What each of the search's candidate actions must use at the least: the charges of the
bound counting communication (:mod:`.comm_bound`, whose docstring states the rules and
why they hold).

Per op group and action: each device group's compute, port and machine-link seconds, the
duration class of its ops (the least time of one instance of each op), and per
synchronized gradient the least seconds from its producer to its update; for a
model-parallel action the work to spread over its device groups, for a parameter server
the uplink seconds one machine may be exempt from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import maximum_flow

from tagplan.planner.compile.links import LinkLayout
from tagplan.planner.compile.placement import (
    batch_slices,
    has_batch_input,
    parameter_ops,
    sums_partials,
)
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.batch import Aggregation, SplitCategory
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.search.actions import Action
from tagplan.planner.search.sfb import neighbourhood
from tagplan.planner.strategy import GroupDecision, Option, decision_replicas
from tagplan.planner.topology import Cluster

__all__ = ["ActionCharges", "ActionUse", "sfb_cut_bytes"]

_SFB_DEPTH = 3  # apply_sfb's default neighbourhood
_FLOW_UNIT_BYTES = 1024  # max-flow capacities are int32: whole KiB, rounded down
_INFINITE = 2**30


def _movable(ir: GraphIR) -> np.ndarray:
    """Ops whose placement their own group's decision fixes (module docstring): not the
    parameters' ops, nor ops colocated with a variable, nor the ``AddN`` of partials."""
    fixed = parameter_ops(ir)
    fixed[ir.parameters.apply_op] = True
    fixed |= np.isin(ir.colocation, ir.colocation[ir.variable_bytes > 0])
    return ~fixed & ~sums_partials(ir)


def sfb_cut_bytes(ir: GraphIR, gradient_op: int) -> float:
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
        cut.append(sfb_cut_bytes(ir, producer))
    return _Synced(
        np.array(producers, dtype=np.int64),
        np.array(groups, dtype=np.int64),
        np.array(gradient, dtype=np.float64),
        np.array(cut, dtype=np.float64),
        np.array(own, dtype=bool),
    )


@dataclass
class ActionUse:
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


class ActionCharges:
    """The charges of every action of one graph, cluster and op grouping."""

    def __init__(
        self, ir: GraphIR, cluster: Cluster, costs: OpCostModel, op_group: np.ndarray
    ) -> None:
        self.ir, self.cluster, self.costs = ir, cluster, costs
        self.op_group = op_group
        self.num_groups = int(op_group.max()) + 1 if len(op_group) else 0
        self.movable = _movable(ir)
        batch_input = has_batch_input(ir)
        self.split = self.movable & batch_input & (ir.split_category != SplitCategory.NONE)
        self.no_batch = self.movable & ~batch_input
        self.first_only = self.movable & batch_input & ~self.split
        self.synced = _synced(ir, op_group, self.split)
        g_count, m_count = cluster.num_groups, cluster.num_machines
        self.compute, self.out_port, self.in_port = 0, g_count, 2 * g_count
        self.uplink, self.downlink = 3 * g_count, 3 * g_count + m_count
        self.network = 3 * g_count + 2 * m_count
        links = LinkLayout(cluster)
        d_count = cluster.num_devices
        self.names = [
            f"{name} {resource}"
            for resource in ("compute", "out-ports", "in-ports")
            for name in cluster.group_names
        ]
        self.names += [*links.names[2 * d_count :], "network (uplinks on average)"]
        self.port_bw = links.bandwidth_bytes_per_s[:d_count]
        self.nic_bw = links.bandwidth_bytes_per_s[2 * d_count : 2 * d_count + m_count]
        self.device_group = cluster.group_of_device
        self.k = cluster.group_size.astype(np.float64)
        self._per_group: dict[tuple[str, int, int], np.ndarray] = {}

    def seconds(self, gpu_type: int, local: int) -> np.ndarray:
        """Every op's seconds on one GPU of ``gpu_type`` at ``local`` examples (the cost
        model remembers them)."""
        return self.costs.op_times(gpu_type, local).seconds

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

    def use(self, action: Action, decision: GroupDecision) -> ActionUse:
        cluster, batch, n = self.cluster, self.ir.batch_size, self.num_groups
        groups = list(action.device_groups)
        types = tuple(sorted({int(cluster.group_type[g]) for g in groups}))
        loads = np.zeros((n, len(self.names)))
        sync_s = np.zeros(len(self.synced.group))
        if action.option == Option.DUPLICATE:
            for g in groups:
                t = int(cluster.group_type[g])
                loads[:, self.compute + g] += self.group_seconds("movable", t, batch)
            return ActionUse(loads, ("full", types), sync_s)
        if action.option == Option.MODEL_PARALLEL:
            spread = np.min([self.group_seconds("movable", t, batch) for t in types], axis=0)
            return ActionUse(loads, ("full", types), sync_s, spread=spread)
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
        use = ActionUse(loads, key, sync_s)
        if len(holders) > 1 and len(self.synced.group):
            allreduce = action.option == Option.REPLICATE_ALLREDUCE
            self._communication(use, allreduce, holders, local / batch)
        return use

    def _communication(
        self, use: ActionUse, allreduce: bool, holders: np.ndarray, share: np.ndarray
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
