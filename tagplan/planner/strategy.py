"""Deployment strategies (docs/design.md §4, TAG §4.2): what runs where, and how gradients sync.

A strategy assigns every op to an op group and gives each group TAG's decision: the
device groups it uses (the placement row P_i) and one replication option O_i:

* ``replicate-allreduce``: the group is replicated on every GPU of its device groups,
  inputs split in the batch dimension, gradients synchronized by AllReduce;
* ``replicate-ps``: the same, gradients pushed to a parameter server (PS) GPU that
  applies them; replicas pull the parameters (unless named, the PS is chosen round-robin
  among the group's GPUs: the i-th group whose PS is unnamed takes its i-th GPU, so the
  servers spread evenly and a strategy with one such group puts it on the same GPU
  whichever group it is);
* ``duplicate``: the group is copied to every GPU with full inputs; gradients come out
  identical everywhere, so nothing is synchronized (sufficient-factor broadcast, §4.2.3);
* ``model-parallel``: the group's ops are divided among the GPUs, each op on one GPU
  with the full batch.

A strategy may also run its op groups as a **pipeline** (TAG §6's future work, as GPipe
and PipeDream-Flush build it): ``pipeline.stages`` lists op groups per stage, first stage
first, each stage on GPUs of its own; the batch is cut into ``micro_batches`` equal
micro-batches, which flow through the stages in the order ``schedule`` gives each stage
(:mod:`tagplan.planner.compile.pipeline`); a staged group's gradients are accumulated over
the micro-batches before they are synchronized. Inside a stage a group is replicated
(``replicate-allreduce`` or ``replicate-ps``): data parallelism inside the stage.

HeteroG's refinements (§3.4) are optional per group: several replicas per GPU
(``replicas``) or uneven batch shares (``batch_weights``), the collective algorithm, and
for model parallelism an explicit op placement. ``sfb`` maps a parameter to the ops of
its gradient subgraph that are duplicated instead of synchronized (TAG §4.2.3: the
sufficient factors are broadcast, every replica computes the identical gradient).

Strategies are JSON with a schema version. :func:`resolve` checks one against a graph
and a cluster and returns flat arrays for the compiler; any reference to an op, device
group or device that does not exist is refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.model_parallel import (
    model_parallel_placement,
    op_or_none,
    place_explicitly,
)
from tagplan.planner.topology import Cluster
from tagplan.planner.validation import describe_validation_error

__all__ = [
    "SCHEMA_VERSION",
    "Collective",
    "GradientSync",
    "GroupDecision",
    "Mode",
    "OpGroup",
    "Option",
    "Pipeline",
    "ResolvedStrategy",
    "Schedule",
    "Strategy",
    "decision_replicas",
    "layer_ops",
    "load_strategy",
    "resolve",
]

SCHEMA_VERSION = 1


class Option(StrEnum):
    """TAG §4.2's replication options."""

    REPLICATE_ALLREDUCE = "replicate-allreduce"
    REPLICATE_PS = "replicate-ps"
    DUPLICATE = "duplicate"
    MODEL_PARALLEL = "model-parallel"


class Collective(StrEnum):
    """The AllReduce algorithm of a group's gradients (:mod:`~tagplan.planner.cost.comm`):
    ``nccl`` is what NCCL's tuner picks per call (ring or tree, the faster for the size),
    ``auto`` the fastest of ring, hierarchical and tree."""

    RING = "ring"
    HIERARCHICAL = "hierarchical"
    TREE = "tree"
    NCCL = "nccl"
    AUTO = "auto"


class GradientSync(StrEnum):
    """When a group's gradient AllReduces run.

    ``overlap``: each as soon as its gradient is ready, overlapping the rest of the
    backward pass; ``after-backward``: all after the whole backward pass (in-graph data
    parallelism as TAG's DP-NCCL baseline); ``bucketed``: fused into buckets that start
    when their last gradient is ready (Horovod's tensor fusion, overlapped with backward).

    Buckets are shared across op groups: the AllReduces of every ``bucketed`` group that
    reduce over the same GPUs with the same ``collective`` algorithm fill one bucket in
    the order their gradients become ready, and a bucket closes once it holds at least
    ``bucket_bytes`` — the smallest ``bucket_bytes`` of the groups in it
    (:mod:`tagplan.planner.compile.buckets`).
    """

    OVERLAP = "overlap"
    AFTER_BACKWARD = "after-backward"
    BUCKETED = "bucketed"


class GroupDecision(BaseModel):
    """TAG's (P_i, O_i) for one op group, with HeteroG's optional refinements."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_groups: list[int] = Field(min_length=1)
    option: Option
    replicas: dict[str, int] | None = None  # device name -> replicas on it (>= 0)
    batch_weights: dict[str, float] | None = None  # device name -> share of the batch
    collective: Collective = Collective.AUTO
    ps_device: str | None = None
    placement: dict[str, str] | None = None  # model-parallel: op name -> device name
    gradient_sync: GradientSync = GradientSync.OVERLAP
    bucket_bytes: int = Field(default=64 * 2**20, gt=0)


class OpGroup(BaseModel):
    """A set of ops (by original node name) and its decision."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ops: list[str] = Field(min_length=1)
    decision: GroupDecision


class Schedule(StrEnum):
    """The order in which a pipeline stage runs its micro-batches.

    ``gpipe``: every forward, then every backward (GPipe's fill-drain); ``1f1b``: stage
    ``s`` of ``p`` runs ``p - s - 1`` forwards, then alternates one forward and one
    backward, then the remaining backwards (PipeDream-Flush): the same bubble as GPipe,
    with at most ``p - s`` micro-batches' activations alive instead of all of them.
    """

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"


class Pipeline(BaseModel):
    """Op groups run as pipeline stages over micro-batches.

    ``stages[s]`` are the op group indices (into ``Strategy.groups``; ``len(groups)``
    names the default decision) of stage ``s``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    stages: list[list[int]] = Field(min_length=1)
    micro_batches: int = Field(ge=1)
    schedule: Schedule = Schedule.GPIPE


class Strategy(BaseModel):
    """A whole deployment strategy; ops in no group follow ``default``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = SCHEMA_VERSION
    name: str = ""
    groups: list[OpGroup] = Field(default_factory=list)
    default: GroupDecision | None = None
    sfb: dict[str, list[str]] = Field(default_factory=dict)  # parameter -> ops to duplicate
    pipeline: Pipeline | None = None

    @model_validator(mode="after")
    def _covers_something(self) -> Strategy:
        if not self.groups and self.default is None:
            raise ValueError("a strategy needs groups or a default decision")
        return self

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, exclude_none=True)


def load_strategy(data: str | bytes | dict) -> Strategy:
    """Parse a strategy from JSON text or a decoded document."""
    try:
        if isinstance(data, dict):
            return Strategy.model_validate(data)
        return Strategy.model_validate_json(data)
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(exc, "strategy", limit=5)) from None


class Mode(IntEnum):
    """How one op runs under a resolved strategy."""

    SPLIT = 0  # one instance per replica, each on a share of the batch
    DUPLICATE = 1  # one instance per device, each on the full batch
    SINGLE = 2  # one instance on one device, on the full batch


_OPTION_CODES = {option: code for code, option in enumerate(Option)}


@dataclass(frozen=True, eq=False)
class ResolvedStrategy:
    """A strategy checked against a graph and a cluster, as arrays.

    ``op_group[i]`` is op ``i``'s group. Group ``g``'s replicas are
    ``replica_device[replica_ptr[g]:replica_ptr[g + 1]]`` (a device appears once per
    replica on it) with ``replica_weight`` their batch shares (summing to 1).
    ``op_device[i]`` is the device of an op placed model-parallel (else -1). A group of
    pipeline stage ``group_stage[g]`` (-1: not staged) cuts the batch into
    ``group_micro_batches[g]`` micro-batches: its replicas are laid out micro-batch-major,
    the GPUs' replicas of micro-batch 0, then of micro-batch 1, ...
    """

    strategy: Strategy
    group_decisions: tuple[GroupDecision, ...]
    op_group: np.ndarray  # int32 per op
    group_option: np.ndarray  # int8 per group (index into Option)
    group_collective: tuple[Collective, ...]
    group_ps_device: np.ndarray  # int32 per group, -1 unless replicate-ps
    replica_ptr: np.ndarray  # int32 CSR over replica_device
    replica_device: np.ndarray  # int32
    replica_weight: np.ndarray  # float64
    op_device: np.ndarray  # int32 per op: model-parallel placement, -1 otherwise
    sfb_parameters: np.ndarray  # int32: rows of ir.parameters
    sfb_op: np.ndarray  # bool per op: duplicated for sufficient-factor broadcast
    group_stage: np.ndarray  # int32 per group: pipeline stage, -1 when not staged
    group_micro_batches: np.ndarray  # int32 per group: 1 unless staged

    @property
    def pipeline(self) -> Pipeline | None:
        return self.strategy.pipeline

    @property
    def num_groups(self) -> int:
        return len(self.group_option)

    def option(self, group: int) -> Option:
        return list(Option)[int(self.group_option[group])]

    def replicas(self, group: int) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = self.replica_ptr[group], self.replica_ptr[group + 1]
        return self.replica_device[lo:hi], self.replica_weight[lo:hi]

    def devices(self, group: int) -> np.ndarray:
        """The distinct devices group ``group`` uses, in device order."""
        return np.unique(self.replicas(group)[0])


def _device_indices(cluster: Cluster) -> dict[str, int]:
    return {name: i for i, name in enumerate(cluster.device_names)}


def _group_devices(decision: GroupDecision, cluster: Cluster, where: str) -> np.ndarray:
    bad = [g for g in decision.device_groups if not 0 <= g < cluster.num_groups]
    if bad:
        raise InvalidInput(
            f"{where}: device groups {bad} do not exist (the cluster has {cluster.num_groups})"
        )
    devices = np.concatenate(
        [cluster.group_devices(g) for g in sorted(set(decision.device_groups))]
    )
    return np.sort(devices).astype(np.int32)


def _replicas(
    decision: GroupDecision, devices: np.ndarray, names: dict[str, int], where: str
) -> tuple[np.ndarray, np.ndarray]:
    allowed = set(devices.tolist())

    def lookup(name: str, what: str) -> int:
        device = names.get(name)
        if device is None or device not in allowed:
            raise InvalidInput(f"{where}: {what} names device {name!r}, not in the group's GPUs")
        return device

    counts = dict.fromkeys(devices.tolist(), 1)
    if decision.replicas is not None:
        for name, count in decision.replicas.items():
            if count < 0:
                raise InvalidInput(f"{where}: replicas on {name!r} must be >= 0")
            counts[lookup(name, "replicas")] = count
    weights = dict.fromkeys(devices.tolist(), 1.0)
    if decision.batch_weights is not None:
        for name, weight in decision.batch_weights.items():
            if not weight > 0:
                raise InvalidInput(f"{where}: batch weight of {name!r} must be positive")
            weights[lookup(name, "batch_weights")] = float(weight)
    replica_device = [d for d in sorted(counts) for _ in range(counts[d])]
    if not replica_device:
        raise InvalidInput(f"{where}: no replicas left")
    replica_weight = np.array([weights[d] / counts[d] for d in replica_device])
    return np.array(replica_device, dtype=np.int32), replica_weight / replica_weight.sum()


def decision_replicas(decision: GroupDecision, cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """The replica GPUs of ``decision`` and their shares of the batch (summing to 1), as
    :func:`resolve` gives them to its group."""
    devices = _group_devices(decision, cluster, "decision")
    return _replicas(decision, devices, _device_indices(cluster), "decision")


def _pipeline_stages(
    pipeline: Pipeline | None, decisions: list[GroupDecision], cluster: Cluster, batch: int
) -> np.ndarray:
    """Each group's pipeline stage (-1: none), with the pipeline checked: stages name
    existing groups once each and replicate them."""
    stage_of = np.full(len(decisions), -1, dtype=np.int32)
    if pipeline is None:
        return stage_of
    if pipeline.micro_batches > batch:
        raise InvalidInput(
            f"pipeline: {pipeline.micro_batches} micro-batches exceed the batch of {batch}"
        )
    for stage, groups in enumerate(pipeline.stages):
        if not groups:
            raise InvalidInput(f"pipeline: stage {stage} has no op groups")
        for group in groups:
            if not 0 <= group < len(decisions):
                raise InvalidInput(
                    f"pipeline: stage {stage} names op group {group}; the strategy has "
                    f"{len(decisions)} (the last one the default)"
                )
            if stage_of[group] >= 0:
                raise InvalidInput(
                    f"pipeline: op group {group} is in stages {int(stage_of[group])} and {stage}"
                )
            decision = decisions[group]
            if decision.option not in (Option.REPLICATE_ALLREDUCE, Option.REPLICATE_PS):
                raise InvalidInput(
                    f"pipeline: op group {group} is {decision.option.value}; a stage "
                    "replicates its groups (replicate-allreduce or replicate-ps)"
                )
            stage_of[group] = stage
    return stage_of


def _check_stage_gpus(
    stage_of: np.ndarray, replica_device: list[np.ndarray], cluster: Cluster
) -> None:
    """Refuse two pipeline stages with replicas on one GPU."""
    owner: dict[int, int] = {}  # device -> stage
    for group in np.flatnonzero(stage_of >= 0).tolist():
        stage = int(stage_of[group])
        for device in np.unique(replica_device[group]).tolist():
            if owner.setdefault(device, stage) != stage:
                raise InvalidInput(
                    f"pipeline: stages {owner[device]} and {stage} share "
                    f"{cluster.device_names[device]}; each stage needs GPUs of its own"
                )


def resolve(
    strategy: Strategy,
    ir: GraphIR,
    cluster: Cluster,
    *,
    op_work: np.ndarray | None = None,
) -> ResolvedStrategy:
    """Check ``strategy`` against ``ir`` and ``cluster`` and lay it out as arrays.

    ``op_work`` (e.g. FLOPs per op) balances the default model-parallel split; without it
    every op weighs the same.
    """
    names = _device_indices(cluster)
    op_group = np.full(ir.num_ops, -1, dtype=np.int32)
    decisions: list[GroupDecision] = []
    for index, group in enumerate(strategy.groups):
        where = f"group {index}"
        try:
            ops = ir.op_indices(group.ops)
        except KeyError as unknown:
            raise InvalidInput(f"{where}: op {unknown.args[0]!r} is not in the graph") from None
        taken = op_group[ops]
        clash = np.flatnonzero((taken != -1) & (taken != index))
        if len(clash):
            name, other = group.ops[clash[0]], int(taken[clash[0]])
            raise InvalidInput(f"{where}: op {name!r} is already in group {other}")
        op_group[ops] = index
        decisions.append(group.decision)
    uncovered = op_group < 0
    if uncovered.any():
        if strategy.default is None:
            missing = [ir.op_names[i] for i in np.flatnonzero(uncovered)[:3]]
            raise InvalidInput(f"ops {missing} are in no group and the strategy has no default")
        op_group[uncovered] = len(decisions)
        decisions.append(strategy.default)

    work = op_work if op_work is not None else np.ones(ir.num_ops)
    group_stage = _pipeline_stages(strategy.pipeline, decisions, cluster, ir.batch_size)
    micro_batches = np.where(
        group_stage >= 0, strategy.pipeline.micro_batches if strategy.pipeline else 1, 1
    ).astype(np.int32)
    ptr = [0]
    replica_device: list[np.ndarray] = []
    replica_weight: list[np.ndarray] = []
    ps_device = np.full(len(decisions), -1, dtype=np.int32)
    op_device = np.full(ir.num_ops, -1, dtype=np.int32)
    spread = 0  # parameter servers placed round-robin so far
    laid_out: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # by decision id
    for group, decision in enumerate(decisions):
        where = f"group {group}" if group < len(strategy.groups) else "default"
        found = laid_out.get(id(decision))  # groups often share one decision object
        if found is None:
            devices = _group_devices(decision, cluster, where)
            found = laid_out[id(decision)] = (devices, *_replicas(decision, devices, names, where))
        devices, replicas, weights = found
        count = int(micro_batches[group])  # micro-batch-major: every GPU's replicas per one
        replica_device.append(np.tile(replicas, count))
        replica_weight.append(np.tile(weights, count) / count)
        ptr.append(ptr[-1] + len(replicas) * count)
        if decision.option == Option.REPLICATE_PS:
            if decision.ps_device is not None:
                device = names.get(decision.ps_device)
                if device is None:
                    raise InvalidInput(f"{where}: ps_device {decision.ps_device!r} does not exist")
                ps_device[group] = device
            else:  # TAG §4.2: round-robin among the group's GPUs
                ps_device[group] = devices[spread % len(devices)]
                spread += 1
        if decision.option == Option.MODEL_PARALLEL:
            ops = np.flatnonzero(op_group == group).astype(np.int32)
            op_device[ops] = model_parallel_placement(ir, ops, devices, work)
            if decision.placement:
                place_explicitly(ir, decision.placement, ops, devices, names, op_device, where)
    _check_stage_gpus(group_stage, replica_device, cluster)
    sfb: list[int] = []
    sfb_op = np.zeros(ir.num_ops, dtype=bool)
    parameter_rows = {name: row for row, name in enumerate(ir.parameters.names)}
    for name, ops in strategy.sfb.items():
        if name not in parameter_rows:
            raise InvalidInput(f"sfb names {name!r}, which is not a trainable parameter")
        sfb.append(parameter_rows[name])
        for op_name in ops:
            op = op_or_none(ir, op_name)
            if op is None:
                raise InvalidInput(f"sfb for {name!r} names op {op_name!r}, not in the graph")
            sfb_op[op] = True
    return ResolvedStrategy(
        strategy=strategy,
        group_decisions=tuple(decisions),
        op_group=op_group,
        group_option=np.array([_OPTION_CODES[d.option] for d in decisions], dtype=np.int8),
        group_collective=tuple(d.collective for d in decisions),
        group_ps_device=ps_device,
        replica_ptr=np.array(ptr, dtype=np.int32),
        replica_device=np.concatenate(replica_device).astype(np.int32),
        replica_weight=np.concatenate(replica_weight),
        op_device=op_device,
        sfb_parameters=np.array(sfb, dtype=np.int32),
        sfb_op=sfb_op,
        group_stage=group_stage,
        group_micro_batches=micro_batches,
    )


def layer_ops(ir: GraphIR, prefix: str) -> list[str]:
    """The forward, backward and update ops of the layer named ``prefix`` (its name scope,
    ``gradients/<prefix>/`` and the optimizer's ``update_<prefix>/``), in graph order: an
    op group that places one layer apart from the rest."""
    return [
        n
        for n in ir.op_names
        if n.startswith((f"{prefix}/", f"gradients/{prefix}/")) or f"/update_{prefix}/" in n
    ]
