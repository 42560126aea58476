"""The physical limit every plan is reported against (docs/design.md §7): no strategy on this
cluster can run one training step faster.

    bound = max(critical path, total work spread perfectly over all GPUs)

* **Total work**: every op's work, split over the batch as finely as wanted, must be done
  by some GPUs, and a GPU of type ``t`` does op ``o``'s whole work in ``t_t(o)`` (or a
  fraction ``y`` of it in ``y t_t(o)``, as op times scale at most linearly). With ``n_t``
  GPUs of type ``t`` and free communication a step of length ``T`` needs
  ``sum_o y[o,t] t_t(o) <= n_t T`` for every type and ``sum_t y[o,t] = 1`` for every op:
  the least such ``T`` is a bound. By LP duality every ``lambda >= 0`` with
  ``sum_t lambda_t n_t = 1`` gives ``T >= sum_o min_t lambda_t t_t(o)``, valid whatever the
  ``lambda``, so the bound is that sum at the best ``lambda`` an exact line search over pairs
  of types finds. When every op is the same factor faster on one type than on another the
  optimum is ``1 / sum_d(1 / T_d)`` (``T_d``: GPU ``d`` alone runs the whole step); when
  the factors differ (memory-bound and compute-bound ops), that expression is *not* a bound
  — op A 1 s on type 1 and 10 s on type 2, op B the reverse: it says 5.5 s, and A on one GPU
  beside B on the other takes 1 s — and the dual is.
* **Critical path**: the longest chain of dependent ops, each op at its minimum time
  with free communication. docs/design.md §7 takes every op on its fastest GPU; that is not a
  bound once an op can be split over the batch (data parallelism runs a convolution on a
  sixteenth of the batch), so a splittable op counts at its perfectly split time
  ``1 / sum_d(1 / t_d(op))`` and only the others at their fastest GPU's time.

Op times are taken at the full batch and scaled linearly, which can only underestimate
the split times (per-kernel overhead does not shrink with the batch).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.batch import SplitCategory
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.topology import Cluster

__all__ = ["LowerBound", "lower_bound", "model_parallel_bound_s", "spread_bound_s"]


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
    critical = _critical_path_s(ir, np.where(splittable, split_time, fastest))
    types, counts = np.unique(np.asarray(device_types), return_counts=True)
    spread = spread_bound_s(np.stack([per_type[int(t)] for t in types]), counts)
    return LowerBound(
        step_time_s=max(critical, spread), critical_path_s=critical, perfect_spread_s=spread
    )


def model_parallel_bound_s(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> float:
    """A lower bound on the step of any strategy that runs every op whole on one GPU
    (Baechi's placements, :mod:`.baechi`): the critical path with each op at its fastest
    GPU type's time at the full batch, communication free. Along a chain of dependent ops
    each starts after the one before ends, wherever they are placed, and no GPU runs an
    op faster than its fastest type does; transfers only add."""
    types = sorted(set(cluster.device_type.tolist()))
    fastest = np.min(np.stack([costs.op_times(t, ir.batch_size).seconds for t in types]), axis=0)
    return _critical_path_s(ir, fastest)


def _critical_path_s(ir: GraphIR, op_s: np.ndarray) -> float:
    """The longest chain of data and control dependencies, op ``o`` taking ``op_s[o]``."""
    finish = np.zeros(ir.num_ops)
    tensor_producer = ir.tensor_producer.tolist()
    for op, inputs in enumerate(ir.input_lists):  # ops are in topological order
        preds = [tensor_producer[t] for t in inputs]
        preds.extend(ir.control_preds(op).tolist())
        start = float(finish[preds].max()) if preds else 0.0
        finish[op] = start + op_s[op]
    return float(finish.max()) if ir.num_ops else 0.0


_LINE_SEARCH_STEPS = 40  # golden-section steps: the bracket shrinks to 4e-9 of its length
_SWEEPS = 4  # passes over every pair of types, beyond three types
_NESTED_TYPES = 3  # up to this many types the dual's maximum is found exactly


def spread_bound_s(times_s: np.ndarray, counts: np.ndarray) -> float:
    """The total-work bound of the module docstring: ``times_s`` (K, ops) float64 seconds of
    every op on one GPU of each of the K types, ``counts`` (K,) GPUs of each type.

    Maximizes the dual ``f(w) = sum_o min_t (w_t / n_t) t_t(o)`` over the simplex of ``w``
    (``w_t = lambda_t n_t``). ``f`` is concave, so on up to three types nested golden-section
    searches find its maximum (the best ``f`` over a line of the simplex is concave in where
    the line lies); beyond that, weight moves between two types at a time from the
    uniform-ratio point. Every ``w`` visited gives a valid bound; the best is kept.
    """
    times = np.asarray(times_s, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    if not (times.sum(axis=1) > 0).any():
        return 0.0

    def dual(w: np.ndarray) -> float:
        return float(np.min((w / counts)[:, None] * times, axis=0).sum())

    if len(counts) <= _NESTED_TYPES:
        return _nested_max(dual, np.zeros(0), len(counts))
    totals = times.sum(axis=1)
    w = np.where(totals > 0, counts / np.maximum(totals, 1e-300), 0.0)
    w /= w.sum()
    best = dual(w)
    for _ in range(_SWEEPS):
        for i in range(len(w)):
            for j in range(i + 1, len(w)):
                total = w[i] + w[j]

                def along(share: float, i: int = i, j: int = j, total: float = total) -> float:
                    trial = w.copy()
                    trial[i], trial[j] = share, total - share
                    return dual(trial)

                share = _golden_max(along, 0.0, total)
                value = along(share)
                if value > best:
                    best = value
                    w[i], w[j] = share, total - share
    return best


def _nested_max(dual: Callable[[np.ndarray], float], fixed: np.ndarray, size: int) -> float:
    """The maximum of ``dual`` over simplex points of ``size`` entries that start with
    ``fixed``: golden section over the next entry, each trial maximizing the rest."""
    left = 1.0 - float(fixed.sum())
    if len(fixed) == size - 1:
        return dual(np.append(fixed, max(left, 0.0)))

    def rest(value: float) -> float:
        return _nested_max(dual, np.append(fixed, value), size)

    return rest(_golden_max(rest, 0.0, max(left, 0.0)))


def _golden_max(f: Callable[[float], float], low: float, high: float) -> float:
    """The argument of a concave ``f``'s maximum on ``[low, high]``, by golden section."""
    ratio = (np.sqrt(5.0) - 1.0) / 2.0
    a, b = low + (1 - ratio) * (high - low), low + ratio * (high - low)
    fa, fb = f(a), f(b)
    for _ in range(_LINE_SEARCH_STEPS):
        if fa < fb:
            low, a, fa = a, b, fb
            b = low + ratio * (high - low)
            fb = f(b)
        else:
            high, b, fb = b, a, fa
            a = low + (1 - ratio) * (high - low)
            fa = f(a)
    return (low + high) / 2
