"""Strategy -> task graph for the simulator: the second half of the rewrite rules
(TAG §4.3.1) with costs attached.

Every op instance of the :class:`~.placement.Placement` becomes a compute task. Each
tensor an instance reads is brought to it by the rules of TAG §4.3.1:

* same replica layout on both sides: the local slice, no auxiliary op;
* a split op reads a whole tensor: a ``Split`` (here one slice per reader) where a copy
  is, then transfers;
* a whole-tensor reader of a split producer: the slices travel to it and a ``Concat``
  joins them (split-concat outputs), or an ``AddN`` sums the partial results (split-sum
  outputs; a weighted sum for per-replica batch statistics);
* different replica layouts: ``Concat`` then ``Split``;
* a gradient summed over replicas that feed mirrored parameter updates on the same GPUs:
  one AllReduce (ring or hierarchical); to a parameter server: pushes and an ``AddN``.

A tensor is sent to each destination GPU once, not once per reading op. Transfers hold
the links of their path: the sender's and receiver's ports into their machine, and each
machine's network uplink and downlink when they cross machines; a collective holds the
ports and uplinks of every participant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from tagplan.planner.compile.placement import Placement, place
from tagplan.planner.cost.comm import CommModel
from tagplan.planner.cost.memory import op_memory
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.batch import Aggregation
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.sim.taskgraph import COLLECTIVE, COMPUTE, TRANSFER, TaskGraph
from tagplan.planner.strategy import Collective, GradientSync, Mode, ResolvedStrategy
from tagplan.planner.topology import Cluster

__all__ = ["CompiledTasks", "compile_tasks"]

_FULL, _SLICE, _SUM, _MEAN, _LOCAL = 0, 1, 2, 3, 4
_AGG_SUM, _AGG_MEAN = int(Aggregation.SUM), int(Aggregation.MEAN)
_AGG_LOCAL = int(Aggregation.LOCAL)


class _Copy(NamedTuple):
    """One available piece of a tensor: where, which rows, what kind, made by which task."""

    device: int
    lo: int
    hi: int
    kind: int
    task: int
    buffer: int


@dataclass(eq=False)
class CompiledTasks:
    """The task graph plus what maps it back to the strategy."""

    task_graph: TaskGraph
    placement: Placement
    instance_task: np.ndarray  # int32: compute task of each op instance
    measured_fraction: float  # share of compute time from profiles


@dataclass(eq=False)
class _Builder:
    num_devices: int
    kind: list[int] = field(default_factory=list)
    device: list[int] = field(default_factory=list)
    duration: list[float] = field(default_factory=list)
    group: list[int] = field(default_factory=list)
    nbytes: list[int] = field(default_factory=list)
    links: list[list[int]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    edges: set[tuple[int, int]] = field(default_factory=set)
    buffer_device: list[int] = field(default_factory=list)
    buffer_bytes: list[int] = field(default_factory=list)
    buffer_producer: list[int] = field(default_factory=list)
    buffer_consumers: list[list[int]] = field(default_factory=list)

    def task(
        self,
        kind: int,
        device: int,
        seconds: float,
        group: int,
        name: str,
        *,
        nbytes: int = 0,
        links: list[int] | None = None,
    ) -> int:
        self.kind.append(kind)
        self.device.append(device)
        self.duration.append(float(seconds))
        self.group.append(group)
        self.nbytes.append(int(nbytes))
        self.links.append(links or [])
        self.names.append(name)
        return len(self.kind) - 1

    def buffer(self, device: int, nbytes: int, producer: int) -> int:
        self.buffer_device.append(device)
        self.buffer_bytes.append(int(nbytes))
        self.buffer_producer.append(producer)
        self.buffer_consumers.append([])
        return len(self.buffer_device) - 1

    def read(self, copy: _Copy, task: int) -> None:
        """``task`` reads ``copy``: it waits for the copy's producer and keeps it alive."""
        if copy.task != task:
            self.edges.add((copy.task, task))
        if copy.buffer >= 0:
            self.buffer_consumers[copy.buffer].append(task)

    def build(self, persistent: np.ndarray, num_links: int, device_names, link_names) -> TaskGraph:
        def csr(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
            ptr = np.zeros(len(rows) + 1, dtype=np.int32)
            ptr[1:] = np.cumsum([len(r) for r in rows])
            flat = np.fromiter((x for r in rows for x in r), dtype=np.int32, count=int(ptr[-1]))
            return ptr, flat

        n = len(self.kind)
        edges = np.array(list(self.edges), dtype=np.int64).reshape(-1, 2)
        edges = edges[np.lexsort((edges[:, 1], edges[:, 0]))]
        succ_ptr = np.zeros(n + 1, dtype=np.int32)
        succ_ptr[1:] = np.cumsum(np.bincount(edges[:, 0], minlength=n))
        succ_index = edges[:, 1].astype(np.int32)
        link_ptr, link_index = csr(self.links)
        consumer_ptr, consumer_task = csr([sorted(set(c)) for c in self.buffer_consumers])
        return TaskGraph(
            num_devices=self.num_devices,
            num_links=num_links,
            task_kind=np.array(self.kind, dtype=np.int8),
            task_device=np.array(self.device, dtype=np.int32),
            task_duration_s=np.array(self.duration, dtype=np.float64),
            task_priority=np.zeros(n, dtype=np.float64),
            task_group=np.array(self.group, dtype=np.int32),
            task_bytes=np.array(self.nbytes, dtype=np.int64),
            link_ptr=link_ptr,
            link_index=link_index,
            succ_ptr=succ_ptr,
            succ_index=succ_index,
            buffer_device=np.array(self.buffer_device, dtype=np.int32),
            buffer_bytes=np.array(self.buffer_bytes, dtype=np.int64),
            buffer_producer=np.array(self.buffer_producer, dtype=np.int32),
            consumer_ptr=consumer_ptr,
            consumer_task=consumer_task,
            persistent_bytes=persistent,
            device_names=tuple(device_names),
            link_names=tuple(link_names),
            task_names=tuple(self.names),
        )


class _Compiler:
    def __init__(
        self,
        ir: GraphIR,
        cluster: Cluster,
        resolved: ResolvedStrategy,
        costs: OpCostModel,
        comm: CommModel,
    ) -> None:
        self.ir, self.cluster, self.resolved = ir, cluster, resolved
        self.costs, self.comm = costs, comm
        self.placement = place(ir, resolved)
        self.memory = op_memory(ir)
        self.out = _Builder(cluster.num_devices)
        self.copies: list[list[_Copy]] = [[] for _ in range(ir.num_tensors)]
        self.cache: dict[tuple[int, int, int, int], _Copy] = {}  # (tensor, device, lo, hi)
        # per-replica values (batch statistics, shapes) by (tensor, device)
        self.replica_values: dict[tuple[int, int], list[_Copy]] = {}
        self.device_type = [cluster.type_names[t] for t in cluster.device_type]
        num_devices, num_machines = cluster.num_devices, cluster.num_machines
        self.num_links = 2 * num_devices + 2 * num_machines
        self.link_names = (
            [f"{n}/out" for n in cluster.device_names]
            + [f"{n}/in" for n in cluster.device_names]
            + [f"{n}/uplink" for n in cluster.machine_names]
            + [f"{n}/downlink" for n in cluster.machine_names]
        )
        self.compute_s = 0.0
        self.measured_s = 0.0
        self.gradients = set(ir.parameters.gradient_tensor.tolist())
        # per gradient AllReduce: (task, op group, bytes, participating devices, algorithm)
        self.collectives: list[tuple[int, int, int, np.ndarray, str]] = []

    # resources -----------------------------------------------------------------------------
    def _path_links(self, src: int, dst: int) -> list[int]:
        d, m = self.cluster.num_devices, self.cluster.num_machines
        machine = self.cluster.device_machine
        links = [src, d + dst]
        if machine[src] != machine[dst]:
            links += [2 * d + int(machine[src]), 2 * d + m + int(machine[dst])]
        return links

    def _collective_links(self, devices: np.ndarray) -> list[int]:
        d, m = self.cluster.num_devices, self.cluster.num_machines
        links = [int(x) for x in devices] + [d + int(x) for x in devices]
        machines = np.unique(self.cluster.device_machine[devices])
        if len(machines) > 1:
            links += [2 * d + int(x) for x in machines] + [2 * d + m + int(x) for x in machines]
        return links

    def _aux_seconds(self, device: int, nbytes: float) -> float:
        """A memory-bound auxiliary op (Split/Concat/AddN) moving ``nbytes``."""
        spec = self.costs.gpu(self.device_type[device])
        efficiency = self.costs.efficiency
        bandwidth = spec.memory_bandwidth_gb_per_s * 1e9 * efficiency.memory
        return efficiency.launch_s + nbytes / bandwidth

    # tensors -----------------------------------------------------------------------------
    def _bytes(self, tensor: int, lo: int, hi: int, *, memory: bool = False) -> int:
        full = self.memory.tensor_bytes[tensor] if memory else self.ir.tensor_bytes[tensor]
        if self.ir.tensor_batch_axis[tensor] < 0:
            return int(full)
        return int(np.rint(full * (hi - lo) / self.ir.batch_size))

    def _name(self, tensor: int) -> str:
        op = int(self.ir.tensor_producer[tensor])
        return f"{self.ir.op_names[op]}:{int(self.ir.tensor_slot[tensor])}"

    def _transfer(self, tensor: int, copy: _Copy, dst: int, group: int) -> _Copy:
        nbytes = self._bytes(tensor, copy.lo, copy.hi)
        seconds = float(self.comm.p2p_time_s(copy.device, dst, nbytes))
        task = self.out.task(
            TRANSFER,
            -1,
            seconds,
            group,
            f"send {self._name(tensor)}[{copy.lo}:{copy.hi}] -> {self.cluster.device_names[dst]}",
            nbytes=nbytes,
            links=self._path_links(copy.device, dst),
        )
        self.out.read(copy, task)
        buffer = self.out.buffer(dst, self._bytes(tensor, copy.lo, copy.hi, memory=True), task)
        moved = _Copy(dst, copy.lo, copy.hi, copy.kind, task, buffer)
        if copy.kind in (_FULL, _SLICE):
            self.cache[(tensor, dst, copy.lo, copy.hi)] = moved
        return moved

    def _local(self, tensor: int, copy: _Copy, device: int, group: int) -> _Copy:
        """``copy`` on ``device``: itself, a cached copy there, or a new transfer."""
        if copy.device == device:
            return copy
        cached = self.cache.get((tensor, device, copy.lo, copy.hi))
        if cached is not None and copy.kind in (_FULL, _SLICE):
            return cached
        return self._transfer(tensor, copy, device, group)

    def _closest(self, copies: list[_Copy], device: int) -> _Copy:
        machine = self.cluster.device_machine
        return min(
            copies,
            key=lambda c: (c.device != device, machine[c.device] != machine[device], c.device),
        )

    def _full(self, tensor: int, device: int, group: int, reader: int) -> _Copy:
        """The whole tensor on ``device`` (TAG §4.3.1's Concat / AddN / transfer)."""
        batch = self.ir.batch_size
        cached = self.cache.get((tensor, device, 0, batch))
        if cached is not None:
            return cached
        copies = self.copies[tensor]
        whole = [c for c in copies if c.kind == _FULL] or [c for c in copies if c.kind == _LOCAL]
        if whole:
            return self._local(tensor, self._closest(whole, device), device, group)
        partial = [c for c in copies if c.kind in (_SUM, _MEAN)]
        if partial:
            return self._reduce(tensor, partial, device, group, reader)
        pieces = sorted((c for c in copies if c.kind == _SLICE), key=lambda c: c.lo)
        local = [self._local(tensor, piece, device, group) for piece in pieces]
        nbytes = self._bytes(tensor, 0, batch)
        task = self.out.task(
            COMPUTE,
            device,
            self._aux_seconds(device, 2 * nbytes),
            group,
            f"concat {self._name(tensor)} on {self.cluster.device_names[device]}",
        )
        for piece in local:
            self.out.read(piece, task)
        buffer = self.out.buffer(device, self._bytes(tensor, 0, batch, memory=True), task)
        return self._keep(tensor, _Copy(device, 0, batch, _FULL, task, buffer))

    def _keep(self, tensor: int, copy: _Copy) -> _Copy:
        """Record a new whole copy so later readers can fetch it instead of rebuilding it."""
        self.copies[tensor].append(copy)
        self.cache[(tensor, copy.device, copy.lo, copy.hi)] = copy
        return copy

    def _reduce(
        self, tensor: int, partial: list[_Copy], device: int, group: int, reader: int
    ) -> _Copy:
        """Sum (or average) partial results: one AllReduce when the readers are copies on
        the partials' GPUs (mirrored parameter updates), otherwise push to ``device`` and
        AddN there."""
        members = np.unique([c.device for c in partial])
        readers = np.unique(self.placement.devices(reader))
        if len(members) > 1 and set(members.tolist()) <= set(readers.tolist()):
            # readers on GPUs without a replica (more GPUs than examples) then fetch a copy
            self._allreduce(tensor, partial, members, group, reader)
            return self._full(tensor, device, group, reader)
        local = [self._transfer_partial(tensor, piece, device, group) for piece in partial]
        return self._keep(tensor, self._add(tensor, local, device, group, _FULL))

    def _add(self, tensor: int, pieces: list[_Copy], device: int, group: int, kind: int) -> _Copy:
        """An ``AddN`` on ``device`` of pieces already there."""
        batch = self.ir.batch_size
        task = self.out.task(
            COMPUTE,
            device,
            self._aux_seconds(device, (len(pieces) + 1) * self._bytes(tensor, 0, batch)),
            group,
            f"addn {self._name(tensor)} on {self.cluster.device_names[device]}",
        )
        for piece in pieces:
            self.out.read(piece, task)
        buffer = self.out.buffer(device, self._bytes(tensor, 0, batch, memory=True), task)
        return _Copy(device, 0, batch, kind, task, buffer)

    def _transfer_partial(self, tensor: int, piece: _Copy, device: int, group: int) -> _Copy:
        return piece if piece.device == device else self._transfer(tensor, piece, device, group)

    def _allreduce(
        self,
        tensor: int,
        partial: list[_Copy],
        members: np.ndarray,
        group: int,
        reader: int,
    ) -> None:
        batch = self.ir.batch_size
        nbytes = self._bytes(tensor, 0, batch)
        algorithm = self.resolved.group_collective[int(self.resolved.op_group[reader])]
        name = "auto" if algorithm == Collective.AUTO else str(algorithm)
        seconds = float(self.comm.allreduce_time_s(members, nbytes, algorithm=name))
        # several replicas on one GPU: add them up locally first
        inputs: list[_Copy] = []
        for member in members.tolist():
            local = [c for c in partial if c.device == member]
            inputs.append(
                local[0] if len(local) == 1 else self._add(tensor, local, member, group, _SUM)
            )
        task = self.out.task(
            COLLECTIVE,
            -1,
            seconds,
            group,
            f"allreduce {self._name(tensor)} over {len(members)} GPUs",
            nbytes=nbytes,
            links=self._collective_links(members),
        )
        for piece in inputs:
            self.out.read(piece, task)
        if tensor in self.gradients:  # gradient sync modes apply to these alone
            self.collectives.append(
                (task, int(self.resolved.op_group[reader]), nbytes, members, name)
            )
        for member in members.tolist():
            buffer = self.out.buffer(member, self._bytes(tensor, 0, batch, memory=True), task)
            self._keep(tensor, _Copy(member, 0, batch, _FULL, task, buffer))

    def _slice(self, tensor: int, device: int, lo: int, hi: int, group: int, reader: int) -> _Copy:
        """Rows ``[lo, hi)`` of a batch tensor on ``device`` (Split, transfers)."""
        cached = self.cache.get((tensor, device, lo, hi))
        if cached is not None:
            return cached
        exact = [c for c in self.copies[tensor] if c.kind == _SLICE and (c.lo, c.hi) == (lo, hi)]
        if exact:
            return self._local(tensor, self._closest(exact, device), device, group)
        whole_here = self.cache.get((tensor, device, 0, self.ir.batch_size))
        source = device if whole_here is not None else self._hub(tensor)
        whole = self._full(tensor, source, group, reader)
        nbytes = self._bytes(tensor, lo, hi)
        task = self.out.task(
            COMPUTE,
            source,
            self._aux_seconds(source, 2 * nbytes),
            group,
            f"split {self._name(tensor)}[{lo}:{hi}] on {self.cluster.device_names[source]}",
        )
        self.out.read(whole, task)
        buffer = self.out.buffer(source, self._bytes(tensor, lo, hi, memory=True), task)
        piece = _Copy(source, lo, hi, _SLICE, task, buffer)
        self.cache[(tensor, source, lo, hi)] = piece
        return self._local(tensor, piece, device, group)

    def _same_replica(self, tensor: int, device: int, lo: int, hi: int) -> _Copy | None:
        """Per-replica batch statistics are used where they are, as in every data-parallel
        framework: by the same replica (its batch-norm gradient), or by whatever runs on
        that GPU (the update of its mirror of the running averages)."""
        local = self.replica_values.get((tensor, device))
        if not local:
            return None
        exact = [c for c in local if (c.lo, c.hi) == (lo, hi)]
        return (exact or local)[0]

    def _hub(self, tensor: int) -> int:
        """Where a whole copy is made before splitting: the first producing GPU."""
        whole = [c for c in self.copies[tensor] if c.kind == _FULL]
        return (whole or self.copies[tensor])[0].device

    def _schedule_collectives(self) -> None:
        """Apply each group's gradient-sync mode to its AllReduces (see GradientSync)."""
        decisions = self.resolved.group_decisions
        if all(decisions[c[1]].gradient_sync == GradientSync.OVERLAP for c in self.collectives):
            return
        collective_tasks = {c[0] for c in self.collectives}
        inputs: dict[int, set[int]] = {}
        for pred, succ in self.out.edges:
            if succ in collective_tasks:
                inputs.setdefault(succ, set()).add(pred)
        for group in sorted({c[1] for c in self.collectives}):
            decision = decisions[group]
            members = [c for c in self.collectives if c[1] == group]
            if decision.gradient_sync == GradientSync.AFTER_BACKWARD:
                every_gradient = {p for c in self.collectives for p in inputs.get(c[0], ())}
                _barrier(self.out, "after backward", group, every_gradient, [c[0] for c in members])
            elif decision.gradient_sync == GradientSync.BUCKETED:
                bucket: list[tuple[int, int, int, np.ndarray, str]] = []
                for collective in [*members, None]:
                    full = sum(c[2] for c in bucket) >= decision.bucket_bytes
                    if bucket and (collective is None or full):
                        self._fuse(bucket, inputs, group)
                        bucket = []
                    if collective is not None:
                        bucket.append(collective)

    def _fuse(self, bucket: list, inputs: dict[int, set[int]], group: int) -> None:
        """Horovod tensor fusion: the bucket's AllReduces start together when its last
        gradient is ready and share one latency: each takes its share of the fused time."""
        total = sum(c[2] for c in bucket)
        fused = float(self.comm.allreduce_time_s(bucket[0][3], total, algorithm=bucket[0][4]))
        for task, _, nbytes, _, _ in bucket:
            self.out.duration[task] = fused * nbytes / total if total else 0.0
        waits = {p for c in bucket for p in inputs.get(c[0], ())}
        _barrier(self.out, f"bucket of {len(bucket)}", group, waits, [c[0] for c in bucket])

    # ops ---------------------------------------------------------------------------------
    def _publish(self, op: int, inst: int, task: int) -> None:
        device = int(self.placement.inst_device[inst])
        lo, hi = int(self.placement.inst_lo[inst]), int(self.placement.inst_hi[inst])
        split = self.placement.op_mode[op] == Mode.SPLIT
        for tensor in self.ir.outputs(op):
            carries = self.ir.tensor_batch_axis[tensor] >= 0
            aggregation = int(self.ir.tensor_aggregation[tensor])
            if not split:
                kind, lo_t, hi_t = _FULL, 0, self.ir.batch_size
            elif aggregation == _AGG_SUM:
                kind, lo_t, hi_t = _SUM, lo, hi
            elif aggregation == _AGG_MEAN:
                kind, lo_t, hi_t = _MEAN, lo, hi
            elif aggregation == _AGG_LOCAL:
                kind, lo_t, hi_t = _LOCAL, lo, hi
            elif carries:
                kind, lo_t, hi_t = _SLICE, lo, hi
                if (lo, hi) == (0, self.ir.batch_size):
                    kind = _FULL
            else:
                kind, lo_t, hi_t = _FULL, 0, self.ir.batch_size
            nbytes = self._bytes(tensor, lo_t, hi_t, memory=True)
            buffer = self.out.buffer(device, nbytes, task)
            copy = _Copy(device, lo_t, hi_t, kind, task, buffer)
            self.copies[tensor].append(copy)
            if kind in (_MEAN, _LOCAL):
                self.replica_values.setdefault((int(tensor), device), []).append(copy)
            if kind in (_FULL, _SLICE):
                self.cache.setdefault((int(tensor), device, lo_t, hi_t), copy)

    def compile(self) -> CompiledTasks:
        ir, placement = self.ir, self.placement
        instance_task = np.zeros(placement.num_instances, dtype=np.int32)
        for op in range(ir.num_ops):
            group = int(self.resolved.op_group[op])
            split = placement.op_mode[op] == Mode.SPLIT
            for inst in placement.instances(op):
                device = int(placement.inst_device[inst])
                lo, hi = int(placement.inst_lo[inst]), int(placement.inst_hi[inst])
                times = self.costs.op_times(self.device_type[device], max(hi - lo, 1))
                seconds = float(times.seconds[op])
                self.compute_s += seconds
                self.measured_s += seconds if times.measured[op] else 0.0
                task = self.out.task(
                    COMPUTE,
                    device,
                    seconds,
                    group,
                    f"{ir.op_names[op]}/replica_{inst - placement.inst_ptr[op]}",
                )
                instance_task[inst] = task
                for tensor in ir.inputs(op).tolist():
                    if split and ir.tensor_batch_axis[tensor] >= 0:
                        copy = self._slice(tensor, device, lo, hi, group, op)
                    else:
                        copy = self._same_replica(tensor, device, lo, hi) or self._full(
                            tensor, device, group, op
                        )
                    self.out.read(copy, task)
                for pred in ir.control_preds(op).tolist():
                    for pred_inst in placement.instances(pred):
                        self.out.edges.add((int(instance_task[pred_inst]), task))
                self._publish(op, inst, task)
        self._schedule_collectives()
        persistent = np.zeros(self.cluster.num_devices, dtype=np.int64)
        for op in np.flatnonzero(ir.variable_bytes > 0).tolist():
            for device in placement.devices(op).tolist():
                persistent[device] += int(ir.variable_bytes[op])
        graph = self.out.build(
            persistent, self.num_links, self.cluster.device_names, self.link_names
        )
        measured = self.measured_s / self.compute_s if self.compute_s > 0 else 0.0
        return CompiledTasks(graph, placement, instance_task, measured)


def _barrier(
    out: _Builder, name: str, group: int, waits_for: set[int], releases: list[int]
) -> None:
    """A zero-time task that ``releases`` wait for and that waits for ``waits_for``."""
    task = out.task(TRANSFER, -1, 0.0, group, name)
    out.edges.update((pred, task) for pred in waits_for)
    out.edges.update((task, succ) for succ in releases)


def compile_tasks(
    ir: GraphIR,
    cluster: Cluster,
    resolved: ResolvedStrategy,
    *,
    costs: OpCostModel,
    comm: CommModel | None = None,
) -> CompiledTasks:
    """Compile a resolved strategy into the simulator's task graph."""
    return _Compiler(ir, cluster, resolved, costs, comm or CommModel(cluster)).compile()
