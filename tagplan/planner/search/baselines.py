"""The strategies every plan is measured against (docs/design.md §7, TAG §5.2), as strategies
of the same kind the search produces, so one compiler and one simulator judge them all.

* ``single``: the whole step on the best single GPU that fits it;
* ``dp-nccl``: data parallelism on every GPU, equal batch shares, the gradients
  synchronized after the backward pass as TensorFlow's ``MirroredStrategy`` does by
  default (TAG's DP-NCCL): concatenated into one pack (``NcclAllReduce(num_packs=1)``)
  and reduced by one NCCL AllReduce, ring or tree, whichever NCCL picks for its size;
* ``dp-nccl-p``: the same with batch shares proportional to each GPU's speed on this
  model (TAG §5.2 baseline 2);
* ``dp-ps``: data parallelism with parameters spread round-robin over every GPU acting
  as a parameter server;
* ``horovod``: data parallelism with AllReduce fused into 64 MiB buckets that overlap the
  backward pass, hierarchical where it is faster (Horovod's tensor fusion);
* ``m-topo``, ``m-etf``, ``m-sct``: Baechi's memory-constrained model parallelism (:mod:`.baechi`);
* ``pipeline``: a pipeline as a user configures one by hand: one stage per machine,
  equal compute per stage, ``4p`` micro-batches under 1F1B (:mod:`.pipeline_stages`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tagplan.planner.cost.memory import FRAMEWORK_RESERVE_BYTES, single_device_peak_bytes
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.search.baechi import m_etf, m_sct, m_topo
from tagplan.planner.search.pipeline_stages import pipeline_baseline
from tagplan.planner.strategy import (
    Collective,
    GradientSync,
    GroupDecision,
    OpGroup,
    Option,
    Strategy,
)
from tagplan.planner.topology import Cluster

__all__ = ["BASELINES", "DATA_PARALLEL_BASELINES", "baseline_strategy", "ps_variables"]


def _all_groups(cluster: Cluster) -> list[int]:
    return list(range(cluster.num_groups))


def _device_type(cluster: Cluster, device: int) -> int:
    return int(cluster.device_type[device])


def single_gpu(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> Strategy:
    """The fastest GPU that holds the whole step (or the largest one if none does)."""
    need = single_device_peak_bytes(ir) + FRAMEWORK_RESERVE_BYTES
    candidates = [int(cluster.group_devices(g)[0]) for g in range(cluster.num_groups)]
    fits = [d for d in candidates if cluster.device_memory_bytes[d] >= need]
    if fits:
        device = min(
            fits,
            key=lambda d: (costs.op_times(_device_type(cluster, d), ir.batch_size).total_s, d),
        )
    else:
        device = max(candidates, key=lambda d: (cluster.device_memory_bytes[d], -d))
    group = int(cluster.group_of_device[device])
    replicas = {str(cluster.device_names[d]): 0 for d in cluster.group_devices(group)}
    replicas[str(cluster.device_names[device])] = 1
    decision = GroupDecision(
        device_groups=[group], option=Option.REPLICATE_ALLREDUCE, replicas=replicas
    )
    return Strategy(name="single", default=decision)


def _mirrored(
    ir: GraphIR, cluster: Cluster, batch_weights: dict[str, float] | None
) -> GroupDecision:
    """Data parallelism as ``MirroredStrategy`` runs it: every gradient in one pack, a
    bucket that holds all of them and so starts once the backward pass is done, reduced
    by the algorithm NCCL picks."""
    return GroupDecision(
        device_groups=_all_groups(cluster),
        option=Option.REPLICATE_ALLREDUCE,
        collective=Collective.NCCL,
        gradient_sync=GradientSync.BUCKETED,
        bucket_bytes=max(1, int(ir.parameters.bytes.sum())),
        batch_weights=batch_weights,
    )


def dp_nccl(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> Strategy:
    return Strategy(name="dp-nccl", default=_mirrored(ir, cluster, None))


def dp_nccl_proportional(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> Strategy:
    """Batch shares inversely proportional to each GPU's step time on this model."""
    local = max(1, ir.batch_size // cluster.num_devices)
    speed = {
        str(cluster.device_names[d]): 1.0
        / max(costs.op_times(_device_type(cluster, d), local).total_s, 1e-12)
        for d in range(cluster.num_devices)
    }
    return Strategy(name="dp-nccl-p", default=_mirrored(ir, cluster, speed))


def dp_ps(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> Strategy:
    """Every trainable variable (a dense parameter, or an embedding table, with its slots
    and updates) on one PS GPU, placed greedily in order of decreasing size: on the
    machine holding the fewest parameter bytes so far (its network link carries every
    remote worker's push and pull of them, as TensorFlow's greedy load balancing by byte
    size spreads variables over PS tasks), and there on its least-loaded GPU."""
    groups = _all_groups(cluster)
    variables = ps_variables(ir)
    load = np.zeros(cluster.num_devices)
    machine_load = np.zeros(cluster.num_machines)
    op_groups = []
    for nbytes, ops in sorted(variables, key=lambda v: -v[0]):
        machine = int(np.argmin(machine_load))
        members = cluster.machine_devices(machine)
        device = int(members[np.argmin(load[members])])
        load[device] += nbytes
        machine_load[machine] += nbytes
        decision = GroupDecision(
            device_groups=groups,
            option=Option.REPLICATE_PS,
            ps_device=str(cluster.device_names[device]),
        )
        op_groups.append(OpGroup(ops=[ir.op_names[o] for o in sorted(ops)], decision=decision))
    default = GroupDecision(device_groups=groups, option=Option.REPLICATE_PS)
    return Strategy(name="dp-ps", groups=op_groups, default=default)


def ps_variables(ir: GraphIR) -> list[tuple[int, set[int]]]:
    """``(bytes, ops)`` of every trainable variable a parameter server holds: a dense
    parameter with its slots and update region, a sparse table with its slots and
    updates (its lookups follow it by colocation)."""
    params, tables = ir.parameters, ir.sparse_parameters
    found = []
    for row in range(len(params)):
        ops = {int(params.variable_op[row]), int(params.apply_op[row])}
        ops.update(params.slot_op[params.slot_ptr[row] : params.slot_ptr[row + 1]].tolist())
        ops.update(params.region_op[params.region_ptr[row] : params.region_ptr[row + 1]].tolist())
        found.append((int(params.bytes[row]), ops))
    for row in range(len(tables)):
        ops = {int(tables.variable_op[row])}
        ops.update(tables.slot_op[tables.slot_ptr[row] : tables.slot_ptr[row + 1]].tolist())
        ops.update(tables.update_op[tables.update_ptr[row] : tables.update_ptr[row + 1]].tolist())
        found.append((int(tables.bytes[row]), ops))
    return found


def horovod(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> Strategy:
    decision = GroupDecision(
        device_groups=_all_groups(cluster),
        option=Option.REPLICATE_ALLREDUCE,
        collective=Collective.AUTO,
        gradient_sync=GradientSync.BUCKETED,
    )
    return Strategy(name="horovod", default=decision)


BASELINES: dict[str, Callable[[GraphIR, Cluster, OpCostModel], Strategy]] = {
    "single": single_gpu,
    "dp-nccl": dp_nccl,
    "dp-nccl-p": dp_nccl_proportional,
    "dp-ps": dp_ps,
    "horovod": horovod,
    "m-topo": m_topo,
    "m-etf": m_etf,
    "m-sct": m_sct,
    "pipeline": pipeline_baseline,
}


DATA_PARALLEL_BASELINES = frozenset({"dp-nccl", "dp-nccl-p", "dp-ps", "horovod"})
"""The baselines that replicate the whole model: what users run without a planner."""


def baseline_strategy(
    name: str,
    ir: GraphIR,
    cluster: Cluster,
    costs: OpCostModel,
    *,
    time_limit_s: float | None = None,
) -> Strategy:
    """The named baseline's strategy for this graph and cluster. ``time_limit_s`` bounds
    the placers that solve an LP (m-SCT), which raise
    :class:`~tagplan.planner.errors.BudgetExhausted` past it."""
    builder = BASELINES.get(name)
    if builder is None:
        raise InvalidInput(f"unknown baseline {name!r}; known: {', '.join(BASELINES)}")
    if builder is m_sct:
        return m_sct(ir, cluster, costs, time_limit_s=time_limit_s)
    return builder(ir, cluster, costs)
