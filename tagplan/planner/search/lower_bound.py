"""The physical limit every plan is reported against (docs/design.md §7): no strategy on this
cluster can run one training step faster.

    bound = max(critical path, total work spread perfectly over all GPUs)

* **Total work**: GPU ``d`` alone runs the whole step in ``T_d``; all GPUs together, with
  perfect balance and free communication, need at least ``1 / sum_d(1 / T_d)``.
* **Critical path**: the longest chain of dependent ops, each op at its minimum time
  with free communication. docs/design.md §7 takes every op on its fastest GPU; that is not a
  bound once an op can be split over the batch (data parallelism runs a convolution on a
  sixteenth of the batch), so a splittable op counts at its perfectly split time
  ``1 / sum_d(1 / t_d(op))`` and only the others at their fastest GPU's time.

Op times are taken at the full batch and scaled linearly, which can only underestimate
the split times (per-kernel overhead does not shrink with the batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.batch import SplitCategory
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.topology import Cluster

__all__ = ["LowerBound", "lower_bound"]


@dataclass(frozen=True)
class LowerBound:
    step_time_s: float
    critical_path_s: float
    perfect_spread_s: float


def lower_bound(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> LowerBound:
    """The step-time bound of the module docstring for ``ir`` on ``cluster``."""
    device_types = cluster.device_type.tolist()
    per_type = {t: costs.op_times(t, ir.batch_size).seconds for t in sorted(set(device_types))}
    # rate of each op over the whole cluster: sum over GPUs of 1 / t_d(op)
    rate = np.zeros(ir.num_ops)
    for t in device_types:
        times = per_type[t]
        rate += np.where(times > 0, 1.0 / np.maximum(times, 1e-30), 0.0)
    fastest = np.min(np.stack(list(per_type.values())), axis=0)
    splittable = ir.split_category != SplitCategory.NONE
    split_time = np.where(rate > 0, 1.0 / np.maximum(rate, 1e-30), 0.0)
    weight = np.where(splittable, split_time, fastest)
    finish = np.zeros(ir.num_ops)
    for op in range(ir.num_ops):  # ops are in topological order
        preds = ir.tensor_producer[ir.inputs(op)]
        start = max(
            float(finish[preds].max()) if len(preds) else 0.0,
            float(finish[ir.control_preds(op)].max()) if len(ir.control_preds(op)) else 0.0,
        )
        finish[op] = start + weight[op]
    critical = float(finish.max()) if ir.num_ops else 0.0
    totals = np.array([per_type[t].sum() for t in device_types])
    spread = float(1.0 / np.sum(1.0 / totals[totals > 0])) if (totals > 0).any() else 0.0
    return LowerBound(
        step_time_s=max(critical, spread), critical_path_s=critical, perfect_spread_s=spread
    )
