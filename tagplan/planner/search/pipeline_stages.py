"""Pipelined strategies for a graph and a cluster: where to cut the model into stages, on
which GPUs each stage runs, and how many micro-batches flow through them.

**Units.** A stage runs on a *unit* of the allocation: a machine (all its GPUs, data
parallel inside the stage: a pipeline's stages cross the slow links between machines,
while the gradients of a stage stay on fast ones); on a single machine, a device group;
on a single device group, a GPU. Consecutive units may be merged into one stage, so ``p``
stages can be any count from 2 to the number of units.

**Cuts** (:func:`~.stage_cuts.op_stages`): where the model is cut, in proportion to the
stages' speeds, and which stage every other op follows. A weight that ops of several
stages read (a tied embedding) becomes a group of its own outside the stages, mirrored on
their GPUs, so no step sends the weight; its gradient is summed where the stages'
contributions meet and copied to every mirror (:func:`_pipelined`).

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

import numpy as np

from tagplan.planner.compile.pipeline import forward_ops
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.search.grouping import cluster_mean_op_time_s
from tagplan.planner.search.stage_cuts import op_stages, variable_atoms
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
    "pipeline_baseline",
    "pipeline_layouts",
    "stage_units",
]

_CUT_SLACK = 0.3  # how far from the balanced point tagplan moves a cut, in stage shares


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


def _shared_weights(ir: GraphIR, op_stage: np.ndarray) -> dict[int, frozenset[int]]:
    """Atoms holding a variable that ops of several stages read (a tied embedding: the
    input lookup in the first stage, the output projection in the last), with those
    stages."""
    atoms, holds = variable_atoms(ir)
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
    atoms, _ = variable_atoms(ir)
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
