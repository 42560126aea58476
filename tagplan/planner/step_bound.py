"""A lower bound on one strategy's simulated step, from its placement and gradient sync
alone: what the search checks before it compiles and simulates a strategy
(docs/design.md §7).

The placement (:func:`~tagplan.planner.compile.placement.place`) says which GPU runs
which rows of every op. Whatever the compiler then adds (transfers, hubs, collectives,
auxiliary ops), the simulator (:mod:`~tagplan.planner.sim.engine`) runs a GPU's tasks one
at a time, carries a link's bytes at no more than its bandwidth, and starts a task once
its inputs are where it runs. So a step lasts at least as long as each of:

* **compute**: the op instances' seconds on the busiest GPU (the task graph gives every
  instance a compute task of the cost model's time at its rows);
* **ports and machine links**: a link's busy time, the bytes it carries over its
  bandwidth (or the faster path's rate), summed over what crosses it (module
  :mod:`~tagplan.planner.compile.links`: a transfer between GPUs crosses the sender's
  out-port and the receiver's in-port, and between machines the sender's uplink and the
  receiver's downlink). *Arriving*, for each tensor and each GPU that reads it: the rows
  its readers there need that no instance of the producer on that GPU holds (a tensor
  without the batch dimension: all of it, unless an instance of its producer runs
  there); for a machine, the rows no instance on that machine holds. A partial sum (a
  gradient over a share of the batch) read by an op not split the same way, where the
  reader does not run beside every partial (a parameter server's update, a reader in
  another op group), gets every other GPU's partial to add up
  (:meth:`~tagplan.planner.compile.transport.TransportRules._reduce`), each of them.
  *Leaving* (:mod:`~tagplan.planner.departures`), for each tensor and each GPU: the rows
  that only its instance there holds (a batch-split op's instances hold disjoint rows)
  and that a reader on another GPU needs, and all a reader elsewhere needs of a tensor
  only that GPU holds; a partial, once, when a reader of its sum runs elsewhere; for a
  machine the same across machines. A tensor is counted once per GPU and machine, at the
  reader that takes most of it (a hub may bring it once and share it). Where the reader
  of partial sums runs beside every partial (mirrored updates), the compiler sums them
  with one **AllReduce** among the partials' GPUs, which the simulator runs as one flow
  over the ring's links, taking on each link its share ``min(1, R / c)`` (``R`` the
  ring's rate, ``c`` the link's bandwidth) of its bandwidth part, ``min(p,
  2(k-1)S/(kR))`` for a collective of ``p`` seconds. The cost model prices an AllReduce
  of ``S`` bytes by ring, hierarchical or tree, each a latency plus a term that grows at
  least linearly with ``S``; so ``p`` is at least ``S`` times the smallest of their
  slopes (at a size where latency is lost), however gradients are bucketed, and each
  link of the ring is busy at least its share of ``S`` times the smaller of that slope
  and ``2(k-1)/(kR)``. Where sufficient factors are broadcast instead, the sum counts
  once at each port;
* **the longest chain**: an op instance starts after the producers of its inputs have
  finished and their bytes have crossed to it. An instance of a batch-split producer
  holds only its own rows, so a reader waits for every instance whose rows it reads, and
  a reader of a partial sum for every partial; of any other producer one instance may
  serve it, the earliest. A transfer to a GPU from another takes at least its bytes over
  the fastest path into that GPU and, from another machine, over the fastest network
  path out of the sender's machine and into the reader's (the sum depends on every
  element of the last partial, so a tensor's worth still leaves its GPU after it is
  made). The rows a reader gathers from several other GPUs all cross its GPU's in-port,
  and those from other machines its machine's downlink, each no earlier than it is made
  (one link with release dates, below);
* **the collectives after they start**: an AllReduce starts once its partials are made
  (the chain's finish of their instances), and a gradient's waits as its op group's
  gradient sync says: for the last gradient of its bucket (the compiler's buckets,
  rebuilt from the same rule and order), or for every gradient after the backward pass.
  Before that, each GPU holding a partial has run, one task at a time, every instance
  that must precede the partials the AllReduce waits for (those whose rows or partial
  sums lead to them), none before its chain's start: the AllReduce starts no earlier
  than any time plus that GPU's seconds for those of them that cannot start before it.
  A ring's busiest link then carries, from any AllReduce's start on, at least its share
  of every AllReduce over the same GPUs that starts no earlier (one machine with release
  dates: the largest start plus the link seconds of what starts at or after it). Under data
  parallelism whose gradients share one bucket this is the backward pass followed by
  the whole AllReduce, close to how the simulator runs it.

Control dependencies and latencies are left out (they only add). Where the
communication model uses a measured profile (which may be faster than the links'
bandwidths), only compute and the chains without transfer times are counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from tagplan.planner.compile.buckets import GradientAllReduce, gradient_buckets
from tagplan.planner.compile.links import LinkLayout, ring_bytes_per_link
from tagplan.planner.compile.placement import Placement
from tagplan.planner.cost.comm import CommModel, allreduce_time_s
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.departures import departures
from tagplan.planner.graph.batch import Aggregation
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.strategy import GradientSync, Mode, ResolvedStrategy
from tagplan.planner.topology import Cluster

__all__ = ["StepBound", "StepBoundParts"]

_LARGE_BYTES = 1e12  # where every AllReduce's latency is lost in its bandwidth term
_MAX_UNITS = 63  # gradients' start groups told apart by _serial_before (bits of an int64)
_START_SLICES = 16  # _serial_before's steps of the instances' earliest starts
_MAX_SETS = 256  # sets of units _serial_before sums apart (more: instance by instance)


class _Walk(NamedTuple):
    """What one walk over the instances finds (:func:`_chains_and_arrivals`)."""

    chain_s: float
    arriving: np.ndarray  # bytes that must reach each GPU
    entering: np.ndarray  # and each machine
    reduced: np.ndarray  # per tensor: summed by an AllReduce
    release_s: np.ndarray  # per tensor: when its AllReduce's partials are made
    summed_by: np.ndarray  # per tensor: a reader its AllReduce is for
    finish_s: np.ndarray  # per instance: the chain's finish


@dataclass(frozen=True)
class StepBoundParts:
    """The bound and its parts, in seconds."""

    compute_s: float
    ports_s: float
    network_s: float
    chain_s: float
    collectives_s: float = 0.0

    @property
    def step_time_s(self) -> float:
        return max(self.compute_s, self.ports_s, self.network_s, self.chain_s, self.collectives_s)


class StepBound:
    """The bound of the module docstring for one graph and cluster (what does not depend
    on the strategy is prepared once)."""

    def __init__(self, ir: GraphIR, cluster: Cluster, costs: OpCostModel, comm: CommModel):
        self.ir, self.cluster, self.costs = ir, cluster, costs
        lengths = np.array([len(inputs) for inputs in ir.input_lists], dtype=np.int64)
        self._input_ptr = np.zeros(ir.num_ops + 1, dtype=np.int64)
        self._input_ptr[1:] = np.cumsum(lengths)
        self._input_tensor = np.array(
            [t for inputs in ir.input_lists for t in inputs], dtype=np.int64
        )
        self._producer = ir.tensor_producer.astype(np.int64)
        self._batch = ir.tensor_batch_axis >= 0
        self._summed = ~self._batch & (ir.tensor_aggregation == Aggregation.SUM)
        self._bytes = ir.tensor_bytes.astype(np.float64)
        self._row_bytes = np.where(self._batch, self._bytes / max(ir.batch_size, 1), 0.0)
        self._consumer_ptr = ir.tensor_consumer_ptr.astype(np.int64)
        self._consumer_op = ir.tensor_consumer_op.astype(np.int64)
        self._gradient = np.zeros(ir.num_tensors, dtype=bool)
        gradient_tensor = ir.parameters.gradient_tensor
        self._gradient[gradient_tensor[gradient_tensor >= 0]] = True
        self._tensors = (  # what the kernels read of every tensor, in their order
            self._producer,
            self._batch,
            self._summed,
            self._bytes,
            self._row_bytes,
            self._consumer_ptr,
            self._consumer_op,
        )
        self._links = comm.profile is None
        # a link's busy time is its bytes over the larger of its bandwidth and the path's
        # rate (compile/links.py); with one GPU or one machine nothing crosses them
        paths = cluster.bandwidth_bytes_per_s.astype(np.float64).copy()
        np.fill_diagonal(paths, 0.0)
        single = np.full(1, np.inf)
        self._fastest_in = paths.max(axis=0) if cluster.num_devices > 1 else single
        fastest_out = paths.max(axis=1) if cluster.num_devices > 1 else single
        port = cluster.machine_intra_bandwidth_bytes_per_s[cluster.device_machine]
        self._port = np.maximum(port, self._fastest_in)
        self._out_port = np.maximum(port, fastest_out)
        machine = cluster.device_machine
        network = cluster.machine_bandwidth_bytes_per_s.astype(np.float64).copy()
        np.fill_diagonal(network, 0.0)
        several = cluster.num_machines > 1
        network_out = network.max(axis=1) if several else single
        network_in = network.max(axis=0) if several else single
        self._downlink = np.maximum(network_out, network_in)
        self._machine = machine.astype(np.int64)
        self._layout = LinkLayout(cluster)
        self._slopes: dict[tuple[int, ...], float] = {}  # AllReduce seconds per byte
        self._seconds: tuple[Placement, np.ndarray] | None = None  # instance_seconds'
        # the fastest any bytes go from one GPU to another: into the target and, between
        # machines, out of the source's machine and into the target's
        between = np.minimum.outer(network_out[machine], network_in[machine])
        self._rate = np.where(
            machine[:, None] == machine[None, :],
            self._fastest_in[None, :],
            np.minimum(between, self._fastest_in[None, :]),
        )

    def departures(self, placement: Placement) -> tuple[np.ndarray, np.ndarray]:
        """The bytes that must leave every GPU and every machine (module docstring), no
        tensor's sum counted apart as an AllReduce's."""
        nothing_reduced = np.zeros(len(self._producer), dtype=np.bool_)
        return self._departures(_instances(placement), nothing_reduced)

    def _departures(
        self, instances: tuple[np.ndarray, ...], reduced: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`departures` of the kernels' ``instances``, but those of the ``reduced``
        tensors, which an AllReduce sums (its links counted apart)."""
        return departures(
            *instances,
            reduced,
            *self._tensors,
            self._machine,
            self.cluster.num_devices,
            self.cluster.num_machines,
        )

    def _by_members(
        self, placement: Placement, reduced: np.ndarray
    ) -> dict[tuple[int, ...], list[int]]:
        """The ``reduced`` tensors by the GPUs that hold their partials, ascending (the
        AllReduce's members)."""
        by_devices: dict[bytes, list[int]] = {}  # the partials' GPUs as placed, in order
        for t in np.flatnonzero(reduced).tolist():
            p = self._producer[t]
            devices = placement.inst_device[placement.inst_ptr[p] : placement.inst_ptr[p + 1]]
            by_devices.setdefault(devices.tobytes(), []).append(t)
        by_members: dict[tuple[int, ...], list[int]] = {}
        dtype = placement.inst_device.dtype
        for key, tensors in by_devices.items():
            members = tuple(sorted({int(x) for x in np.frombuffer(key, dtype=dtype)}))
            by_members.setdefault(members, []).extend(tensors)
        return by_members

    def _collective_busy(
        self, by_members: dict[tuple[int, ...], list[int]], start_s: np.ndarray
    ) -> tuple[np.ndarray, float]:
        """Every link's busy seconds at the least from the AllReduces of the tensors
        ``by_members`` (module docstring), and the latest any ring's links can be done
        with them when each starts no earlier than ``start_s`` (:func:`_after_release_s`)."""
        busy = np.zeros(self._layout.num_links)
        tail_s = 0.0
        for members, tensors in by_members.items():
            route = self._layout.ring(members)
            per_byte_s = min(
                self._per_byte_s(members),
                ring_bytes_per_link(len(members), 1) / route.rate_bytes_per_s,
            )
            shares = np.asarray(route.shares)
            nbytes = self._bytes[tensors]
            busy[route.links] += shares * per_byte_s * float(nbytes.sum())
            busiest_per_byte_s = float(shares.max(initial=0.0)) * per_byte_s
            tail_s = max(tail_s, _after_release_s(start_s[tensors], nbytes * busiest_per_byte_s))
        return busy, tail_s

    def _synchronized(
        self,
        by_members: dict[tuple[int, ...], list[int]],
        resolved: ResolvedStrategy,
        walk: _Walk,
        instances: tuple[np.ndarray, ...],
        seconds: np.ndarray,
    ) -> np.ndarray:
        """The earliest each AllReduce starts under its op group's gradient sync
        (:class:`~tagplan.planner.strategy.GradientSync`): a gradient's in an
        ``after-backward`` group once every gradient's partials are made, one in a
        ``bucketed`` group once its bucket's last gradient is (the buckets of
        :func:`~tagplan.planner.compile.buckets.gradient_buckets` over the gradients'
        AllReduces in the order the compiler lists them, by the op reading each sum),
        one in an ``overlap`` group once its own are; and not before each GPU has run
        the instances that must precede those partials, one at a time
        (:func:`_serial_before`). Once its own partials are made (``walk.release_s``)
        where that order is not certain: unless every gradient summed has one reader and
        no op reads two of them."""
        release_s, summed_by = walk.release_s, walk.summed_by
        gradients = [t for tensors in by_members.values() for t in tensors if self._gradient[t]]
        if not gradients:
            return release_s
        single = np.diff(self._consumer_ptr)[gradients] == 1
        readers = summed_by[gradients]
        if not single.all() or len(np.unique(readers)) < len(readers):
            return release_s
        members_of = {t: members for members, tensors in by_members.items() for t in tensors}
        order = np.array([gradients[i] for i in np.argsort(readers, kind="stable")])
        decisions = resolved.group_decisions
        groups = resolved.op_group[summed_by[order]].tolist()
        syncs = [decisions[g].gradient_sync for g in groups]
        after = np.array([sync == GradientSync.AFTER_BACKWARD for sync in syncs])
        # each gradient's unit: its bucket, itself (overlap), or the after-backward ones'
        unit = np.full(len(self._producer), -1, dtype=np.int64)
        start_s = release_s.copy()
        start_s[order[after]] = release_s[order].max()
        allreduces = [
            GradientAllReduce(g, members_of[t], int(self._bytes[t]))
            for g, t in zip(groups, order.tolist(), strict=True)
        ]
        units = 0
        for bucket in gradient_buckets(allreduces, decisions):
            tensors = order[list(bucket.collectives)]
            start_s[tensors] = release_s[tensors].max()
            unit[tensors], units = units, units + 1
        alone = order[[sync == GradientSync.OVERLAP for sync in syncs]]
        unit[alone] = np.arange(units, units + len(alone))
        units += len(alone)
        unit[order[after]], units = units, units + int(after.any())
        if units > _MAX_UNITS:
            return start_s
        serial_s, serial_any_s = _serial_before(
            *instances,
            seconds,
            self._input_ptr,
            self._input_tensor,
            self._producer,
            self._batch,
            self._summed,
            unit,
            units,
            self.cluster.num_devices,
            walk.finish_s,
            walk.chain_s,
            _MAX_SETS,
        )
        start_s[order] = np.maximum(
            start_s[order], np.where(after, serial_any_s, serial_s[unit[order]])
        )
        return start_s

    def _per_byte_s(self, members: tuple[int, ...]) -> float:
        """Seconds per byte an AllReduce among ``members`` takes at the least, whichever
        algorithm prices it: each closed form is its latency plus a bandwidth term that
        grows at least linearly with the bytes (:mod:`~tagplan.planner.cost.comm`), so its
        slope at a very large size bounds it from below, and buckets of several gradients
        take no less than their bytes at the smallest slope."""
        found = self._slopes.get(members)
        if found is None:
            sizes = np.array([_LARGE_BYTES, 2 * _LARGE_BYTES])
            slopes = [
                float(np.diff(allreduce_time_s(self.cluster, members, sizes, name))[0])
                / _LARGE_BYTES
                for name in ("ring", "hierarchical", "tree")
            ]
            found = self._slopes[members] = min(slopes)
        return found

    def instance_seconds(self, placement: Placement) -> np.ndarray:
        """Every op instance's compute seconds: the cost model's time of its op on its
        GPU's type at its rows (kept for the next call with the same placement: the
        search may bound a strategy's compute and then the rest)."""
        kept = self._seconds
        if kept is not None and kept[0] is placement:
            return kept[1]
        op_of = np.repeat(np.arange(self.ir.num_ops), np.diff(placement.inst_ptr))
        local = np.maximum(placement.inst_hi - placement.inst_lo, 1)
        device_type = self.cluster.device_type[placement.inst_device]
        seconds = self.costs.instance_times(op_of, device_type, local).seconds
        self._seconds = (placement, seconds)
        return seconds

    def compute_s(self, placement: Placement, seconds: np.ndarray | None = None) -> float:
        """The busiest GPU's compute (any placement, pipelines' included)."""
        if seconds is None:
            seconds = self.instance_seconds(placement)
        busy = np.bincount(
            placement.inst_device, weights=seconds, minlength=self.cluster.num_devices
        )
        return float(busy.max(initial=0.0))

    def parts(
        self,
        placement: Placement,
        resolved: ResolvedStrategy | None = None,
        *,
        collectives: bool = True,
    ) -> StepBoundParts:
        """The bound's parts for the placement of a strategy without a pipeline (each op
        has at most one instance per GPU). ``resolved``, the strategy placed, tells when
        its gradients' AllReduces start (:meth:`_synchronized`; without it, each once its
        partials are made). ``collectives``: whether a mirrored reader's partials are
        summed by an AllReduce, as the compiler sums them unless sufficient factors are
        broadcast instead (then the sum counts once at each port)."""
        cluster = self.cluster
        seconds = self.instance_seconds(placement)
        compute_s = self.compute_s(placement, seconds)
        instances = _instances(placement)
        walk = _Walk(
            *_chains_and_arrivals(
                *instances,
                seconds.astype(np.float64),
                self._input_ptr,
                self._input_tensor,
                *self._tensors,
                self._machine,
                self._rate,
                self._port,
                self._downlink,
                cluster.num_machines,
                self._links,
                collectives,
            )
        )
        if not self._links:
            return StepBoundParts(compute_s, 0.0, 0.0, walk.chain_s)
        leaving, exiting = self._departures(instances, walk.reduced)
        by_members = self._by_members(placement, walk.reduced)
        start_s = walk.release_s
        if resolved is not None:
            start_s = self._synchronized(by_members, resolved, walk, instances, seconds)
        busy, collectives_s = self._collective_busy(by_members, start_s)
        d, m = cluster.num_devices, cluster.num_machines
        ports = np.concatenate(
            [walk.arriving / self._port + busy[d : 2 * d], leaving / self._out_port + busy[:d]]
        )
        network = np.concatenate(
            [
                walk.entering / self._downlink + busy[2 * d + m :],
                exiting / self._downlink + busy[2 * d : 2 * d + m],
            ]
        )
        return StepBoundParts(
            compute_s=compute_s,
            ports_s=float(ports.max(initial=0.0)),
            network_s=float(network.max(initial=0.0)),
            chain_s=walk.chain_s,
            collectives_s=collectives_s,
        )


def _after_release_s(release_s: np.ndarray, busy_s: np.ndarray) -> float:
    """The earliest a link is done with work released over time: work ``j`` takes
    ``busy_s[j]`` seconds of the link and cannot start before ``release_s[j]``, so
    whatever is released at or after a time still takes its seconds after it, and the link
    is busy at least until the largest ``release_s[k]`` plus the work released no earlier
    (the classic bound of one machine with release dates)."""
    order = np.argsort(-release_s, kind="stable")
    return float((release_s[order] + np.cumsum(busy_s[order])).max(initial=0.0))


@njit(cache=True)
def _serial_before(
    inst_ptr: np.ndarray,
    inst_device: np.ndarray,
    inst_lo: np.ndarray,
    inst_hi: np.ndarray,
    op_split: np.ndarray,
    seconds: np.ndarray,
    input_ptr: np.ndarray,
    input_tensor: np.ndarray,
    producer: np.ndarray,
    batch: np.ndarray,
    summed: np.ndarray,
    unit: np.ndarray,
    num_units: int,
    num_devices: int,
    finish: np.ndarray,
    chain_s: float,
    max_sets: int,
) -> tuple[np.ndarray, float]:
    """For each unit of tensors (``unit[t]``: at most 63 units), the least time before
    all their producers' instances are done: a GPU runs its compute one task at a time,
    so it is busy at least until it has run every instance of its that must precede one
    of them, and those that cannot start before a time (their chain's start, ``finish``
    less their seconds) run after it: one machine with release dates, the dates taken at
    :data:`_START_SLICES` steps of the longest chain ``chain_s`` (any time gives a bound;
    the steps keep it one pass). An instance must precede a reader's instance whose rows
    it holds (a batch-split producer) and every reader's instance of the sum of its
    partials (a reader not split the same way), as the chain bound waits for them; where
    any instance may serve a reader, none is counted. Also the least time before every
    unit's producers are done. Instances are summed per set of units they precede, up
    to ``max_sets`` sets, and one unit at a time past them."""
    num_ops = len(inst_ptr) - 1
    before = np.zeros(len(inst_device), dtype=np.int64)  # bit u: precedes unit u
    for t in range(len(producer)):
        if unit[t] >= 0:
            p = producer[t]
            for j in range(inst_ptr[p], inst_ptr[p + 1]):
                before[j] |= np.int64(1) << unit[t]
    for op in range(num_ops - 1, -1, -1):  # readers come after their producers
        c0, c1 = inst_ptr[op], inst_ptr[op + 1]
        after = np.int64(0)
        for c in range(c0, c1):
            after |= before[c]
        if after == 0:
            continue
        for k in range(input_ptr[op], input_ptr[op + 1]):
            t = input_tensor[k]
            p = producer[t]
            first, last = inst_ptr[p], inst_ptr[p + 1]
            if batch[t] and op_split[p]:
                for c in range(c0, c1):
                    if before[c] == 0:
                        continue
                    lo, hi = inst_lo[c], inst_hi[c]
                    start = first + np.searchsorted(inst_hi[first:last], lo, side="right")
                    for j in range(start, last):
                        if inst_lo[j] >= hi:
                            break
                        before[j] |= before[c]
            elif summed[t] and op_split[p] and not op_split[op]:
                for j in range(first, last):
                    before[j] |= after
    # by when each instance may start at the earliest (its chain), in _START_SLICES
    # slices of the longest chain, summed per set of units it precedes (an op's
    # instances share theirs, and a graph has few), then per unit: the row of "any" last
    width = chain_s / _START_SLICES
    sets = np.zeros(max_sets, dtype=np.int64)
    by_set = np.zeros((max_sets, num_devices, _START_SLICES))
    busy = np.zeros((num_units + 1, num_devices, _START_SLICES))
    num_sets, last, k = 0, np.int64(0), -1
    for i in range(len(inst_device)):
        bits = before[i]
        if bits == 0:
            continue
        d = inst_device[i]
        b = 0
        if width > 0.0:
            b = min(int((finish[i] - seconds[i]) / width), _START_SLICES - 1)
        if bits != last:
            last, k = bits, -1
            for j in range(num_sets):
                if sets[j] == bits:
                    k = j
                    break
            if k < 0 and num_sets < max_sets:
                k, num_sets = num_sets, num_sets + 1
                sets[k] = bits
        if k >= 0:
            by_set[k, d, b] += seconds[i]
            continue
        busy[num_units, d, b] += seconds[i]  # past max_sets sets: unit by unit
        for u in range(num_units):
            if (bits >> u) & 1:
                busy[u, d, b] += seconds[i]
    for k in range(num_sets):
        busy[num_units] += by_set[k]
        for u in range(num_units):
            if (sets[k] >> u) & 1:
                busy[u] += by_set[k]
    serial = np.zeros(num_units + 1)
    for u in range(num_units + 1):
        for d in range(num_devices):
            after = 0.0
            for b in range(_START_SLICES - 1, -1, -1):
                after += busy[u, d, b]
                if after > 0.0:  # work starts at or after the slice's first time
                    serial[u] = max(serial[u], b * width + after)
    return serial[:num_units], serial[num_units]


def _instances(placement: Placement) -> tuple[np.ndarray, ...]:
    """The placement's instances as the kernels read them (its int32 columns as they
    are: the kernels' arithmetic on them is 64-bit)."""
    return (
        placement.inst_ptr,
        placement.inst_device,
        placement.inst_lo,
        placement.inst_hi,
        placement.op_mode == int(Mode.SPLIT),
    )


@njit(cache=True)
def _released(made: np.ndarray, busy_s: np.ndarray) -> float:
    """:func:`_after_release_s` for a few pieces of work, without sorting them."""
    latest = 0.0
    for k in range(len(made)):
        after = 0.0
        for j in range(len(made)):
            if made[j] >= made[k]:
                after += busy_s[j]
        latest = max(latest, made[k] + after)
    return latest


@njit(cache=True)
def _chains_and_arrivals(
    inst_ptr: np.ndarray,
    inst_device: np.ndarray,
    inst_lo: np.ndarray,
    inst_hi: np.ndarray,
    op_split: np.ndarray,
    seconds: np.ndarray,
    input_ptr: np.ndarray,
    input_tensor: np.ndarray,
    producer: np.ndarray,
    batch: np.ndarray,
    summed: np.ndarray,
    tensor_bytes: np.ndarray,
    row_bytes: np.ndarray,
    consumer_ptr: np.ndarray,
    consumer_op: np.ndarray,
    machine: np.ndarray,
    rate: np.ndarray,
    in_port: np.ndarray,
    downlink: np.ndarray,
    num_machines: int,
    links: bool,
    collectives: bool,
) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The longest chain, the bytes arriving at every GPU and machine, and, with
    ``collectives``, which tensors an AllReduce sums (their links are counted apart:
    module docstring), the earliest each such AllReduce can start (once the last of its
    partials is made) and a reader it is summed for. Instances of a batch-split op hold
    disjoint rows in ascending order."""
    num_ops = len(inst_ptr) - 1
    num_devices = len(rate)
    finish = np.zeros(len(inst_device))
    on_device = np.full(num_devices, -1, dtype=np.int64)  # the producer's instance there
    widest = 0
    for op in range(num_ops):
        widest = max(widest, inst_ptr[op + 1] - inst_ptr[op])
    ready = np.zeros(widest)
    made = np.zeros(widest)
    port_s = np.zeros(widest)
    far_s = np.zeros(widest)
    for op in range(num_ops):
        c0, c1 = inst_ptr[op], inst_ptr[op + 1]
        ready[: c1 - c0] = 0.0
        for k in range(input_ptr[op], input_ptr[op + 1]):
            t = input_tensor[k]
            p = producer[t]
            first, last = inst_ptr[p], inst_ptr[p + 1]
            if first == last:
                continue
            if batch[t] and op_split[p]:  # wait for every instance with rows we read
                for c in range(c0, c1):
                    d, lo, hi = inst_device[c], inst_lo[c], inst_hi[c]
                    start = first + np.searchsorted(inst_hi[first:last], lo, side="right")
                    remote = 0  # rows from other GPUs, each: made at, seconds in, machine
                    for j in range(start, last):
                        if inst_lo[j] >= hi:
                            break
                        arrive = finish[j]
                        if links and inst_device[j] != d:
                            nbytes = (min(hi, inst_hi[j]) - max(lo, inst_lo[j])) * row_bytes[t]
                            arrive += nbytes / rate[inst_device[j], d]
                            made[remote] = finish[j]
                            port_s[remote] = nbytes / in_port[d]
                            far_s[remote] = 0.0
                            if machine[inst_device[j]] != machine[d]:
                                far_s[remote] = nbytes / downlink[machine[d]]
                            remote += 1
                        ready[c - c0] = max(ready[c - c0], arrive)
                    if remote > 1:  # they share the GPU's in-port and machine's downlink
                        ready[c - c0] = max(
                            ready[c - c0],
                            _released(made[:remote], port_s[:remote]),
                            _released(made[:remote], far_s[:remote]),
                        )
            elif summed[t] and op_split[p] and not op_split[op]:  # the sum of them all
                for c in range(c0, c1):
                    d = inst_device[c]
                    for j in range(first, last):
                        arrive = finish[j]
                        if links and inst_device[j] != d:
                            arrive += tensor_bytes[t] / rate[inst_device[j], d]
                        ready[c - c0] = max(ready[c - c0], arrive)
            else:  # the earliest instance that can serve us: its own GPU's, or any other's
                earliest = np.inf
                for j in range(first, last):
                    on_device[inst_device[j]] = j
                    earliest = min(earliest, finish[j])
                for c in range(c0, c1):
                    d = inst_device[c]
                    soonest = earliest
                    if links:
                        need = (
                            (inst_hi[c] - inst_lo[c]) * row_bytes[t]
                            if batch[t]
                            else tensor_bytes[t]
                        )
                        soonest += need / rate[d, d]
                    if on_device[d] >= 0:
                        soonest = min(soonest, finish[on_device[d]])
                    ready[c - c0] = max(ready[c - c0], soonest)
                for j in range(first, last):
                    on_device[inst_device[j]] = -1
        for c in range(c0, c1):
            finish[c] = ready[c - c0] + seconds[c]
    chain = finish.max() if len(finish) else 0.0
    arriving = np.zeros(num_devices)
    entering = np.zeros(num_machines)
    reduced = np.zeros(len(producer), dtype=np.bool_)  # summed by an AllReduce
    release = np.zeros(len(producer))
    summed_by = np.full(len(producer), -1, dtype=np.int64)
    if not links:
        return chain, arriving, entering, reduced, release, summed_by, finish
    device_need = np.zeros(num_devices)
    machine_need = np.zeros(num_machines)
    held_machine = np.zeros(num_machines, dtype=np.bool_)
    reader_on = np.zeros(num_devices, dtype=np.bool_)
    for t in range(len(producer)):
        p = producer[t]
        first, last = inst_ptr[p], inst_ptr[p + 1]
        if first == last or consumer_ptr[t] == consumer_ptr[t + 1]:
            continue
        split = batch[t] and op_split[p]
        partials = summed[t] and op_split[p]
        only_device, only_machine = inst_device[first], machine[inst_device[first]]
        for j in range(first, last):
            on_device[inst_device[j]] = j
            held_machine[machine[inst_device[j]]] = True
            if inst_device[j] != only_device:
                only_device = -1
            if machine[inst_device[j]] != only_machine:
                only_machine = -1
        for k in range(consumer_ptr[t], consumer_ptr[t + 1]):
            reader = consumer_op[k]
            mirrored = False  # the reader runs beside every partial: one AllReduce
            if partials and not op_split[reader]:
                for c in range(inst_ptr[reader], inst_ptr[reader + 1]):
                    reader_on[inst_device[c]] = True
                mirrored = True
                for j in range(first, last):
                    mirrored = mirrored and reader_on[inst_device[j]]
                for c in range(inst_ptr[reader], inst_ptr[reader + 1]):
                    reader_on[inst_device[c]] = False
            for c in range(inst_ptr[reader], inst_ptr[reader + 1]):
                d, lo, hi = inst_device[c], inst_lo[c], inst_hi[c]
                m = machine[d]
                if partials and not op_split[reader]:
                    if mirrored and collectives and only_device < 0:  # an AllReduce
                        reduced[t] = True  # its links' share: StepBound._collective_busy
                        summed_by[t] = reader
                        here = 0.0 if on_device[d] >= 0 else tensor_bytes[t]  # else a copy
                        on_machine = 0.0 if held_machine[m] else tensor_bytes[t]
                    elif mirrored:  # the sum, once
                        here = 0.0 if only_device == d else tensor_bytes[t]
                        on_machine = 0.0 if only_machine == m else tensor_bytes[t]
                    else:  # every other GPU's partial, added up where it is read
                        here = on_machine = 0.0
                        for j in range(first, last):
                            if inst_device[j] != d:
                                here += tensor_bytes[t]
                            if machine[inst_device[j]] != m:
                                on_machine += tensor_bytes[t]
                    device_need[d] = max(device_need[d], here)
                    machine_need[m] = max(machine_need[m], on_machine)
                    continue
                if not split:
                    need = (hi - lo) * row_bytes[t] if batch[t] else tensor_bytes[t]
                    if on_device[d] < 0:
                        device_need[d] = max(device_need[d], need)
                    if not held_machine[m]:
                        machine_need[m] = max(machine_need[m], need)
                    continue
                here = 0  # rows held by the producer's instance on d
                j = on_device[d]
                if j >= 0:
                    here = max(0, min(hi, inst_hi[j]) - max(lo, inst_lo[j]))
                on_machine = 0  # rows held on d's machine
                start = first + np.searchsorted(inst_hi[first:last], lo, side="right")
                for j in range(start, last):
                    if inst_lo[j] >= hi:
                        break
                    if machine[inst_device[j]] == m:
                        on_machine += min(hi, inst_hi[j]) - max(lo, inst_lo[j])
                device_need[d] = max(device_need[d], (hi - lo - here) * row_bytes[t])
                machine_need[m] = max(machine_need[m], (hi - lo - on_machine) * row_bytes[t])
        for j in range(first, last):
            on_device[inst_device[j]] = -1
            held_machine[machine[inst_device[j]]] = False
            if reduced[t]:
                release[t] = max(release[t], finish[j])
        for k in range(consumer_ptr[t], consumer_ptr[t + 1]):
            reader = consumer_op[k]
            for c in range(inst_ptr[reader], inst_ptr[reader + 1]):
                d = inst_device[c]
                arriving[d] += device_need[d]
                device_need[d] = 0.0
                m = machine[d]
                entering[m] += machine_need[m]
                machine_need[m] = 0.0
    return chain, arriving, entering, reduced, release, summed_by, finish
