"""Strategy -> task graph for the simulator: the second half of the rewrite rules
(TAG §4.3.1) with costs attached.

Every op instance of the :class:`~.placement.Placement` becomes a compute task. Each
tensor an instance reads is brought to it by the transport planner (:mod:`.transport`:
the rules of TAG §4.3.1, shared with the GraphDef back end, :mod:`.graphdef`), its
decisions emitted here as tasks:

* same replica layout on both sides: the local slice, no auxiliary op;
* a split op reads a whole tensor: a ``Split`` (here one slice per reader) where a copy
  is, then transfers;
* a whole-tensor reader of a split producer: the slices travel to it and a ``Concat``
  joins them (split-concat outputs), or an ``AddN`` sums the partial results (split-sum
  outputs; a weighted sum for per-replica batch statistics);
* different replica layouts: ``Concat`` then ``Split``;
* a gradient summed over replicas that feed mirrored parameter updates on the same GPUs:
  one AllReduce (ring or hierarchical); to a parameter server: pushes and an ``AddN``.

A tensor is sent to each destination GPU once, not once per reading op. Transfers use
the links of their path: the sender's and receiver's ports into their machine, and each
machine's network uplink and downlink when they cross machines; a collective uses the
ports and uplinks of every participant (:mod:`.links`: routes, shares, latency parts).

A search compiles hundreds of strategies of one graph, so :class:`TaskCompiler` prepares
what does not depend on the strategy once — the IR's adjacency and tensor sizes as Python
lists, every path's links, communication times per devices and bytes — and the loop over
op instances touches only lists and dicts. The ops are compiled chunk by chunk
(:mod:`.walk`: the op groups a search decides together), each chunk's ops with the inputs
made in the chunk (its *fragment*), then each chunk's tensors read by other chunks (its
*crossing*). Each is compiled alone, numbered from 0, and kept by what it depends on (the
placement of its ops, and for a crossing the readers'); a strategy's task graph splices
them together and renumbers them (:meth:`~.task_builder.TaskBuilder.spliced`), so a
neighbouring strategy compiles only the fragments and crossings its new decisions touch.
The graph numbers tasks by the op each was made for, as an op-by-op compile would, so the
simulator breaks ties alike whatever order the parts were made in.
Within a fragment, what publishing an op's outputs adds is remembered across compiles by
the op's rows (and shared by the ops whose outputs have the same kinds and sizes), and
the outputs are published as blocks, not one copy per instance: a reader with the same
rows (most of data parallelism) reads them as ranges, and any other rule first turns the
block into the copies it looks up. Op times are set for every instance at once when the
graph is built.

Why one module: the emitters share the per-compile state (the transport planner's copies
and transfer cache, the published blocks, the collectives awaiting their sync mode), and
a fragment or crossing is that state for some ops, saved and restored; split, each part
would take that state as arguments in the innermost loop of the search.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np

from tagplan.planner.compile.buckets import Bucket
from tagplan.planner.compile.links import (
    LinkLayout,
    Route,
    latency_part_s,
    ring_bytes_per_link,
)
from tagplan.planner.compile.pipeline import (
    control_pairs,
    first_micro_batch_rows,
    micro_batched_ops,
    phase_barriers,
)
from tagplan.planner.compile.placement import Placement, place, sums_partials
from tagplan.planner.compile.symmetry import (
    Asymmetric,
    Symmetry,
    refined_for_reads,
    split_classes,
    symmetry_classes,
)
from tagplan.planner.compile.task_builder import (
    FrozenTasks,
    TaskBuilder,
    part_offset,
    renumbered,
)
from tagplan.planner.compile.transport import (
    FULL,
    LOCAL,
    SLICE,
    SUM,
    TransportRules,
    published_rows,
    split_kinds,
)
from tagplan.planner.compile.walk import Crossing, Walk, default_walk
from tagplan.planner.cost.comm import CommModel
from tagplan.planner.cost.memory import op_memory
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.csr import row_ranges
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.sim.taskgraph import COLLECTIVE, COMPUTE, TRANSFER, TaskGraph
from tagplan.planner.strategy import Collective, Mode, ResolvedStrategy
from tagplan.planner.topology import Cluster

__all__ = ["CompiledTasks", "TaskCompiler", "compile_tasks"]

_REMEMBERED_INSTANCES = 500_000  # instances whose published outputs a compiler keeps
_REMEMBERED_BYTES = 256 << 20  # about what the fragments and crossings a compiler keeps hold
_NAME_BYTES = 64  # about what a task's name holds (a reference, most a string of its own)
_COPY_BYTES = 128  # about what a copy a fragment exports holds (a tuple, its numbers)
# compiled by class while the quotient keeps at most this share of the instances: past it
# a compile by class costs what one per GPU does (its fragments are kept apart, too)
_CLASSES_WORTH_SHARE = 0.75


class _Copy(NamedTuple):
    """One available piece of a tensor: where, which rows, what kind, made by which task.

    Compiled by symmetry class (:mod:`.symmetry`), a copy on a representative is every
    member's: a piece (slice, partial, per-replica value) covers the class's rows, each
    member holding its own share of them; ``count`` pieces gathered from a class arrive
    at each member as one buffer. A piece a hub cut for a class (``shared_by`` its
    members) holds every member's rows, each member fetching its own."""

    device: int
    lo: int
    hi: int
    kind: int
    task: int
    buffer: int
    count: int = 1
    shared_by: int = 0  # GPUs sharing the rows, when not the class of ``device``


class _Collective(NamedTuple):
    """A gradient's AllReduce, kept until the group's gradient-sync mode is applied. It
    waits for ``inputs``, numbered as in the part it was made in (``part``; -1: this
    task graph), renumbered only when a sync mode needs them."""

    task: int
    group: int
    nbytes: int
    members: tuple[int, ...]
    algorithm: str
    inputs: tuple[int, ...]
    part: int = -1


_Rows = tuple[tuple[int, int, int], ...]  # (device, lo, hi) per instance


class _Outputs(NamedTuple):
    """What publishing the outputs of one op's instances adds, the same in every compile
    where the op has the same rows, mode and class sizes (:meth:`TaskCompiler.outputs`):
    a buffer per instance and output (``device``, ``nbytes``, the instance's index), and
    per output the key (device, lo, hi) and kind of each instance's copy."""

    device: tuple[int, ...]
    nbytes: tuple[int, ...]
    instance: tuple[int, ...]
    keys: tuple[_Rows, ...]
    kinds: tuple[tuple[int, ...], ...]
    whole: tuple[bool, ...]  # keys all different, every copy whole or a slice
    summed: tuple[bool, ...]  # keys all different, every copy a partial sum


class _Block(NamedTuple):
    """One output of an op whose instances run consecutive tasks, published without its
    copies: instance ``i``'s copy holds rows ``keys[i]`` (device, lo, hi) of kind
    ``kinds[i]``, made by task ``first_task + i`` into buffer ``first_buffer + i *
    stride``. A reader with the same rows reads them as ranges; any other rule first
    turns the block into the copies :meth:`_TaskGraphCompilation._publish` describes
    (:meth:`~_TaskGraphCompilation._materialize`)."""

    first_task: int
    first_buffer: int
    stride: int
    keys: _Rows
    kinds: tuple[int, ...]
    whole: bool
    summed: bool

    def reads_as(self, keys: _Rows, partial: bool) -> bool:
        """Whether a reader looking up ``keys`` (one per instance) finds instance ``i``'s
        copy at key ``i``: the same keys, no two alike (the first copy of a key wins),
        all whole copies or slices (``partial``: all partial sums)."""
        return (self.summed if partial else self.whole) and self.keys == keys


_Ready = list[_Copy] | _Block  # the copies every instance of an op reads, in order


class _Exported(NamedTuple):
    """What a fragment leaves of one tensor that other chunks read, where the rules look
    it up: its copies, whole copies and slices by rows, partial sums, the pieces a hub
    cut, per-replica values by GPU, and its block if not yet turned into copies."""

    copies: tuple[_Copy, ...]
    cache: tuple[tuple[tuple[int, int, int, int], _Copy], ...]
    partials: tuple[tuple[tuple[int, int, int, int], _Copy], ...]
    hub_pieces: tuple[tuple[tuple[int, int, int, int], _Copy], ...]
    replica_values: tuple[tuple[int, tuple[_Copy, ...]], ...]
    block: _Block | None


class _Part(NamedTuple):
    """A chunk's fragment or crossing (:mod:`.walk`), compiled alone: its tasks and
    buffers (numbered from 0; a crossing names its chunk's and the readers' fragments'
    as :meth:`~.task_builder.TaskBuilder.spliced` reads them), the compute task of each
    instance of a fragment's ops (in the walk's order), the gradients' AllReduces, the
    transfers standing for several flows, and what a fragment exports by tensor."""

    tasks: FrozenTasks
    instance_task: np.ndarray
    collectives: tuple[_Collective, ...]
    transfer_flows: tuple[tuple[int, int], ...]
    exported: dict[int, _Exported]


@dataclass(eq=False)
class CompiledTasks:
    """The task graph plus what maps it back to the strategy."""

    task_graph: TaskGraph
    placement: Placement
    instance_task: np.ndarray  # int32: compute task of each op instance
    measured_fraction: float  # share of compute time from profiles
    symmetry: Symmetry | None = None  # compiled by class: per-device results expand
    task_copies: np.ndarray | None = None  # by class: the per-GPU tasks each task stands for

    @property
    def per_gpu_factor(self) -> float:
        """The tasks a per-GPU compile makes over the tasks this one made (1 compiled per
        GPU): about what simulating, or emitting the GraphDef of, every GPU costs over
        this evaluation. GPUs without a replica add nothing, as they add no work."""
        if self.task_copies is None or not len(self.task_copies):
            return 1.0
        return float(self.task_copies.sum()) / len(self.task_copies)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector (reference counting still frees everything).

    Compiling allocates ~10^5-10^6 small tuples and lists and makes no reference cycles;
    the collector's passes, triggered by those allocations, scan every live object and
    took a quarter of the compile time.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class TaskCompiler:
    """Compiles strategies for one graph on one cluster into task graphs.

    Everything that does not depend on the strategy is prepared here once, and op and
    communication times, fragments and crossings are remembered across strategies: keep
    one per (graph, cluster) when compiling many strategies
    (:class:`~tagplan.planner.evaluate.Evaluator` does).
    """

    def __init__(
        self,
        ir: GraphIR,
        cluster: Cluster,
        *,
        costs: OpCostModel,
        comm: CommModel | None = None,
    ) -> None:
        self.ir, self.cluster, self.costs = ir, cluster, costs
        self.comm = comm or CommModel(cluster)
        self.op_inputs = ir.input_lists
        bounds = ir.op_output_ptr.tolist()
        self.op_outputs = [range(bounds[i], bounds[i + 1]) for i in range(ir.num_ops)]
        self.tensor_bytes = ir.tensor_bytes.tolist()
        self.tensor_memory_bytes = op_memory(ir).tensor_bytes.tolist()
        self.tensor_carries = (ir.tensor_batch_axis >= 0).tolist()
        self.tensor_split_kind = split_kinds(ir)
        self.tensor_names = [
            f"{ir.op_names[op]}:{slot}"
            for op, slot in zip(ir.tensor_producer.tolist(), ir.tensor_slot.tolist(), strict=True)
        ]
        self.gradients = frozenset(ir.parameters.gradient_tensor.tolist())
        self.tensor_producer = ir.tensor_producer.tolist()
        self.device_names = list(cluster.device_names)
        self.device_machine = cluster.device_machine.tolist()
        costs.check_cluster(cluster)
        efficiency = costs.efficiency
        self.aux_launch_s = efficiency.launch_s
        self.aux_bytes_per_s = (
            cluster.device_memory_bandwidth_bytes_per_s * efficiency.memory
        ).tolist()
        self.links = LinkLayout(cluster)
        # (producer, reader) op pairs along batch tensors whose split copies are slices
        slices = [
            (self.tensor_producer[t], op)
            for op, inputs in enumerate(self.op_inputs)
            for t in set(inputs)
            if self.tensor_split_kind[t] == SLICE
        ]
        pairs = np.array(sorted(set(slices)), dtype=np.int64).reshape(-1, 2)
        self.slice_producer, self.slice_reader = pairs[:, 0], pairs[:, 1]
        # every op making or reading a batch tensor, and the tensor
        carried = ir.tensor_batch_axis >= 0
        made = np.flatnonzero(carried)
        read = carried[ir.op_input_tensor]
        self.batch_access = (
            np.concatenate([ir.tensor_producer[made], ir.input_reader[read]]).astype(np.int64),
            np.concatenate([made, ir.op_input_tensor[read]]).astype(np.int64),
        )
        self._instance_names: list[list[str]] = [[] for _ in range(ir.num_ops)]
        self.op_signature = self._output_signatures()
        self._outputs: dict[tuple, _Outputs] = {}
        self._remembered_instances = 0
        self._p2p_s: dict[tuple[int, int, int], float] = {}
        self._p2p_line: dict[tuple[int, int], tuple[float, float] | None] = {}
        self._allreduce_s: dict[tuple[tuple[int, ...], int, str], float] = {}
        self._walk: Walk | None = None
        self._parts: dict[tuple, _Part | Asymmetric] = {}
        self._remembered_bytes = 0

    def _output_signatures(self) -> list[int]:
        """Per op, a number that ops whose outputs publish alike share: what
        :meth:`outputs` reads of an op's outputs (each one's split kind, bytes, and whether
        it carries the batch) and nothing else. A layer's ops share their output shapes,
        and the search places a whole op group at once: one op computes what publishing
        its same-shaped neighbours adds."""
        numbers: dict[tuple, int] = {}
        return [
            numbers.setdefault(
                tuple(
                    (
                        self.tensor_split_kind[t],
                        self.tensor_memory_bytes[t],
                        self.tensor_carries[t],
                    )
                    for t in tensors
                ),
                len(numbers),
            )
            for tensors in self.op_outputs
        ]

    def compile(
        self,
        resolved: ResolvedStrategy,
        *,
        by_class: bool = False,
        placement: Placement | None = None,
    ) -> CompiledTasks:
        """The task graph of one resolved strategy (``placement``: its placement, when
        already made); ``by_class`` compiles each symmetry class of GPUs once
        (:mod:`.symmetry`; the classes reading rows laid out otherwise split into single
        GPUs first, and a class a rule singles out a member of split and the compile
        tried again) while the classes leave out at least a quarter of the strategy's
        instances, else per GPU."""
        if placement is None:
            placement = place(self.ir, resolved)
        with _collector_paused():
            if by_class and resolved.pipeline is None:  # micro-batch rows are not contiguous
                most = int(_CLASSES_WORTH_SHARE * placement.num_instances)
                symmetry = symmetry_classes(placement, self.cluster)
                while symmetry is not None:
                    symmetry = refined_for_reads(
                        symmetry,
                        placement,
                        self.slice_producer,
                        self.slice_reader,
                        self.batch_access,
                        most_instances=most,
                    )
                    if symmetry is None:
                        break
                    try:
                        return _TaskGraphCompilation(
                            self, resolved, symmetry.placement, symmetry
                        ).compile()
                    except Asymmetric as refused:
                        symmetry = split_classes(
                            symmetry, placement, refused.devices, most_instances=most
                        )
            return _TaskGraphCompilation(self, resolved, placement).compile()

    def outputs(
        self,
        op: int,
        rows: _Rows,
        split: bool,
        members: list[int],
        members_key: bytes | None,
    ) -> _Outputs:
        """The buffers and copies that publishing ``op``'s instances at ``rows`` makes
        (a split op's rows shared by each class's ``members``), remembered across
        compiles and ops by the op's output signature, rows, mode and class sizes
        (``members_key``): neighbouring strategies of a search place most ops alike, and
        an op group's ops of one shape alike."""
        key = (self.op_signature[op], rows, split, members_key)
        found = self._outputs.get(key)
        if found is not None:
            return found
        batch, kinds = self.ir.batch_size, self.tensor_split_kind
        tensors = self.op_outputs[op]
        device, nbytes, instance = [], [], []
        keys: list[list[tuple[int, int, int]]] = [[] for _ in tensors]
        copy_kinds: list[list[int]] = [[] for _ in tensors]
        for i, row in enumerate(rows):
            gpu, lo, hi = row
            share = members[gpu] if split else 1
            for tensor, its_keys, its_kinds in zip(tensors, keys, copy_kinds, strict=True):
                kind, lo_t, hi_t = published_rows(
                    kinds[tensor] if split else FULL, lo, hi, batch, share
                )
                device.append(gpu)
                nbytes.append(self.rows_bytes(tensor, lo_t, hi_t, share, memory=True))
                instance.append(i)
                its_keys.append(row if lo_t == lo and hi_t == hi else (gpu, lo_t, hi_t))
                its_kinds.append(kind)
        distinct = [len(set(k)) == len(k) for k in keys]
        whole = [set(ks) <= {FULL, SLICE} for ks in copy_kinds]
        summed = [set(ks) == {SUM} for ks in copy_kinds]
        # tuples of numbers only: the garbage collector stops tracking them
        found = _Outputs(
            tuple(device),
            tuple(nbytes),
            tuple(instance),
            tuple(map(tuple, keys)),
            tuple(map(tuple, copy_kinds)),
            tuple(d and w for d, w in zip(distinct, whole, strict=True)),
            tuple(d and s for d, s in zip(distinct, summed, strict=True)),
        )
        self._remembered_instances += len(rows)
        if self._remembered_instances > _REMEMBERED_INSTANCES:  # bound what a search keeps
            self._outputs.clear()
            self._remembered_instances = len(rows)
        self._outputs[key] = found
        return found

    def rows_bytes(self, tensor: int, lo: int, hi: int, members: int, *, memory: bool) -> int:
        """Bytes of rows ``[lo, hi)`` of ``tensor``, held by each of ``members`` GPUs in
        equal shares (the whole tensor when it carries no batch)."""
        full = (self.tensor_memory_bytes if memory else self.tensor_bytes)[tensor]
        if not self.tensor_carries[tensor]:
            return full
        return round(full * ((hi - lo) // members) / self.ir.batch_size)

    @property
    def walk(self) -> Walk:
        """The order every strategy is compiled in (:func:`~.walk.default_walk`)."""
        if self._walk is None:
            self._walk = default_walk(self.ir, self.cluster)
        return self._walk

    def forget_parts(self) -> None:
        """Forget the fragments and crossings kept: the next compile costs what a strategy
        sharing no placement with the earlier ones costs."""
        self._parts.clear()
        self._remembered_bytes = 0

    def part(self, key: tuple) -> _Part | Asymmetric | None:
        """The fragment or crossing compiled under ``key``, or the refusal it met;
        ``None`` when new."""
        found = self._parts.pop(key, None)
        if found is not None:  # the most recently used are the last to go
            self._parts[key] = found
        return found

    def remember(self, key: tuple, part: _Part | Asymmetric) -> None:
        """Keep ``part`` for the strategies that place its ops alike, the least recently
        used going first past ``_REMEMBERED_BYTES``."""
        self._parts[key] = part
        self._remembered_bytes += _part_bytes(part)
        while self._remembered_bytes > _REMEMBERED_BYTES and len(self._parts) > 1:
            oldest = next(iter(self._parts))
            self._remembered_bytes -= _part_bytes(self._parts.pop(oldest))

    def instance_names(self, op: int, first: int, count: int) -> list[str]:
        """``<op name>/replica_<k>`` for ``count`` replicas from ``first``, formatted once."""
        names = self._instance_names[op]
        while len(names) < first + count:
            names.append(f"{self.ir.op_names[op]}/replica_{len(names)}")
        return names[first : first + count]

    # times -----------------------------------------------------------------------------------
    def aux_seconds(self, device: int, nbytes: int) -> float:
        """A memory-bound auxiliary op (Split/Concat/AddN) moving ``nbytes``."""
        return self.aux_launch_s + nbytes / self.aux_bytes_per_s[device]

    def p2p_seconds(self, src: int, dst: int, nbytes: int) -> float:
        """:meth:`CommModel.p2p_time_s`: by the path's closed form
        (:meth:`~CommModel.p2p_closed_form`, the same float operations), or the profile's
        model, remembered."""
        pair = (src, dst)
        if pair not in self._p2p_line:
            self._p2p_line[pair] = self.comm.p2p_closed_form(src, dst)
        line = self._p2p_line[pair]
        if line is not None:
            return line[0] + nbytes / line[1] if nbytes > 0 and src != dst else 0.0
        key = (src, dst, nbytes)
        found = self._p2p_s.get(key)
        if found is None:
            found = self._p2p_s[key] = float(self.comm.p2p_time_s(src, dst, nbytes))
        return found

    def allreduce_seconds(self, devices: tuple[int, ...], nbytes: int, algorithm: str) -> float:
        """:meth:`CommModel.allreduce_time_s` over ``devices`` (in ring order), remembered."""
        key = (devices, nbytes, algorithm)
        found = self._allreduce_s.get(key)
        if found is None:
            seconds = self.comm.allreduce_time_s(np.array(devices), nbytes, algorithm=algorithm)
            found = self._allreduce_s[key] = float(seconds)
        return found


class _TaskGraphCompilation(TransportRules[_Copy]):
    """The rewrite rules applied to one strategy (the transport planner's, :mod:`.transport`,
    emitted as tasks); ``fixed`` holds what the strategy does not change."""

    def __init__(
        self,
        fixed: TaskCompiler,
        resolved: ResolvedStrategy,
        placement: Placement,
        symmetry: Symmetry | None = None,
    ) -> None:
        super().__init__(resolved, fixed.ir.batch_size, fixed.device_machine)
        self.fixed = fixed
        self.placement, self.symmetry = placement, symmetry
        num_devices = fixed.cluster.num_devices
        self.members = [1] * num_devices if symmetry is None else symmetry.members.tolist()
        self.members_key = None if symmetry is None else symmetry.members.tobytes()
        self.transfer_flows: dict[int, int] = {}  # transfers standing for several flows
        self.op_group = resolved.op_group.tolist()
        self.op_split = (placement.op_mode == Mode.SPLIT).tolist()
        self.op_adds_partials = (
            sums_partials(fixed.ir) & (placement.op_mode == Mode.SPLIT)
        ).tolist()
        self.micro_batched = micro_batched_ops(resolved, placement).tolist()
        self.tensor_producer = fixed.tensor_producer
        self.inst_ptr = placement.inst_ptr.tolist()
        self.inst_device = placement.inst_device.tolist()
        self.inst_lo, self.inst_hi = placement.inst_lo.tolist(), placement.inst_hi.tolist()
        self.instance_task = np.zeros(placement.num_instances, dtype=np.int64)
        self.out = TaskBuilder(fixed.cluster.num_devices)
        self.pending: dict[int, _Block] = {}  # outputs published as blocks, by tensor
        self._first = _NO_TASKS  # each spliced part's first task
        self.rings: dict[tuple[int, ...], tuple[int, ...]] = {}  # by representatives
        self.routes: dict[tuple[int, ...], Route] = {}  # by ring

    # tensors -----------------------------------------------------------------------------
    def _bytes(
        self, tensor: int, lo: int, hi: int, *, memory: bool = False, members: int = 1
    ) -> int:
        """Bytes of rows ``[lo, hi)`` of ``tensor``, held by each of ``members`` GPUs in
        equal shares."""
        return self.fixed.rows_bytes(tensor, lo, hi, members, memory=memory)

    def _piece_members(self, copy: _Copy) -> int:
        """How many GPUs share the rows of ``copy`` (1 for a whole tensor)."""
        if copy.kind == FULL:
            return 1
        return copy.shared_by or self.members[copy.device]

    def _flows(self, copy: _Copy, dst: int) -> tuple[int, int]:
        """Flows per sending and per receiving GPU when the classes of ``copy`` and
        ``dst`` exchange it (:mod:`.symmetry`): a whole copy, a replica's own value (per
        GPU every reader fetches the closest replica's, the same one), or the pieces a hub
        cut for a class, from one GPU to each member; each member's piece to one GPU; or
        member to member between classes with the same rows. Anything else singles out a
        member."""
        senders, receivers = self.members[copy.device], self.members[dst]
        if copy.kind in (FULL, LOCAL) or copy.shared_by:
            if senders > 1:
                raise Asymmetric("a whole copy fetched from one member of a class", (copy.device,))
            return receivers, 1
        if receivers == 1:
            return 1, senders
        if senders == receivers:
            return 1, 1
        raise Asymmetric("pieces between classes of different sizes", (copy.device, dst))

    def _transfer(self, tensor: int, copy: _Copy, dst: int, group: int) -> _Copy:
        fixed = self.fixed
        members = self._piece_members(copy)
        nbytes = self._bytes(tensor, copy.lo, copy.hi, members=members)
        seconds = fixed.p2p_seconds(copy.device, dst, nbytes)
        route = fixed.links.path(copy.device, dst)
        shares = route.shares
        per_sender, per_receiver = self._flows(copy, dst)
        flows = per_sender * self.members[copy.device]  # over each network link
        if flows > 1:
            shares = [shares[0] * per_sender, shares[1] * per_receiver]
            shares += [share * flows for share in route.shares[2:]]
        task = self.out.task(
            TRANSFER,
            -1,
            seconds,
            group,
            f"send {fixed.tensor_names[tensor]}[{copy.lo}:{copy.hi}] -> {fixed.device_names[dst]}",
            nbytes=nbytes,
            links=route.links,
            shares=shares,
            latency_s=latency_part_s(seconds, nbytes / route.rate_bytes_per_s),
        )
        if flows > 1:
            self.transfer_flows[task] = flows
        self.out.read(copy, task)
        memory = self._bytes(tensor, copy.lo, copy.hi, memory=True, members=members)
        buffer = self.out.buffer(dst, memory * per_receiver, task)
        moved = _Copy(dst, copy.lo, copy.hi, copy.kind, task, buffer, per_receiver)
        if copy.kind in (FULL, SLICE) and per_receiver == 1:
            self.cache[(tensor, dst, copy.lo, copy.hi)] = moved
        return moved

    # the transport planner's hooks ---------------------------------------------------------
    def _move(self, tensor: int, copy: _Copy, device: int, reader: int) -> _Copy:
        """A transfer of ``copy`` to ``device``."""
        return self._transfer(tensor, copy, device, self.op_group[reader])

    def _concat(
        self, tensor: int, pieces: list[_Copy], device: int, lo: int, hi: int, reader: int
    ) -> _Copy:
        """A ``Concat`` on ``device`` of adjacent ``pieces`` (sent there), rows ``[lo, hi)``."""
        local = [self._local(tensor, piece, device, reader) for piece in pieces]
        group = self.op_group[reader]
        nbytes = self._bytes(tensor, lo, hi)
        rows = "" if hi - lo == self.batch else f"[{lo}:{hi}]"
        task = self.out.task(
            COMPUTE,
            device,
            self.fixed.aux_seconds(device, 2 * nbytes),
            group,
            f"concat {self.fixed.tensor_names[tensor]}{rows} on {self.fixed.device_names[device]}",
        )
        for piece in local:
            self.out.read(piece, task)
        buffer = self.out.buffer(device, self._bytes(tensor, lo, hi, memory=True), task)
        kind = FULL if hi - lo == self.batch else SLICE
        return self._keep(tensor, _Copy(device, lo, hi, kind, task, buffer))

    def _add(self, tensor: int, pieces: list[_Copy], device: int, reader: int, kind: int) -> _Copy:
        """An ``AddN`` on ``device`` of pieces already there; micro-batches' partials as a
        running sum in micro-batch order, one two-input ``AddN`` each (gradient
        accumulation: each partial is freed once added)."""
        if len(pieces) > 2 and self._micro_batched(tensor):
            running = self._add(tensor, pieces[:2], device, reader, SUM)
            for piece in pieces[2:-1]:
                running = self._add(tensor, [running, piece], device, reader, SUM)
            return self._add(tensor, [running, pieces[-1]], device, reader, kind)
        group = self.op_group[reader]
        batch = self.batch
        count = sum(piece.count for piece in pieces)
        task = self.out.task(
            COMPUTE,
            device,
            self.fixed.aux_seconds(device, (count + 1) * self._bytes(tensor, 0, batch)),
            group,
            f"addn {self.fixed.tensor_names[tensor]} on {self.fixed.device_names[device]}",
        )
        for piece in pieces:
            self.out.read(piece, task)
        buffer = self.out.buffer(device, self._bytes(tensor, 0, batch, memory=True), task)
        return _Copy(device, 0, batch, kind, task, buffer)

    def _sum(self, tensor: int, partial: list[_Copy], device: int, reader: int) -> _Copy:
        """The partial results sent to ``device`` and added up there."""
        group = self.op_group[reader]
        local = [
            piece if piece.device == device else self._transfer(tensor, piece, device, group)
            for piece in partial
        ]
        return self._add(tensor, local, device, reader, FULL)

    def _single(self, device: int, rule: str) -> None:
        """Compiled by class, a rule that would single out one member of ``device``'s
        class refuses (:class:`~.symmetry.Asymmetric`): that class is split and the
        compile tried again."""
        if self.members[device] > 1:
            raise Asymmetric(rule, (device,))

    def _check_covering(self, device: int, covering: list[_Copy]) -> None:
        """Compiled by class, a GPU standing for several that gathers or cuts pieces of
        another layout, or holds one of them, refuses (:meth:`_single`): its members'
        rows meet the pieces at different offsets (:mod:`.symmetry`)."""
        for gpu in (device, *(c.device for c in covering)):
            self._single(gpu, "a reader gathers or cuts pieces of another layout")

    def _class_size(self, device: int) -> int:
        return self.members[device]

    def _allreduce(
        self, tensor: int, partial: list[_Copy], members: tuple[int, ...], reader: int
    ) -> None:
        fixed, batch = self.fixed, self.batch
        group = self.op_group[reader]
        nbytes = self._bytes(tensor, 0, batch)
        reader_group = self.op_group[reader]
        algorithm = self.resolved.group_collective[reader_group]
        name = "auto" if algorithm == Collective.AUTO else str(algorithm)
        # several replicas on one GPU: add them up locally first
        inputs: list[_Copy] = []
        for member in members:
            local = [c for c in partial if c.device == member]
            inputs.append(
                local[0] if len(local) == 1 else self._add(tensor, local, member, reader, SUM)
            )
        ring = self._ring_members(members)
        seconds = fixed.allreduce_seconds(ring, nbytes, name)
        route = self._ring_route(ring)
        task = self.out.task(
            COLLECTIVE,
            -1,
            seconds,
            group,
            f"allreduce {fixed.tensor_names[tensor]} over {len(ring)} GPUs",
            nbytes=nbytes,
            links=route.links,
            shares=route.shares,
            latency_s=_ring_latency_s(seconds, ring, nbytes, route.rate_bytes_per_s),
        )
        for piece in inputs:
            self.out.read(piece, task)
        if tensor in fixed.gradients:  # gradient sync modes apply to these alone
            waits = tuple(piece.task for piece in inputs)
            self.collectives.append(_Collective(task, reader_group, nbytes, ring, name, waits))
        for member in members:
            buffer = self.out.buffer(member, self._bytes(tensor, 0, batch, memory=True), task)
            self._keep(tensor, _Copy(member, 0, batch, FULL, task, buffer))

    def _ring_members(self, members: tuple[int, ...]) -> tuple[int, ...]:
        """The GPUs of a ring over ``members`` (representatives stand for their class)."""
        if self.symmetry is None:
            return members
        ring = self.rings.get(members)
        if ring is None:
            ring = self.rings[members] = self.symmetry.expand(members)
        return ring

    def _ring_route(self, ring: tuple[int, ...]) -> Route:
        """The ring's route with each GPU's ports as its representative's: every member's
        port carries the ring once, as the representative's does."""
        route = self.routes.get(ring)
        if route is None:
            route = self.routes[ring] = self._quotient_route(ring)
        return route

    def _quotient_route(self, ring: tuple[int, ...]) -> Route:
        route = self.fixed.links.ring(ring)
        if self.symmetry is None:
            return route
        num_devices = self.fixed.cluster.num_devices
        rep = self.symmetry.representative
        links: dict[int, float] = {}
        for link, share in zip(route.links, route.shares, strict=True):
            if link < 2 * num_devices:  # a port: out (d) or in (D + d)
                link = int(rep[link % num_devices]) + (link // num_devices) * num_devices
            links.setdefault(link, share)
        return Route(list(links), list(links.values()), route.rate_bytes_per_s)

    def _cut(
        self, tensor: int, source: _Copy, lo: int, hi: int, reader: int, members: int
    ) -> _Copy:
        """A ``Split`` of rows ``[lo, hi)`` out of ``source`` (a whole copy or a piece
        holding them), where ``source`` is."""
        device, group = source.device, self.op_group[reader]
        nbytes = self._bytes(tensor, lo, hi, members=members)
        task = self.out.task(
            COMPUTE,
            device,
            self.fixed.aux_seconds(device, 2 * nbytes),
            group,
            f"split {self.fixed.tensor_names[tensor]}[{lo}:{hi}] on "
            f"{self.fixed.device_names[device]}",
        )
        self.out.read(source, task)
        memory = self._bytes(tensor, lo, hi, memory=True, members=members)
        buffer = self.out.buffer(device, memory, task)
        piece = _Copy(device, lo, hi, SLICE, task, buffer)
        self.cache[(tensor, device, lo, hi)] = piece
        return piece

    def _split(
        self, tensor: int, source: _Copy, rows: list[tuple[int, int, int]], reader: int
    ) -> list[_Copy]:
        """One ``Split`` task on ``source``'s GPU moving every piece's bytes (a class's
        piece holds all its members' rows), a buffer per piece."""
        device = source.device
        moved_bytes = [self._bytes(tensor, lo, hi, members=m) * m for lo, hi, m in rows]
        task = self.out.task(
            COMPUTE,
            device,
            self.fixed.aux_seconds(device, 2 * sum(moved_bytes)),
            self.op_group[reader],
            f"split {self.fixed.tensor_names[tensor]} into {len(rows)} on "
            f"{self.fixed.device_names[device]}",
        )
        self.out.read(source, task)
        pieces = []
        for lo, hi, members in rows:
            memory = self._bytes(tensor, lo, hi, memory=True, members=members) * members
            buffer = self.out.buffer(device, memory, task)
            pieces.append(_Copy(device, lo, hi, SLICE, task, buffer, shared_by=members))
        return pieces

    def _waits(self, collectives: Sequence[_Collective]) -> frozenset[int]:
        """Every task ``collectives`` wait for."""
        return frozenset(
            t
            for c in collectives
            for t in (self._numbers(c.inputs, c.part) if c.part >= 0 else c.inputs)
        )

    def _after_backward(self, group: int, collectives: list[_Collective]) -> None:
        every_gradient = self._waits(self.collectives)
        releases = [c.task for c in collectives]
        _barrier(self.out, "after backward", group, every_gradient, releases)

    def _fuse(self, bucket: Bucket, collectives: list[_Collective]) -> None:
        """Horovod tensor fusion: the bucket's AllReduces start together when its last
        gradient is ready and share one latency: each takes its share of the time of one
        AllReduce of the bucket's bytes."""
        total = bucket.nbytes
        fused = self.fixed.allreduce_seconds(bucket.members, total, collectives[0].algorithm)
        rate = self._ring_route(bucket.members).rate_bytes_per_s
        for c in collectives:
            seconds = fused * c.nbytes / total if total else 0.0
            self.out.duration[c.task] = seconds
            self.out.latency[c.task] = _ring_latency_s(seconds, bucket.members, c.nbytes, rate)
        waits = self._waits(collectives)
        releases = [c.task for c in collectives]
        _barrier(self.out, f"bucket of {len(collectives)}", bucket.groups[0], waits, releases)

    # ops ---------------------------------------------------------------------------------
    def _compute(self, op: int, instances: range) -> list[int]:
        """Consecutive compute tasks for ``instances`` of ``op``; their seconds are set
        for every instance at once when the graph is built (:meth:`_compute_seconds`)."""
        fixed, start, stop = self.fixed, instances.start, instances.stop
        names = fixed.instance_names(op, start - self.inst_ptr[op], len(instances))
        tasks = self.out.compute_tasks(self.inst_device[start:stop], self.op_group[op], names)
        self.instance_task[start:stop] = tasks
        return tasks

    def _compute_seconds(self, instance_task: np.ndarray, duration_s: np.ndarray) -> float:
        """Set every instance's seconds, for its GPU type and local batch (a split op's
        rows over its class's members), in ``duration_s``; the share of the compute time
        summed over every GPU that comes from profiles."""
        placement, members = self.placement, np.asarray(self.members, dtype=np.int64)
        op_of = np.repeat(np.arange(self.fixed.ir.num_ops), np.diff(placement.inst_ptr))
        copies = members[placement.inst_device]  # the GPUs each instance stands for
        share = np.where(placement.op_mode[op_of] == Mode.SPLIT, copies, 1)
        local = np.maximum((placement.inst_hi - placement.inst_lo) // share, 1)
        gpu_type = self.fixed.cluster.device_type[placement.inst_device]
        times = self.fixed.costs.instance_times(op_of, gpu_type, local)
        duration_s[instance_task] = times.seconds
        total_s = float(times.seconds @ copies)
        measured_s = float(times.seconds[times.measured] @ copies[times.measured])
        return measured_s / total_s if total_s > 0 else 0.0

    def _rows(self, op: int) -> _Rows:
        """``(device, lo, hi)`` of every instance of ``op``."""
        first, end = self.inst_ptr[op], self.inst_ptr[op + 1]
        return tuple(
            zip(
                self.inst_device[first:end],
                self.inst_lo[first:end],
                self.inst_hi[first:end],
                strict=True,
            )
        )

    def _ready_inputs(self, op: int, rows: _Rows, inputs: list[int]) -> list[_Ready | None]:
        """Per input of ``op`` in ``inputs``, the copy each instance (at ``rows``) reads
        when every one is already on its GPU (the common case: a layer reading its
        replica's activations and the local mirror of a weight), or the block that holds
        them in the instances' order; ``None`` for an input some instance needs a transfer or an
        auxiliary op for. Only looks: the rules give the same copies when this finds them,
        and compiling the op's instances adds copies of its other inputs alone."""
        cache, batch, pending = self.cache, self.batch, self.pending
        split, carries = self.op_split[op], self.fixed.tensor_carries
        kinds = self.fixed.tensor_split_kind
        whole_keys = None
        ready: list[_Ready | None] = []
        for tensor in inputs:
            by_rows = split and carries[tensor]
            partial = not by_rows and self.op_adds_partials[op] and kinds[tensor] == SUM
            block = pending.get(tensor)
            if block is not None:
                if by_rows or partial:
                    keys = rows
                else:
                    keys = whole_keys = whole_keys or tuple((d, 0, batch) for d, _, _ in rows)
                if block.reads_as(keys, partial):
                    ready.append(block)
                    continue
                self._materialize(tensor)
            if by_rows:
                copies = [cache.get((tensor, d, lo, hi)) for d, lo, hi in rows]
            elif partial:
                copies = [self.partials[(tensor, d, lo, hi)] for d, lo, hi in rows]
            elif tensor in self.replica_values:
                copies = [
                    self._same_replica(tensor, d, lo, hi) or cache.get((tensor, d, 0, batch))
                    for d, lo, hi in rows
                ]
            else:  # no per-replica values: what _same_replica would find is nothing
                copies = [cache.get((tensor, d, 0, batch)) for d, _, _ in rows]
            ready.append(None if None in copies else copies)
        return ready

    def _inputs(
        self, op: int, inst: int, task: int, ready: list[_Ready | None], inputs: list[int]
    ) -> None:
        """Bring the ``inputs`` of one instance of ``op`` that :meth:`_ready_inputs` found
        no copy of to it (TAG §4.3.1)."""
        split, carries = self.op_split[op], self.fixed.tensor_carries
        device, lo, hi = self.inst_device[inst], self.inst_lo[inst], self.inst_hi[inst]
        kinds = self.fixed.tensor_split_kind
        for tensor, found in zip(inputs, ready, strict=True):
            if found is not None:
                continue
            if split and carries[tensor]:
                copy = self._slice(tensor, device, lo, hi, op)
            elif self.op_adds_partials[op] and kinds[tensor] == SUM:  # placed where they are
                copy = self.partials[(tensor, device, lo, hi)]
            else:
                copy = self._same_replica(tensor, device, lo, hi) or self._full(tensor, device, op)
            self.out.read(copy, task)

    def _read_ready(self, ready: list[_Ready | None], tasks: list[int]) -> None:
        """``tasks``, one per instance, read the copies :meth:`_ready_inputs` found."""
        for found in ready:
            if isinstance(found, _Block):
                self.out.reads_range(found.first_task, found.first_buffer, found.stride, tasks)
            elif found is not None:
                self.out.reads(found, tasks)

    def _publish(self, op: int, rows: _Rows, first_task: int) -> None:
        """Make the outputs of the instances of ``op`` at ``rows`` (run by consecutive
        tasks from ``first_task``) available to their readers, as blocks: a buffer per
        instance and output now, the copies when a rule asks for them."""
        outputs = self.fixed.outputs(op, rows, self.op_split[op], self.members, self.members_key)
        first_buffer = self.out.buffers(
            outputs.device, outputs.nbytes, first_task, outputs.instance
        )
        stride = len(outputs.keys)
        for k, tensor in enumerate(self.fixed.op_outputs[op]):
            self.pending[tensor] = _Block(
                first_task,
                first_buffer + k,
                stride,
                outputs.keys[k],
                outputs.kinds[k],
                outputs.whole[k],
                outputs.summed[k],
            )

    def _publish_copies(self, op: int, rows: _Rows, tasks: list[int]) -> None:
        """Make the outputs of the instances of ``op`` at ``rows`` (run by ``tasks``, not
        consecutive: tasks that bring their inputs came between them) available to their
        readers as copies at once: what :meth:`_publish` and :meth:`_materialize` give,
        but for every instance in one pass."""
        outputs = self.fixed.outputs(op, rows, self.op_split[op], self.members, self.members_key)
        producers = [tasks[i] for i in outputs.instance]
        first_buffer = self.out.buffers(outputs.device, outputs.nbytes, 0, producers)
        stride = len(outputs.keys)
        for k, tensor in enumerate(self.fixed.op_outputs[op]):
            self._record(tensor, outputs.keys[k], outputs.kinds[k], tasks, first_buffer + k, stride)

    def _materialize(self, tensor: int) -> None:
        """The copies of ``tensor``'s block, as :meth:`_publish` describes them, recorded
        where the rules look them up (nothing when it has none pending)."""
        block = self.pending.pop(tensor, None)
        if block is None:
            return
        tasks = range(block.first_task, block.first_task + len(block.keys))
        self._record(tensor, block.keys, block.kinds, tasks, block.first_buffer, block.stride)

    def _record(
        self,
        tensor: int,
        keys: _Rows,
        kinds: tuple[int, ...],
        tasks: Sequence[int],
        buffer: int,
        stride: int,
    ) -> None:
        """Copies of ``tensor``: instance ``i``'s holds rows ``keys[i]`` of kind
        ``kinds[i]``, made by ``tasks[i]`` into buffer ``buffer + i * stride``; recorded
        where the rules look them up."""
        self._record_copies(
            tensor,
            [
                _Copy(device, lo, hi, kind, task, buffer + i * stride)
                for i, (task, (device, lo, hi), kind) in enumerate(
                    zip(tasks, keys, kinds, strict=True)
                )
            ],
        )

    def _op(self, op: int, inputs: list[int]) -> None:
        """Every instance of ``op``, in order, with the tasks that bring it ``inputs`` (the
        task graph keeps dependencies as a set: the order they are added in does not
        matter)."""
        self.out.made_for = op
        instances = range(self.inst_ptr[op], self.inst_ptr[op + 1])
        rows = self._rows(op)
        ready = self._ready_inputs(op, rows, inputs)
        if None in ready:
            tasks = []
            out, group, devices = self.out, self.op_group[op], self.inst_device
            names = self.fixed.instance_names(op, 0, len(instances))
            for inst, name in zip(instances, names, strict=True):
                task = self.instance_task[inst] = out.compute_task(devices[inst], group, name)
                self._inputs(op, inst, task, ready, inputs)  # may add transfers and aux ops
                tasks.append(task)
            self._read_ready(ready, tasks)
            self._publish_copies(op, rows, tasks)
        else:  # nothing to add: the instances' tasks are consecutive
            tasks = self._compute(op, instances)
            self._read_ready(ready, tasks)
            self._publish(op, rows, tasks[0])

    def _reads(self, op: int, inputs: list[int]) -> None:
        """Bring ``inputs`` (made in other chunks) to the instances of ``op``, whose tasks
        its chunk's fragment made."""
        self.out.made_for = op
        start, stop = self.inst_ptr[op], self.inst_ptr[op + 1]
        ready = self._ready_inputs(op, self._rows(op), inputs)
        tasks = self.instance_task[start:stop].tolist()
        if None in ready:
            for inst, task in zip(range(start, stop), tasks, strict=True):
                self._inputs(op, inst, task, ready, inputs)
        self._read_ready(ready, tasks)

    # fragments and crossings ---------------------------------------------------------------
    def _forget(self) -> None:
        """Start a task graph anew, with no copies of any tensor."""
        self._forget_copies()
        self.out = TaskBuilder(self.fixed.cluster.num_devices)
        self.pending = {}
        self.transfer_flows = {}

    def _fragment_keys(self, walk: Walk, instances: np.ndarray, bounds: np.ndarray) -> list:
        """Per chunk of ``walk``, what its fragment depends on: the rows of its ops'
        instances, each op's instance count, mode, op group and its AllReduces'
        algorithm, and the classes its GPUs stand for; ``None`` for a pipeline's (not
        remembered)."""
        if self.resolved.pipeline is not None:
            return [None] * walk.num_chunks
        placement, resolved, order = self.placement, self.resolved, walk.op_order
        rows = np.stack(
            (
                placement.inst_device[instances],
                placement.inst_lo[instances],
                placement.inst_hi[instances],
            ),
            axis=1,
        )
        codes = np.array([_COLLECTIVE_CODE[c] for c in resolved.group_collective], np.int32)
        group = resolved.op_group[order]
        per_op = np.stack(
            (
                np.diff(placement.inst_ptr)[order],
                placement.op_mode[order].astype(np.int32),
                group,
                codes[group],
            ),
            axis=1,
        )
        op_bounds = walk.op_bounds
        return [
            (
                k,
                self._classes_key(rows[bounds[k] : bounds[k + 1], 0]),
                rows[bounds[k] : bounds[k + 1]].tobytes(),
                per_op[op_bounds[k] : op_bounds[k + 1]].tobytes(),
            )
            for k in range(walk.num_chunks)
        ]

    def _classes_key(self, devices: np.ndarray) -> bytes:
        """The classes of the representatives among ``devices``, each GPU of them with
        its representative: all a fragment on those GPUs reads of the classes (their
        sizes, the GPUs a ring over them expands to), so that a strategy that makes other
        classes elsewhere still finds it."""
        if self.symmetry is None:
            return b""
        representative = self.symmetry.representative
        members = np.flatnonzero(np.isin(representative, devices)).astype(np.int32)
        return members.tobytes() + representative[members].tobytes()

    def _part(self, key: tuple | None, compile_part: Callable[[], _Part]) -> _Part:
        """The part remembered under ``key``, else ``compile_part()`` (remembered, as is
        a refusal to compile it by class)."""
        found = None if key is None else self.fixed.part(key)
        if isinstance(found, Asymmetric):
            raise found
        if found is None:
            try:
                found = compile_part()
            except Asymmetric as refused:
                if key is not None:
                    self.fixed.remember(key, refused)
                raise
            if key is not None:
                self.fixed.remember(key, found)
        return found

    def _fragment(self, walk: Walk, k: int, instances: np.ndarray) -> _Part:
        """Chunk ``k``'s ops (their ``instances``) with the inputs made in the chunk."""
        self._forget()
        for op, inputs in zip(walk.ops[k], walk.inputs[k], strict=True):
            self._op(op, inputs)
        return _Part(
            self.out.freeze(),
            self.instance_task[instances],
            tuple(self.collectives),
            tuple(self.transfer_flows.items()),
            self._exported(walk.exported[k]),
        )

    def _exported(self, tensors: frozenset[int]) -> dict[int, _Exported]:
        """What the rules keep of each of ``tensors``."""
        if not tensors:
            return {}
        cache, partials, hub_pieces = (
            _by_tensor(kept, tensors) for kept in (self.cache, self.partials, self.hub_pieces)
        )
        return {
            t: _Exported(
                tuple(self.copies.get(t, ())),
                cache[t],
                partials[t],
                hub_pieces[t],
                tuple((d, tuple(c)) for d, c in self.replica_values.get(t, {}).items()),
                self.pending.get(t),
            )
            for t in tensors
        }

    def _crossing(self, crossing: Crossing, fragments: list[_Part], named: np.ndarray) -> _Part:
        """The reads of ``crossing``, each instance's compute task ``named`` as part of its
        fragment (:meth:`~.task_builder.TaskBuilder.spliced`)."""
        self._forget()
        shift = part_offset(crossing.chunk)
        exported = fragments[crossing.chunk].exported

        def moved(c: _Copy) -> _Copy:
            return c._replace(task=c.task + shift, buffer=c.buffer + shift)

        for tensor, _ in crossing.reads:
            state = exported[tensor]
            self.copies[tensor] = [moved(c) for c in state.copies]
            self.cache.update((key, moved(c)) for key, c in state.cache)
            self.partials.update((key, moved(c)) for key, c in state.partials)
            self.hub_pieces.update((key, moved(c)) for key, c in state.hub_pieces)
            if state.replica_values:
                self.replica_values[tensor] = {
                    d: [moved(c) for c in copies] for d, copies in state.replica_values
                }
            if state.block is not None:
                self.pending[tensor] = state.block._replace(
                    first_task=state.block.first_task + shift,
                    first_buffer=state.block.first_buffer + shift,
                )
        own, self.instance_task = self.instance_task, named
        try:
            for tensor, reads in crossing.reads:
                for op, count in reads:
                    self._reads(op, [tensor] * count)
        finally:
            self.instance_task = own
        return _Part(
            self.out.freeze(),
            _NO_TASKS,
            tuple(self.collectives),
            tuple(self.transfer_flows.items()),
            {},
        )

    def _parts(self) -> tuple[list[_Part], list[np.ndarray]]:
        """Every chunk's fragment, then every chunk's crossing, each remembered or
        compiled; the instances of each chunk's ops in the walk's order."""
        walk = self.fixed.walk
        order, bounds = _instances_by_chunk(walk, self.placement)
        instances = [order[bounds[k] : bounds[k + 1]] for k in range(walk.num_chunks)]
        keys = self._fragment_keys(walk, order, bounds)
        fragments = [
            self._part(key, partial(self._fragment, walk, k, instances[k]))
            for k, key in enumerate(keys)
        ]
        named = np.zeros(self.placement.num_instances, dtype=np.int64)
        for k, fragment in enumerate(fragments):
            named[instances[k]] = fragment.instance_task + part_offset(k)
        crossings = [
            self._part(
                None
                if keys[c.chunk] is None
                else (c.reads[0][0], keys[c.chunk], *(keys[r] for r in c.readers)),
                partial(self._crossing, c, fragments, named),
            )
            for c in walk.crossings
        ]
        return fragments + crossings, instances

    def _splice(self, parts: list[_Part], instances: list[np.ndarray]) -> None:
        """The task graph of ``parts`` (fragments first, one per chunk of ``instances``),
        renumbered."""
        self._forget()
        self.out, first_task, _ = TaskBuilder.spliced(
            self.fixed.cluster.num_devices, [p.tasks for p in parts]
        )
        self._first = first_task
        for k, chunk in enumerate(instances):
            self.instance_task[chunk] = parts[k].instance_task + first_task[k]
        for p, part in enumerate(parts):
            if part.collectives:
                tasks = self._numbers([c.task for c in part.collectives], p)
                self.collectives.extend(
                    c._replace(task=t, part=p) for c, t in zip(part.collectives, tasks, strict=True)
                )
            if part.transfer_flows:
                tasks = self._numbers([t for t, _ in part.transfer_flows], p)
                self.transfer_flows.update(
                    zip(tasks, (flows for _, flows in part.transfer_flows), strict=True)
                )
        origin = self.out.origin  # the AllReduces in the order of the ops that read them
        self.collectives.sort(key=lambda c: origin[c.task])

    def _numbers(self, numbers: Sequence[int], part: int) -> list[int]:
        """The task numbers ``numbers`` of spliced part ``part`` take in the task graph
        (:func:`~.task_builder.renumbered`)."""
        first = self._first
        return renumbered(np.asarray(numbers, dtype=np.int64), first[part], first).tolist()

    def _control_edges(self, instance_task: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(pred, succ)`` task arrays: every instance of an op waits for every instance
        of each of its control predecessors (micro-batched pairs: for the instances of
        its rows, :func:`~.pipeline.control_pairs`).

        An op whose control predecessors have ``p`` instances in all and which has ``s``
        of its own would need ``p * s`` edges (a million at 32 GPUs for a ResNet): where
        that is more than ``p + s``, the instances wait for one zero-time barrier task
        that waits for the ``p``, which holds nothing and so starts the moment the last of
        them finishes: the same schedule with ``p + s`` edges.
        """
        ir, ptr = self.fixed.ir, self.placement.inst_ptr.astype(np.int64)
        # counted per GPU, so that a graph compiled by class gates the same ops
        members = np.asarray(self.members, dtype=np.int64)[self.placement.inst_device]
        op_of = np.repeat(np.arange(ir.num_ops), np.diff(ptr))
        count = np.bincount(op_of, weights=members, minlength=ir.num_ops).astype(np.int64)
        succ_op = np.repeat(np.arange(ir.num_ops), np.diff(ir.control_ptr))
        pred_op = ir.control_pred.astype(np.int64)
        micro = np.array(self.micro_batched, dtype=bool)
        by_rows = micro[pred_op]
        first_rows = first_micro_batch_rows(self.resolved, self.batch)
        preds, succs = [], []
        for p, q in zip(pred_op[by_rows].tolist(), succ_op[by_rows].tolist(), strict=True):
            whole = None if micro[q] else first_rows
            pred_inst, succ_inst = control_pairs(self.placement, p, q, whole)
            preds.append(instance_task[pred_inst].astype(np.int64))
            succs.append(instance_task[succ_inst].astype(np.int64))
        succ_op, pred_op = succ_op[~by_rows], pred_op[~by_rows]
        waited = np.bincount(succ_op, weights=count[pred_op], minlength=ir.num_ops)
        gated = waited * count > waited + count
        pred_inst, succ_inst = _all_pairs(ptr, pred_op, succ_op, ~gated[succ_op])
        preds.append(instance_task[pred_inst].astype(np.int64))
        succs.append(instance_task[succ_inst].astype(np.int64))
        barriers = self._control_barriers(ptr, pred_op, succ_op, gated, instance_task)
        pred, succ = np.concatenate(preds), np.concatenate(succs)
        return np.concatenate([pred, barriers[0]]), np.concatenate([succ, barriers[1]])

    def _control_barriers(
        self,
        ptr: np.ndarray,
        pred_op: np.ndarray,
        succ_op: np.ndarray,
        gated: np.ndarray,
        instance_task: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """One barrier task per ``gated`` op (:meth:`_control_edges`): its edges from the
        instances of the op's control predecessors (``pred_op`` -> ``succ_op``, grouped
        by ``succ_op``), then to the op's own instances, op by op."""
        ops = np.flatnonzero(gated)
        names = self.fixed.ir.op_names
        first = self.out.zero_time_tasks(
            TRANSFER,
            [-1] * len(ops),
            [self.op_group[op] for op in ops.tolist()],
            [f"{names[op]}/control_barrier" for op in ops.tolist()],
        )
        barrier_of = np.zeros(len(gated), dtype=np.int64)
        barrier_of[ops] = first + np.arange(len(ops))
        waiting = gated[succ_op]
        waits, counts = row_ranges(ptr, pred_op[waiting])
        waiter = np.repeat(succ_op[waiting], counts)
        released, counts = row_ranges(ptr, ops)
        releaser = np.repeat(ops, counts)
        order = np.argsort(  # op by op, its waits before its releases, stable
            np.concatenate([2 * waiter, 2 * releaser + 1]), kind="stable"
        )
        pred = np.concatenate([instance_task[waits], barrier_of[releaser]])
        succ = np.concatenate([barrier_of[waiter], instance_task[released]])
        return pred[order].astype(np.int64), succ[order].astype(np.int64)

    def _persistent_bytes(self) -> np.ndarray:
        """Variable bytes resident on each device: every instance of a variable holds them."""
        ir, placement = self.fixed.ir, self.placement
        op_of_instance = np.repeat(np.arange(ir.num_ops), np.diff(placement.inst_ptr))
        held = ir.variable_bytes[op_of_instance]
        persistent = np.zeros(self.fixed.cluster.num_devices, dtype=np.int64)
        np.add.at(persistent, placement.inst_device[held > 0], held[held > 0])
        return persistent

    def compile(self) -> CompiledTasks:
        # a pipeline that cannot run is refused before anything is compiled
        barriers = phase_barriers(self.fixed.ir, self.resolved, self.placement)
        self._splice(*self._parts())
        fixed = self.fixed
        self.out.made_for = fixed.ir.num_ops  # what follows is made for no op: last in ties
        self._schedule_collectives()
        instance_task = self.instance_task
        for name, waits, releases in barriers:
            group = self.op_group[
                int(np.searchsorted(self.placement.inst_ptr, releases[0], "right")) - 1
            ]
            _barrier(
                self.out,
                name,
                group,
                frozenset(instance_task[waits].tolist()),
                instance_task[releases].tolist(),
            )
        graph, number = self.out.build(
            self._persistent_bytes(),
            fixed.links.num_links,
            fixed.device_names,
            fixed.links.names,
            self._control_edges(instance_task),
        )
        instance_task = number[instance_task].astype(np.int32)
        measured = self._compute_seconds(instance_task, graph.task_duration_s)
        copies = None
        if self.symmetry is not None:  # a compute task stands for its class's members
            members = self.symmetry.members[np.maximum(graph.task_device, 0)]
            copies = np.where(graph.task_kind == COMPUTE, members, 1).astype(np.float64)
            flows = self.transfer_flows
            copies[number[np.array(list(flows), dtype=np.int64)]] = list(flows.values())
        return CompiledTasks(graph, self.placement, instance_task, measured, self.symmetry, copies)


_NO_TASKS = np.zeros(0, dtype=np.int64)
_COLLECTIVE_CODE = {c: i for i, c in enumerate(Collective)}  # in fragments' keys


def _by_tensor(
    kept: dict[tuple[int, int, int, int], _Copy], tensors: frozenset[int]
) -> dict[int, tuple[tuple[tuple[int, int, int, int], _Copy], ...]]:
    """The entries of ``kept`` (keyed by tensor first) of each of ``tensors``."""
    found: dict[int, list] = {t: [] for t in tensors}
    for item in kept.items():
        if item[0][0] in found:
            found[item[0][0]].append(item)
    return {t: tuple(items) for t, items in found.items()}


def _part_bytes(part: _Part | Asymmetric) -> int:
    """About the memory ``part`` holds: its columns, its tasks' names, what it exports."""
    if isinstance(part, Asymmetric):
        return 0
    tasks = part.tasks
    columns = sum(map(len, tasks.plain.values())) + sum(a.nbytes for a in tasks.numbers.values())
    copies = sum(
        len(e.copies) + len(e.cache) + len(e.partials) + len(e.hub_pieces) + len(e.replica_values)
        for e in part.exported.values()
    )
    return (
        columns + _NAME_BYTES * tasks.num_tasks + _COPY_BYTES * copies + part.instance_task.nbytes
    )


def _instances_by_chunk(walk: Walk, placement: Placement) -> tuple[np.ndarray, np.ndarray]:
    """The instances of ``placement`` in the order of ``walk`` (its ops chunk by chunk,
    each op's instances in order), and where each chunk's start (one more at the end)."""
    ptr = placement.inst_ptr.astype(np.int64)
    counts = np.diff(ptr)[walk.op_order]
    ends = np.cumsum(counts)
    instances = np.repeat(ptr[walk.op_order] - (ends - counts), counts)
    instances += np.arange(len(instances))
    return instances, np.concatenate(([0], ends))[walk.op_bounds]


def _all_pairs(
    ptr: np.ndarray, pred_op: np.ndarray, succ_op: np.ndarray, keep: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Instance pairs ``(i, j)`` of every kept op pair: ``i`` of the pred op, ``j`` of the
    succ op, instances numbered by ``ptr``."""
    pred_op, succ_op = pred_op[keep], succ_op[keep]
    pred_count, succ_count = np.diff(ptr)[pred_op], np.diff(ptr)[succ_op]
    sizes = pred_count * succ_count
    block = np.repeat(np.arange(len(sizes)), sizes)
    within = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    width = succ_count[block]
    return ptr[pred_op][block] + within // width, ptr[succ_op][block] + within % width


def _ring_latency_s(seconds: float, members: tuple[int, ...], nbytes: int, rate: float) -> float:
    """The latency part of a ring AllReduce of ``nbytes`` among ``members`` lasting
    ``seconds`` (:mod:`.links`)."""
    return latency_part_s(seconds, ring_bytes_per_link(len(members), nbytes) / rate)


def _barrier(
    out: TaskBuilder, name: str, group: int, waits_for: frozenset[int], releases: list[int]
) -> None:
    """A zero-time task that ``releases`` wait for and that waits for ``waits_for``."""
    task = out.task(TRANSFER, -1, 0.0, group, name)
    for pred in waits_for:
        out.edge(pred, task)
    for succ in releases:
        out.edge(task, succ)


def compile_tasks(
    ir: GraphIR,
    cluster: Cluster,
    resolved: ResolvedStrategy,
    *,
    costs: OpCostModel,
    comm: CommModel | None = None,
) -> CompiledTasks:
    """Compile a resolved strategy into the simulator's task graph (once; to compile many
    strategies of one graph, keep a :class:`TaskCompiler`)."""
    return TaskCompiler(ir, cluster, costs=costs, comm=comm).compile(resolved)
