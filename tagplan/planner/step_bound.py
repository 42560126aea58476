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

import numpy as np

from tagplan.planner.chains import ChainWalk, chains_and_arrivals, instances_of
from tagplan.planner.collective_starts import GradientStarts, after_release_s
from tagplan.planner.compile.links import LinkLayout, ring_bytes_per_link
from tagplan.planner.compile.placement import Placement
from tagplan.planner.cost.comm import CommModel, allreduce_time_s
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.departures import departures
from tagplan.planner.graph.batch import Aggregation
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.strategy import ResolvedStrategy
from tagplan.planner.topology import Cluster

__all__ = ["StepBound", "StepBoundParts"]

_LARGE_BYTES = 1e12  # where every AllReduce's latency is lost in its bandwidth term


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
        self._tensors = (  # what the kernels read of every tensor, in their order
            self._producer,
            self._batch,
            self._summed,
            self._bytes,
            self._row_bytes,
            self._consumer_ptr,
            self._consumer_op,
        )
        gradient = np.zeros(ir.num_tensors, dtype=bool)
        gradient_tensor = ir.parameters.gradient_tensor
        gradient[gradient_tensor[gradient_tensor >= 0]] = True
        self._starts = GradientStarts(
            producer=self._producer,
            consumer_ptr=self._consumer_ptr,
            gradient=gradient,
            tensor_bytes=self._bytes,
            input_ptr=self._input_ptr,
            input_tensor=self._input_tensor,
            batch=self._batch,
            summed=self._summed,
            num_devices=cluster.num_devices,
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
        return self._departures(instances_of(placement), nothing_reduced)

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
        with them when each starts no earlier than ``start_s``
        (:func:`~tagplan.planner.collective_starts.after_release_s`)."""
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
            tail_s = max(tail_s, after_release_s(start_s[tensors], nbytes * busiest_per_byte_s))
        return busy, tail_s

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
        its gradients' AllReduces start
        (:class:`~tagplan.planner.collective_starts.GradientStarts`; without it, each once
        its partials are made). ``collectives``: whether a mirrored reader's partials are
        summed by an AllReduce, as the compiler sums them unless sufficient factors are
        broadcast instead (then the sum counts once at each port)."""
        cluster = self.cluster
        seconds = self.instance_seconds(placement)
        compute_s = self.compute_s(placement, seconds)
        instances = instances_of(placement)
        walk = ChainWalk(
            *chains_and_arrivals(
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
            start_s = self._starts.starts(by_members, resolved, instances, seconds, walk)
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
