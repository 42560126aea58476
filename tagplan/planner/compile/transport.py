"""The transport planner: how each op instance gets the tensors it reads (TAG §4.3.1),
decided once for both back ends.

The task graph (:mod:`.task_compiler`) and the distributed GraphDef (:mod:`.graphdef`)
apply these rules over the same :class:`~.placement.Placement`, so the simulated and the
executed graph agree instance for instance and auxiliary op for auxiliary op. Each back
end subclasses :class:`TransportRules` and emits what a rule decides through its hooks:
a copy moved to a GPU is a transfer task there and a plain edge here (TensorFlow's
partitioner sends it), a join is a ``Concat`` task or a ``ConcatV2`` node, and so on.
What a back end keeps of a copy (a task and its buffer, a node's output) is its own; the
rules look only at where a copy is, its rows and its kind.

The rules, for a reader on ``device``:

* **whole tensor** (:meth:`TransportRules._full`): a whole copy already there; else the
  closest whole copy (same GPU, then same machine, then the lowest GPU id) moved there;
  else the partial results summed (:meth:`~TransportRules._reduce`); else the slices
  joined there;
* **rows of a batch tensor** (:meth:`~TransportRules._slice`): those rows already there or
  a piece holding exactly them, moved; else the adjacent pieces that cover them, joined and
  cut; else a whole copy where the reader is, cut there; else the hub (the first GPU
  holding a whole copy, else the first producer) cuts the rows of every instance of the
  reader it serves in one split (:meth:`~TransportRules._split_on_hub`), and each piece
  is moved;
* **partial results** (:meth:`~TransportRules._reduce`): one AllReduce when every GPU
  holding a partial reads the sum (mirrored parameter updates); otherwise, micro-batches'
  partial sums added up on their GPU first (gradient accumulation), then one sum where
  it is read.

Every new whole copy and slice is remembered (``cache``) so later readers fetch it
instead of rebuilding it. What an instance publishes of each output is decided here too
(:func:`published_rows`: the whole tensor, its rows, a partial sum or a per-replica
value), and, once every op is placed, when the gradients' AllReduces run
(:meth:`TransportRules._schedule_collectives`: each op group's gradient-sync mode).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Generic, Protocol, TypeVar

from tagplan.planner.compile.buckets import Bucket, GradientAllReduce, gradient_buckets
from tagplan.planner.compile.covering import covering_pieces
from tagplan.planner.compile.placement import Placement
from tagplan.planner.graph.batch import Aggregation
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.strategy import GradientSync, ResolvedStrategy

__all__ = [
    "FULL",
    "LOCAL",
    "MEAN",
    "SLICE",
    "SUM",
    "TransportRules",
    "published_rows",
    "split_kinds",
]

# kinds of copies: a whole tensor, rows of it, a partial sum, a per-replica mean (batch
# statistics), a per-replica value read where it is
FULL, SLICE, SUM, MEAN, LOCAL = 0, 1, 2, 3, 4


class Copy(Protocol):
    """What the rules look at in a back end's copy (a ``NamedTuple`` of each back end)."""

    @property
    def device(self) -> int: ...

    @property
    def lo(self) -> int: ...

    @property
    def hi(self) -> int: ...

    @property
    def kind(self) -> int: ...

    def _replace(self, **changes: int): ...


C = TypeVar("C", bound=Copy)

_KIND_OF_AGGREGATION = {Aggregation.SUM: SUM, Aggregation.MEAN: MEAN, Aggregation.LOCAL: LOCAL}


def split_kinds(ir: GraphIR) -> list[int]:
    """Kind of each tensor's copies made by split replicas: partial (sum, mean, the
    replica's own value) by its aggregation, else a slice when it carries the batch."""
    aggregations, axes = ir.tensor_aggregation.tolist(), ir.tensor_batch_axis.tolist()
    return [
        _KIND_OF_AGGREGATION.get(aggregation, SLICE if axis >= 0 else FULL)
        for aggregation, axis in zip(aggregations, axes, strict=True)
    ]


def published_rows(
    split_kind: int, lo: int, hi: int, batch: int, share: int = 1
) -> tuple[int, int, int]:
    """``(kind, lo, hi)`` of the copy an instance at rows ``[lo, hi)`` publishes of a
    tensor whose split copies are of ``split_kind`` (``FULL`` for an instance that is not
    split): the whole tensor when it holds every row (rows shared by the ``share`` GPUs
    of a class count per GPU)."""
    if split_kind == FULL or (split_kind == SLICE and (hi - lo) // share == batch):
        return FULL, 0, batch
    return split_kind, lo, hi


class TransportRules(Generic[C]):
    """The rules of the module docstring over one back end's copies; a back end emits
    through the hooks (the methods that raise :class:`NotImplementedError` here) and may
    refuse a rule (:meth:`_single`, :meth:`_check_covering`). A back end sets what the
    rules read of the strategy:"""

    placement: Placement
    micro_batched: list[bool]  # per op: runs per micro-batch
    tensor_producer: list[int]  # per tensor: its op

    def __init__(
        self,
        resolved: ResolvedStrategy,
        batch: int,
        device_machine: Sequence[int],
    ) -> None:
        self.resolved, self.batch = resolved, batch
        self.device_machine = device_machine
        self._forget_copies()

    def _forget_copies(self) -> None:
        """Start with no copies of any tensor and no AllReduces."""
        self.copies: defaultdict[int, list[C]] = defaultdict(list)  # by tensor
        self.cache: dict[tuple[int, int, int, int], C] = {}  # (tensor, device, lo, hi)
        self.partials: dict[tuple[int, int, int, int], C] = {}  # partial sums, same key
        self.hub_pieces: dict[tuple[int, int, int, int], C] = {}  # cut on a hub, same key
        # per-replica values (batch statistics, shapes) by tensor, then device
        self.replica_values: dict[int, dict[int, list[C]]] = {}
        # the gradients' AllReduces (each with its op group, members and bytes), awaiting
        # their gradient-sync mode
        self.collectives: list = []

    # hooks -------------------------------------------------------------------------------
    def _move(self, tensor: int, copy: C, device: int, reader: int) -> C:
        """``copy`` sent to ``device``, where no such copy is yet."""
        raise NotImplementedError

    def _concat(
        self, tensor: int, pieces: list[C], device: int, lo: int, hi: int, reader: int
    ) -> C:
        """Adjacent ``pieces`` joined on ``device`` into rows ``[lo, hi)``, kept."""
        raise NotImplementedError

    def _cut(self, tensor: int, source: C, lo: int, hi: int, reader: int, members: int) -> C:
        """Rows ``[lo, hi)`` cut out of ``source`` where it is, for ``members`` GPUs of
        one class (1 outside classes), cached there."""
        raise NotImplementedError

    def _split(
        self, tensor: int, source: C, rows: list[tuple[int, int, int]], reader: int
    ) -> list[C]:
        """One op on ``source``'s GPU cutting a piece out of it for each ``(lo, hi,
        members)`` of ``rows`` (rows ``[lo, hi)`` shared by ``members`` GPUs of one
        class), the pieces in that order."""
        raise NotImplementedError

    def _allreduce(
        self, tensor: int, partial: list[C], members: tuple[int, ...], reader: int
    ) -> None:
        """One AllReduce of ``partial`` over ``members``, a whole copy kept on each."""
        raise NotImplementedError

    def _add(self, tensor: int, pieces: list[C], device: int, reader: int, kind: int) -> C:
        """``pieces`` (on ``device``) added up there into a copy of ``kind``."""
        raise NotImplementedError

    def _sum(self, tensor: int, partial: list[C], device: int, reader: int) -> C:
        """The whole tensor on ``device`` from partial results anywhere (not kept)."""
        raise NotImplementedError

    def _after_backward(self, group: int, collectives: list) -> None:
        """``collectives`` (of op group ``group``) wait for every gradient."""
        raise NotImplementedError

    def _fuse(self, bucket: Bucket, collectives: list) -> None:
        """``collectives`` run as one bucket, once the bucket's last gradient is ready."""
        raise NotImplementedError

    def _reader_devices(self, reader: int) -> set[int]:
        """The GPUs ``reader`` has instances on (the back end's ``placement``)."""
        return set(self.placement.devices(reader).tolist())

    def _reader_rows(self, reader: int) -> list[tuple[int, int, int]]:
        """``(device, lo, hi)`` of each instance of ``reader`` (the back end's
        ``placement``)."""
        placement = self.placement
        return [
            (int(placement.inst_device[i]), int(placement.inst_lo[i]), int(placement.inst_hi[i]))
            for i in placement.instances(reader)
        ]

    def _micro_batched(self, tensor: int) -> bool:
        """Whether ``tensor``'s producer runs per micro-batch (the back end's
        ``micro_batched`` per op and ``tensor_producer`` per tensor)."""
        return self.micro_batched[self.tensor_producer[tensor]]

    def _single(self, device: int, rule: str) -> None:
        """A back end that compiles a class of GPUs once refuses ``rule`` on a GPU that
        stands for several (nothing here)."""

    def _check_covering(self, device: int, covering: list[C]) -> None:
        """A back end may refuse to join or cut ``covering``, pieces of another layout, for
        a reader on ``device`` (nothing here)."""

    def _class_size(self, device: int) -> int:
        """The GPUs ``device`` stands for (1: every GPU on its own)."""
        return 1

    # rules -------------------------------------------------------------------------------
    def _local(self, tensor: int, copy: C, device: int, reader: int) -> C:
        """``copy`` on ``device``: itself, a copy of its rows already there, or moved
        there (a tensor crosses to a GPU once)."""
        if copy.device == device:
            return copy
        cached = self.cache.get((tensor, device, copy.lo, copy.hi))
        if cached is not None and copy.kind in (FULL, SLICE):
            return cached
        return self._move(tensor, copy, device, reader)

    def _closest(self, copies: list[C], device: int) -> C:
        machine = self.device_machine
        return min(
            copies,
            key=lambda c: (c.device != device, machine[c.device] != machine[device], c.device),
        )

    def _keep(self, tensor: int, copy: C) -> C:
        """Record a new whole copy so later readers can fetch it instead of rebuilding it."""
        self.copies[tensor].append(copy)
        self.cache[(tensor, copy.device, copy.lo, copy.hi)] = copy
        return copy

    def _full(self, tensor: int, device: int, reader: int) -> C:
        """The whole tensor on ``device``."""
        cached = self.cache.get((tensor, device, 0, self.batch))
        if cached is not None:
            return cached
        copies = self.copies[tensor]
        whole = [c for c in copies if c.kind == FULL] or [c for c in copies if c.kind == LOCAL]
        if whole:
            return self._local(tensor, self._closest(whole, device), device, reader)
        partial = [c for c in copies if c.kind in (SUM, MEAN)]
        if partial:
            return self._reduce(tensor, partial, device, reader)
        self._single(device, "a class gathers a split tensor")  # its first member would
        pieces = sorted((c for c in copies if c.kind == SLICE), key=lambda c: c.lo)
        return self._concat(tensor, pieces, device, 0, self.batch, reader)

    def _reduce(self, tensor: int, partial: list[C], device: int, reader: int) -> C:
        """Sum (or average) partial results: one AllReduce when the readers are copies on
        the partials' GPUs (mirrored parameter updates), otherwise one sum on ``device``."""
        members = tuple(sorted({c.device for c in partial}))
        if len(members) > 1 and self._reader_devices(reader).issuperset(members):
            # readers on GPUs without a replica (more GPUs than examples) then fetch a copy
            self._allreduce(tensor, partial, members, reader)
            return self._full(tensor, device, reader)
        self._single(device, "a class adds up partial sums")
        if self._micro_batched(tensor) and all(piece.kind == SUM for piece in partial):
            partial = self._accumulated(tensor, partial, reader)
            if len(partial) == 1 and partial[0].device == device:  # summed where it is read
                return self._keep(tensor, partial[0]._replace(lo=0, hi=self.batch, kind=FULL))
        return self._keep(tensor, self._sum(tensor, partial, device, reader))

    def _accumulated(self, tensor: int, partial: list[C], reader: int) -> list[C]:
        """Micro-batches' partial sums added up on their GPU before they travel: one
        piece per GPU."""
        by_device: dict[int, list[C]] = {}
        for piece in partial:
            by_device.setdefault(piece.device, []).append(piece)
        return [
            pieces[0] if len(pieces) == 1 else self._add(tensor, pieces, gpu, reader, SUM)
            for gpu, pieces in by_device.items()
        ]

    def _slice(self, tensor: int, device: int, lo: int, hi: int, reader: int) -> C:
        """Rows ``[lo, hi)`` of a batch tensor on ``device``."""
        cached = self.cache.get((tensor, device, lo, hi))
        if cached is not None:
            return cached
        slices = [c for c in self.copies[tensor] if c.kind == SLICE]
        exact = [c for c in slices if (c.lo, c.hi) == (lo, hi)]
        if exact:
            return self._local(tensor, self._closest(exact, device), device, reader)
        whole_here = self.cache.get((tensor, device, 0, self.batch))
        covering = None
        if whole_here is None and slices:
            covering = covering_pieces(slices, lo, hi, lambda c: self._closest(c, device))
        if covering is not None:
            self._check_covering(device, covering)
            if len(covering) > 1:
                first, last = covering[0].lo, covering[-1].hi
                joined = self._concat(tensor, covering, device, first, last, reader)
                if (joined.lo, joined.hi) == (lo, hi):
                    return joined
                covering = [joined]
            piece = self._cut(tensor, covering[0], lo, hi, reader, 1)
            return self._local(tensor, piece, device, reader)
        hub = device if whole_here is not None else self._hub(tensor)
        if hub == device:  # a whole copy here, or made here
            whole = self._full(tensor, device, reader)
            piece = self._cut(tensor, whole, lo, hi, reader, self._class_size(device))
            return self._local(tensor, piece, device, reader)
        piece = self.hub_pieces.get((tensor, hub, lo, hi))
        if piece is None:
            self._split_on_hub(tensor, hub, reader)
            piece = self.hub_pieces[(tensor, hub, lo, hi)]
        return self._local(tensor, piece, device, reader)

    def _split_on_hub(self, tensor: int, hub: int, reader: int) -> None:
        """The rows of every instance of ``reader`` that the hub serves (:meth:`_slice`'s
        last resort, decided per instance as :meth:`_slice` would), cut out of the hub's
        whole copy by one split and kept there (apart from the cache: compiled by class, a
        class's piece may hold every row, as a whole copy does): the pieces are ready
        together, as one ``Split`` makes them, so the members of a class receive theirs
        alike."""
        whole = self._full(tensor, hub, reader)
        cache, batch = self.cache, self.batch
        slices = [c for c in self.copies[tensor] if c.kind == SLICE]
        rows: list[tuple[int, int, int]] = []
        for device, lo, hi in self._reader_rows(reader):
            if (
                device == hub
                or (tensor, device, lo, hi) in cache
                or (tensor, device, 0, batch) in cache
                or (tensor, hub, lo, hi) in self.hub_pieces
                or any((c.lo, c.hi) == (lo, hi) for c in slices)
                or (slices and covering_pieces(slices, lo, hi, lambda c: c[0]) is not None)
            ):
                continue
            rows.append((lo, hi, self._class_size(device)))
        pieces = self._split(tensor, whole, rows, reader)
        for (lo, hi, _), piece in zip(rows, pieces, strict=True):
            self.hub_pieces[(tensor, hub, lo, hi)] = piece

    def _same_replica(self, tensor: int, device: int, lo: int, hi: int) -> C | None:
        """Per-replica batch statistics and shapes are used where they are, as in every
        data-parallel framework: by the same replica (its batch-norm gradient), or by
        whatever runs on that GPU (the update of its mirror of the running averages)."""
        by_device = self.replica_values.get(tensor)
        local = by_device.get(device) if by_device else None
        if not local:
            return None
        exact = [c for c in local if (c.lo, c.hi) == (lo, hi)]
        return (exact or local)[0]

    def _hub(self, tensor: int) -> int:
        """Where a whole copy is made before splitting: the first GPU holding a whole
        copy, else the first producing GPU."""
        whole = [c for c in self.copies[tensor] if c.kind == FULL]
        hub = (whole or self.copies[tensor])[0].device
        self._single(hub, "the hub is a member of a class")
        return hub

    def _schedule_collectives(self) -> None:
        """Apply each op group's gradient-sync mode to the gradients' AllReduces
        (:class:`~tagplan.planner.strategy.GradientSync`), once every op is compiled:
        ``after-backward`` groups' AllReduces wait for every gradient; ``bucketed`` ones are
        fused across groups by :func:`~.buckets.gradient_buckets` (Horovod's tensor
        fusion); ``overlap`` ones start as their gradient is ready."""
        decisions = self.resolved.group_decisions
        collectives = self.collectives
        if all(decisions[c.group].gradient_sync == GradientSync.OVERLAP for c in collectives):
            return
        for group in sorted({c.group for c in collectives}):
            if decisions[group].gradient_sync == GradientSync.AFTER_BACKWARD:
                self._after_backward(group, [c for c in collectives if c.group == group])
        allreduces = [GradientAllReduce(c.group, c.members, c.nbytes) for c in collectives]
        for bucket in gradient_buckets(allreduces, decisions):
            self._fuse(bucket, [collectives[i] for i in bucket.collectives])

    def _record_copies(self, tensor: int, produced: Iterable[C]) -> None:
        """Copies of ``tensor`` that instances produced, where the rules look them up:
        whole copies and slices by their rows (the first of a key wins), partial sums by
        their rows, per-replica values by GPU."""
        copies, cache, partials = self.copies[tensor], self.cache, self.partials
        for copy in produced:
            copies.append(copy)
            kind = copy.kind
            if kind in (FULL, SLICE):
                cache.setdefault((tensor, copy.device, copy.lo, copy.hi), copy)
            elif kind == SUM:
                partials[(tensor, copy.device, copy.lo, copy.hi)] = copy
            else:  # per-replica values (MEAN, LOCAL)
                by_device = self.replica_values.setdefault(tensor, {})
                by_device.setdefault(copy.device, []).append(copy)
