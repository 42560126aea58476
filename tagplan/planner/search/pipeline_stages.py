"""Pipelined strategies for a graph and a cluster: where to cut the model into stages, on
which GPUs each stage runs, and how many micro-batches flow through them.

**Units.** A stage runs on a *unit* of the allocation: a machine (all its GPUs, data
parallel inside the stage: a pipeline's stages cross the slow links between machines,
while the gradients of a stage stay on fast ones); on a single machine, a device group;
on a single device group, a GPU. Consecutive units may be merged into one stage, so ``p``
stages can be any count from 2 to the number of units.

**Cuts** (:func:`op_stages`). The forward ops that will run per micro-batch (splittable,
reading batch data) are taken in topological order and cut into ``p`` runs whose compute
times are in proportion to ``shares`` (each stage's aggregate GPU speed for tagplan's
candidates, equal shares for the hand-configured baseline); a prefix of a topological
order never feeds an earlier run, so the forward pass goes stage by stage. tagplan moves
each cut, within a window of ``slack`` of the smaller neighbouring stage's share, to
where the fewest activation bytes cross it (the bytes every micro-batch sends forward
and its gradient sends back: VGG19's two stages split after a pooling, before block 3,
rather than inside block 3); the baseline cuts where the compute is balanced. Every
other op follows its neighbours: a forward op without batch input (a weight read) the
first stage that reads it; a backward op the latest stage among the outputs of
micro-batched forward ops it reads (its layer's activations and saved batch statistics,
not a mask every later layer reads), or, reading gradients only, the earliest stage they
come from (a second set of candidates puts every backward op with the earliest stage of
the batch data it reads); what reads nothing staged the first stage that reads it; and
the ops TensorFlow must colocate (a variable, its reads, slots and update) the earliest
stage among their forward ops (the layer that reads the weight). A weight that ops of
several stages read (a tied embedding) becomes a group of its own outside the stages,
mirrored on their GPUs, so no step sends the weight; its gradient is summed where the
stages' contributions meet and copied to every mirror (:func:`_pipelined`).

**Layouts** (:func:`pipeline_layouts`): for 2, 4, 8 and as many stages as units,
every unit merged into that many stages, or that many of the fastest units alone (a
pipeline over part of the allocation, as the search's actions use part of it); shares by
speed, each with both sets of backward cuts where they differ. A layout leaves two
choices to the search (:mod:`.layout_branches`): ``m`` in ``{p, 2p, 4p}`` micro-batches
(GPipe §3: ``m >= 4p`` makes the bubble negligible) up to what keeps every GPU of a
stage a row per micro-batch, and each stage's gradient synchronization; stages run 1F1B
(the same bubble as GPipe with fewer activations alive). The ``pipeline`` baseline
(:func:`pipeline_baseline`) is what a user configures by hand: one stage per unit, equal
compute per stage, ``m = 4p``, 1F1B, AllReduce in every stage.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tagplan.planner.compile.pipeline import forward_ops
from tagplan.planner.compile.placement import has_batch_input
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.batch import Aggregation, SplitCategory
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.search.grouping import atoms_of, cluster_mean_op_time_s
from tagplan.planner.strategy import (
    GroupDecision,
    OpGroup,
    Option,
    Pipeline,
    Schedule,
    Strategy,
)
from tagplan.planner.topology import Cluster

__all__ = [
    "StageLayout",
    "device_speed",
    "op_stages",
    "pipeline_baseline",
    "pipeline_layouts",
    "stage_units",
]

_CUT_SLACK = 0.3  # how far from the balanced point tagplan moves a cut, in stage shares
_SETTLE_SWEEPS = 4  # label-propagation sweeps over the backward ops


def stage_units(cluster: Cluster) -> list[np.ndarray]:
    """The GPUs of each unit a stage can run on, in cluster order (module docstring)."""
    if cluster.num_machines > 1:
        return [cluster.machine_devices(m) for m in range(cluster.num_machines)]
    if cluster.num_groups > 1:
        return [cluster.group_devices(g) for g in range(cluster.num_groups)]
    return [np.array([d]) for d in range(cluster.num_devices)]


def _stage_decision(
    cluster: Cluster, gpus: np.ndarray, speed: np.ndarray, sync: Option
) -> GroupDecision:
    """Data parallelism over ``gpus`` with gradient synchronization ``sync``: their device
    groups, none of the other GPUs of those groups, batch shares by speed when their types
    differ."""
    groups = sorted({int(g) for g in cluster.group_of_device[gpus].tolist()})
    members = set(gpus.tolist())
    names = cluster.device_names
    left_out = {
        str(names[d]): 0
        for g in groups
        for d in cluster.group_devices(g).tolist()
        if d not in members
    }
    mixed = len({int(t) for t in cluster.device_type[gpus].tolist()}) > 1
    weights = {str(names[d]): float(speed[d]) for d in gpus.tolist()} if mixed else None
    return GroupDecision(
        device_groups=groups,
        option=sync,
        replicas=left_out or None,
        batch_weights=weights,
    )


def op_stages(
    ir: GraphIR,
    op_time_s: np.ndarray,
    shares: np.ndarray,
    *,
    slack: float = 0.0,
    by_layer: bool = True,
) -> np.ndarray:
    """Each op's stage (``0 .. len(shares) - 1``) by the cuts of the module docstring."""
    num_stages = len(shares)
    graph = _stage_graph(ir)
    ops = graph.cut_ops
    stage = np.full(ir.num_ops, -1, dtype=np.int64)
    seconds = op_time_s[ops]
    total = float(seconds.sum())
    done = np.cumsum(seconds) / total if total > 0 else np.zeros(len(ops))  # after op k
    fractions = shares / shares.sum()
    stage[ops] = 0
    for boundary, target in enumerate(np.cumsum(fractions)[:-1].tolist()):
        window = slack * min(fractions[boundary], fractions[boundary + 1])
        before = done - seconds / total / 2 if total > 0 else done  # an op's middle
        allowed = np.flatnonzero(np.abs(before - target) <= window)
        first = int(np.searchsorted(before, target, side="right"))  # the balanced cut
        if len(allowed):
            first = int(allowed[np.argmin(graph.crossing[allowed])])  # the first of equals
        stage[ops[first:]] = boundary + 1
    staged: list[int] = stage.tolist()
    readers = graph.readers
    for op in graph.cut_list[::-1]:  # a shape is taken where it is read
        if graph.makes_shapes[op]:
            staged[op] = _first_reader(staged, readers[op], default=staged[op])
    for op in graph.forward_list[::-1]:  # forward ops without batch: first reader
        if staged[op] < 0:
            staged[op] = _first_reader(staged, readers[op], default=-1)
    activations = graph.cut_mask if by_layer else [False] * ir.num_ops
    for op in range(ir.num_ops):  # backward ops: with the activations of their layer
        if staged[op] < 0:
            staged[op] = _backward_stage(graph, staged, activations, op)
    for op in range(ir.num_ops - 1, -1, -1):  # reading nothing staged: first reader
        if staged[op] < 0:
            staged[op] = _first_reader(staged, readers[op], default=num_stages - 1)
    _settle_backward(graph, staged)
    stage = np.asarray(staged, dtype=np.int64)
    atoms, _ = _variable_atoms(ir)  # with the earliest forward op among them, else the earliest
    count = int(atoms.max()) + 1
    earliest = np.full(count, num_stages, dtype=np.int64)
    np.minimum.at(earliest, atoms, stage)
    forward = graph.forward
    forward_first = np.full(count, num_stages, dtype=np.int64)
    np.minimum.at(forward_first, atoms[forward], stage[forward])
    chosen = np.where(forward_first < num_stages, forward_first, earliest)
    return chosen[atoms]


def _first_reader(stage: list[int], readers: list[int], *, default: int) -> int:
    """The earliest stage among ``readers`` already staged, else ``default``."""
    return min((stage[r] for r in readers if stage[r] >= 0), default=default)


@lru_cache(maxsize=8)
def _variable_atoms(ir: GraphIR) -> tuple[np.ndarray, np.ndarray]:
    """Each op's atom (:func:`~.grouping.atoms_of`) and, per atom, whether it holds a
    variable."""
    atoms = atoms_of(ir)
    holds = np.zeros(int(atoms.max()) + 1, dtype=bool)
    holds[atoms[ir.variable_bytes > 0]] = True
    return atoms, holds


@dataclass(frozen=True, eq=False)
class _StageGraph:
    """What the cuts walk of one graph, the same for every layout: the forward ops and
    the micro-batched ones among them (``cut_*``, in topological order, with the bytes
    a cut before each crosses), per op its readers, the producers of its inputs and
    whether each input is a replica's shape (``shape_inputs``) or batch data
    (``data_inputs``), whether it makes shapes only; per tensor its bytes, producer and
    readers; and the backward ops that label propagation may move. Python lists: the
    walks visit ops one by one."""

    forward: np.ndarray  # bool per op
    forward_list: list[int]
    cut_ops: np.ndarray
    cut_list: list[int]
    cut_mask: list[bool]
    crossing: np.ndarray
    readers: list[list[int]]
    producers: list[list[int]]
    shape_inputs: list[list[bool]]
    data_inputs: list[list[bool]]
    makes_shapes: list[bool]
    inputs: list[list[int]]
    outputs: list[range]
    tensor_bytes: list[int]
    tensor_producer: list[int]
    consumers: list[list[int]]
    movable_list: list[int]
    movable_readers: list[list[int]]  # per op, the movable ops reading its outputs
    movable_producers: list[list[int]]  # per op, the movable ops making its inputs


@lru_cache(maxsize=8)
def _stage_graph(ir: GraphIR) -> _StageGraph:
    forward = forward_ops(ir)
    cut = forward & has_batch_input(ir) & (ir.split_category != SplitCategory.NONE)
    cut_ops = np.flatnonzero(cut)
    producer = ir.tensor_producer.tolist()
    shape = (ir.tensor_aggregation == Aggregation.LOCAL).tolist()
    carries = (ir.tensor_batch_axis >= 0).tolist()
    inputs = ir.input_lists
    outputs = [ir.outputs(op) for op in range(ir.num_ops)]
    movable = _movable(ir, forward).tolist()
    readers = _readers(ir)
    producers = [[producer[t] for t in tensors] for tensors in inputs]
    return _StageGraph(
        forward=forward,
        forward_list=np.flatnonzero(forward).tolist(),
        cut_ops=cut_ops,
        cut_list=cut_ops.tolist(),
        cut_mask=cut.tolist(),
        crossing=_crossing_bytes(ir, cut_ops),
        readers=readers,
        producers=producers,
        shape_inputs=[[shape[t] for t in tensors] for tensors in inputs],
        data_inputs=[[carries[t] for t in tensors] for tensors in inputs],
        makes_shapes=[len(out) > 0 and all(shape[t] for t in out) for out in outputs],
        inputs=inputs,
        outputs=outputs,
        tensor_bytes=ir.tensor_bytes.tolist(),
        tensor_producer=producer,
        consumers=[ir.consumers(t).tolist() for t in range(ir.num_tensors)],
        movable_list=[op for op in range(ir.num_ops) if movable[op]],
        movable_readers=[[r for r in found if movable[r]] for found in readers],
        movable_producers=[[p for p in found if movable[p]] for found in producers],
    )


def _movable(ir: GraphIR, forward: np.ndarray) -> np.ndarray:
    """The backward ops label propagation may move (:func:`_settle_backward`): not those
    holding or next to per-replica values (statistics, shapes), nor ops colocated with a
    variable."""
    atoms, holds = _variable_atoms(ir)
    per_replica = np.isin(ir.tensor_aggregation, (Aggregation.MEAN, Aggregation.LOCAL))
    reads_value = np.zeros(ir.num_ops, dtype=bool)
    reader = ir.input_reader
    reads_value[reader[per_replica[ir.op_input_tensor]]] = True
    makes_value = np.zeros(ir.num_ops, dtype=bool)
    makes_value[ir.tensor_producer[per_replica]] = True
    return ~forward & ~holds[atoms] & ~reads_value & ~makes_value


def _settle_backward(graph: _StageGraph, stage: list[int]) -> None:
    """Move backward ops, a few sweeps over them, to the stage among their neighbours'
    that the fewest bytes of their inputs and outputs cross to (label propagation): a
    gradient that only reads gradients joins the stage of the layer it flows into
    rather than staying where it came from. Only the movable ops move (:func:`_movable`)."""
    nbytes, producer, consumers = graph.tensor_bytes, graph.tensor_producer, graph.consumers
    for _ in range(_SETTLE_SWEEPS):
        moved = 0
        for op in graph.movable_list:
            cost: dict[int, float] = {}
            inputs = graph.inputs[op]
            for tensor in inputs:
                where = stage[producer[tensor]]
                cost[where] = cost.get(where, 0.0) + nbytes[tensor]
            outputs = graph.outputs[op]
            for tensor in outputs:
                for where in {stage[c] for c in consumers[tensor]}:
                    cost[where] = cost.get(where, 0.0) + nbytes[tensor]
            # the backward pass goes stage by stage back: not below what it feeds,
            # not above the gradients it reads
            low = max((stage[c] for c in graph.movable_readers[op]), default=0)
            high = min((stage[p] for p in graph.movable_producers[op]), default=1 << 30)
            cost = {s: c for s, c in cost.items() if low <= s <= high}
            if not cost:
                continue
            total = sum(cost.values())
            current = stage[op]
            best = max(cost, key=lambda s: (cost[s], s == current))  # the most bytes kept
            if best != current and total - cost[best] < total - cost.get(current, 0.0):
                stage[op] = best
                moved += 1
        if not moved:
            break


def _backward_stage(graph: _StageGraph, stage: list[int], activations: list[bool], op: int) -> int:
    """The stage of an op outside the forward pass: where the replica shapes it reads were
    taken; else the latest stage among the outputs of micro-batched forward ops it reads
    (``activations`` marks those ops; its layer's activations and saved statistics, which
    must be read where they were made, not a mask or an encoder output every later stage
    reads); without any, the earliest among the batch data it reads (gradients coming
    back), else among all it reads; -1 when nothing it reads is staged yet."""
    producers = graph.producers[op]
    shapes = [
        stage[p] for p, is_shape in zip(producers, graph.shape_inputs[op], strict=True) if is_shape
    ]
    if shapes and max(shapes) >= 0:  # a replica's shape is read where it was taken
        return max(shapes)
    made = [stage[p] for p in producers if activations[p]]
    if made and max(made) >= 0:
        return max(made)
    data = [
        stage[p] for p, is_data in zip(producers, graph.data_inputs[op], strict=True) if is_data
    ]
    for staged in (data, [stage[p] for p in producers]):
        found = [s for s in staged if s >= 0]
        if found:
            return min(found)
    return -1


def _crossing_bytes(ir: GraphIR, ops: np.ndarray) -> np.ndarray:
    """``crossing[k]``: bytes of the outputs of ``ops[:k]`` that ``ops[k:]`` read (a cut
    before position ``k``)."""
    position = np.full(ir.num_ops, -1, dtype=np.int64)
    position[ops] = np.arange(len(ops))
    change = np.zeros(len(ops) + 1)
    for k, op in enumerate(ops.tolist()):
        for tensor in ir.outputs(op):
            readers = position[ir.consumers(tensor)]
            last = int(readers.max()) if len(readers) else -1
            if last > k:
                change[k + 1] += float(ir.tensor_bytes[tensor])
                change[last + 1] -= float(ir.tensor_bytes[tensor])
    return np.cumsum(change)[: len(ops)]


def _readers(ir: GraphIR) -> list[list[int]]:
    """Per op, the ops reading any of its outputs."""
    found: list[list[int]] = [[] for _ in range(ir.num_ops)]
    reader = ir.input_reader.tolist()
    for op, tensor in zip(reader, ir.op_input_tensor.tolist(), strict=True):
        found[int(ir.tensor_producer[tensor])].append(op)
    return found


def _shared_weights(ir: GraphIR, op_stage: np.ndarray) -> dict[int, frozenset[int]]:
    """Atoms holding a variable that ops of several stages read (a tied embedding: the
    input lookup in the first stage, the output projection in the last), with those
    stages."""
    atoms, holds = _variable_atoms(ir)
    reader = ir.input_reader
    producer = ir.tensor_producer[ir.op_input_tensor]
    forward = forward_ops(ir)  # the layers using it, not a gradient placed elsewhere
    outside = holds[atoms[producer]] & (atoms[producer] != atoms[reader]) & forward[reader]
    stages: dict[int, set[int]] = {}
    for atom, stage in zip(
        atoms[producer[outside]].tolist(), op_stage[reader[outside]].tolist(), strict=True
    ):
        stages.setdefault(atom, set()).add(stage)
    return {atom: frozenset(s) for atom, s in stages.items() if len(s) > 1}


def _pipelined(
    ir: GraphIR,
    cluster: Cluster,
    stage_gpus: Sequence[np.ndarray],
    op_stage: np.ndarray,
    speed: np.ndarray,
    micro_batches: int,
    name: str,
    sync: Sequence[Option] | None = None,
) -> Strategy:
    """The strategy: a replicated group per stage, stage ``s`` synchronizing its gradients
    by ``sync[s]`` (AllReduce when not given); a weight several stages read is a group of
    its own mirrored on all their GPUs (as Megatron-LM keeps a tied embedding on its first
    and last stage), outside the stages, its gradient AllReduced."""
    sync = sync or [Option.REPLICATE_ALLREDUCE] * len(stage_gpus)
    shared = _shared_weights(ir, op_stage)
    atoms, _ = _variable_atoms(ir)
    apart = np.isin(atoms, list(shared))
    stage_of = np.where(apart, -1, op_stage)
    kept = [
        OpGroup(
            ops=[ir.op_names[o] for o in np.flatnonzero(stage_of == s).tolist()],
            decision=_stage_decision(cluster, gpus, speed, sync[s]),
        )
        for s, gpus in enumerate(stage_gpus)
        if (stage_of == s).any()
    ]
    pipeline = Pipeline(
        stages=[[s] for s in range(len(kept))],
        micro_batches=micro_batches,
        schedule=Schedule.ONE_F_ONE_B,
    )
    by_stages: dict[frozenset[int], list[int]] = {}
    for atom, stages in shared.items():
        by_stages.setdefault(stages, []).append(atom)
    for stages, members in sorted(by_stages.items(), key=lambda kv: sorted(kv[0])):
        gpus = np.concatenate([stage_gpus[s] for s in sorted(stages)])
        ops = np.flatnonzero(np.isin(atoms, members))
        decision = _stage_decision(cluster, gpus, speed, Option.REPLICATE_ALLREDUCE)
        kept.append(OpGroup(ops=[ir.op_names[o] for o in ops.tolist()], decision=decision))
    return Strategy(name=name, groups=kept, pipeline=pipeline)


def _merged(units: list[np.ndarray], count: int) -> list[np.ndarray]:
    """``units`` merged into ``count`` runs of consecutive units, as even as possible."""
    bounds = np.linspace(0, len(units), count + 1).round().astype(int)
    return [np.concatenate(units[a:b]) for a, b in itertools.pairwise(bounds)]


def _micro_batch_limit(ir: GraphIR, stage_gpus: Sequence[np.ndarray]) -> int:
    """The most micro-batches that leave every GPU of every stage a row of each."""
    return max(1, ir.batch_size // max(len(gpus) for gpus in stage_gpus))


def device_speed(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> np.ndarray:
    """Each GPU's speed on the model: 1 / its step time at an even share of the batch."""
    local = max(1, ir.batch_size // cluster.num_devices)
    by_type = {
        t: 1.0 / max(costs.op_times(t, local).total_s, 1e-12)
        for t in sorted(set(cluster.device_type.tolist()))
    }
    return np.array([by_type[int(t)] for t in cluster.device_type.tolist()])


def _layouts(units: list[np.ndarray], speed: np.ndarray) -> list[tuple[str, list[np.ndarray]]]:
    """The GPUs of each stage, per layout: every unit merged into ``p`` stages, and the
    ``p`` fastest units alone (in cluster order), for ``p`` of 2, 4, 8 and every unit."""
    counts = sorted({c for c in (2, 4, 8, len(units)) if 2 <= c <= len(units)})
    unit_speed = np.array([speed[gpus].sum() for gpus in units])
    layouts: list[tuple[str, list[np.ndarray]]] = []
    for count in counts:
        layouts.append((f"{count}", _merged(units, count)))
        if count < len(units):
            fastest = np.sort(np.argsort(-unit_speed, kind="stable")[:count])
            layouts.append((f"{count}-fastest", [units[u] for u in fastest.tolist()]))
    return layouts


@dataclass(frozen=True, eq=False)
class StageLayout:
    """One stage partition the search can take: the GPUs of each stage, every op's stage
    and the micro-batch counts it may run (ascending); the search decides the count and
    each stage's gradient synchronization (:meth:`strategy`)."""

    name: str
    stage_gpus: tuple[np.ndarray, ...]
    op_stage: np.ndarray
    micro_batches: tuple[int, ...]

    @property
    def num_stages(self) -> int:
        return len(self.stage_gpus)

    def strategy(
        self,
        ir: GraphIR,
        cluster: Cluster,
        speed: np.ndarray,
        micro_batches: int,
        sync: Sequence[Option] | None = None,
    ) -> Strategy:
        """The pipelined strategy at ``micro_batches``, stage ``s`` synchronizing by
        ``sync[s]`` (AllReduce when not given); ``speed`` is :func:`device_speed`."""
        name = f"{self.name}x{micro_batches}"
        if sync and any(o != Option.REPLICATE_ALLREDUCE for o in sync):
            name += "-" + "".join("p" if o == Option.REPLICATE_PS else "a" for o in sync)
        return _pipelined(
            ir, cluster, self.stage_gpus, self.op_stage, speed, micro_batches, name, sync
        )

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "stage_gpus": [gpus.tolist() for gpus in self.stage_gpus],
            "op_stage": self.op_stage.tolist(),
            "micro_batches": list(self.micro_batches),
        }

    @classmethod
    def from_dict(cls, data: dict) -> StageLayout:
        return cls(
            name=data["name"],
            stage_gpus=tuple(np.asarray(g, dtype=np.int64) for g in data["stage_gpus"]),
            op_stage=np.asarray(data["op_stage"], dtype=np.int64),
            micro_batches=tuple(int(m) for m in data["micro_batches"]),
        )


def pipeline_layouts(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> Iterator[StageLayout]:
    """tagplan's stage layouts for this graph and cluster (module docstring), cut one at a
    time as they are asked for (cutting a large graph takes a fraction of a second per
    layout); none when the graph's loss is unknown or the cluster has a single unit."""
    units = stage_units(cluster)
    if len(units) < 2 or ir.loss_op < 0:
        return
    speed = device_speed(ir, cluster, costs)
    op_time_s = cluster_mean_op_time_s(ir, cluster, costs)
    for label, stage_gpus in _layouts(units, speed):
        count = len(stage_gpus)
        shares = np.array([speed[gpus].sum() for gpus in stage_gpus])
        limit = _micro_batch_limit(ir, stage_gpus)
        micro_batches = tuple(sorted({min(k * count, limit) for k in (1, 2, 4)}))
        cuts: list[np.ndarray] = []
        for by_layer in (True, False):
            op_stage = op_stages(ir, op_time_s, shares, slack=_CUT_SLACK, by_layer=by_layer)
            if any(np.array_equal(op_stage, other) for other in cuts):
                continue
            cuts.append(op_stage)
            name = f"pipeline-{label}{'' if by_layer else '-early'}"
            yield StageLayout(name, tuple(stage_gpus), op_stage, micro_batches)


def pipeline_baseline(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> Strategy:
    """One stage per unit, equal compute per stage, ``4p`` micro-batches, 1F1B; on a
    single unit (or a graph without a known loss) the unit's data parallelism, one
    stage."""
    units = stage_units(cluster)
    speed = device_speed(ir, cluster, costs)
    if len(units) < 2 or ir.loss_op < 0:
        units = [np.arange(cluster.num_devices)]
        op_stage = np.zeros(ir.num_ops, dtype=np.int64)
    else:
        op_time_s = cluster_mean_op_time_s(ir, cluster, costs)
        op_stage = op_stages(ir, op_time_s, np.ones(len(units)))
    micro_batches = min(4 * len(units), _micro_batch_limit(ir, units))
    return _pipelined(ir, cluster, units, op_stage, speed, micro_batches, "pipeline")
