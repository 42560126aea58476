"""Simulate one training step of a task graph (docs/design.md §6, TAG §4.3.2, Table 1).

:func:`simulate` schedules the tasks (:mod:`~tagplan.planner.sim.engine`: devices in FIFO or
HeteroG's priority order, transfers sharing the bandwidth of their links max-min fairly
or, for comparison, holding them exclusively), counts memory by reference
(:mod:`~tagplan.planner.sim.memory`) and derives the runtime feedback TAG feeds its GNN
(Table 1):

* per op group ``g``, the **makespan** ``max finish - min start`` over its tasks, and the
  **idle time before transferring output**: the mean, over the edges ``x -> y`` from a
  compute task ``x`` of ``g`` to a transfer or collective ``y``, of
  ``start(y) - finish(x)``;
* per device, **peak memory** and the **idle fraction** ``1 - busy / step_time``;
* per link, the **idle fraction**.

Group feedback is dense over ids ``0 .. max(task_group)``; a group with no tasks (or, for
the idle time, no compute task feeding communication) gets 0. Tasks of group ``-1`` count
toward no group.

Only cheap shape checks run here: the dependencies are assumed acyclic and the indices in
range (``TaskGraph.validate`` checks both, once, where the graph is built). A cycle is still
caught, as tasks left unscheduled, and raised as :class:`InvalidInput`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from tagplan.planner.csr import stable_order
from tagplan.planner.errors import InvalidInput
from tagplan.planner.sim import engine
from tagplan.planner.sim.memory import memory_profile
from tagplan.planner.sim.taskgraph import COMPUTE, TASK_COLUMNS, TaskGraph

__all__ = ["LINK_MODELS", "LinkModel", "SimResult", "group_feedback", "simulate", "upward_rank"]

LinkModel = Literal["shared", "exclusive"]
LINK_MODELS: tuple[LinkModel, ...] = ("shared", "exclusive")
"""``shared``: concurrent transfers share a link's bandwidth max-min fairly (the default);
``exclusive``: a transfer holds its links for its whole duration, FIFO (the former model,
kept for comparison). See :mod:`~tagplan.planner.sim.engine`."""


@dataclass(frozen=True, eq=False)
class SimResult:
    """Schedule and runtime feedback of one simulated step. Seconds and bytes."""

    step_time_s: float  # makespan: the last finish (the step starts at 0)
    start_s: np.ndarray  # float64 per task
    finish_s: np.ndarray  # float64 per task
    device_busy_s: np.ndarray  # float64 per device: sum of its compute durations
    device_idle_fraction: np.ndarray  # float64 per device: 1 - busy / step_time
    link_busy_s: np.ndarray  # float64 per link: seconds of traffic at its full bandwidth
    link_idle_fraction: np.ndarray  # float64 per link
    peak_memory_bytes: np.ndarray  # int64 per device: buffers + persistent + reserve
    oom: bool  # some device's peak exceeds its capacity
    overflow_bytes: np.ndarray  # int64 per device: max(0, peak - capacity)
    group_makespan_s: np.ndarray  # float64 per group id
    group_idle_before_transfer_s: np.ndarray  # float64 per group id
    reserve_bytes: int = 0  # framework reserve included in peak_memory_bytes


def _check(
    tg: TaskGraph, device_memory_bytes: np.ndarray | None, use_priority: bool, link_model: str
) -> None:
    n = tg.num_tasks
    for name in TASK_COLUMNS:
        if len(getattr(tg, name)) != n:
            raise InvalidInput(f"task graph: {name} has {len(getattr(tg, name))} rows, not {n}")
    if len(tg.link_ptr) != n + 1 or len(tg.succ_ptr) != n + 1:
        raise InvalidInput("task graph: link_ptr and succ_ptr need num_tasks + 1 entries")
    if len(tg.link_share) != len(tg.link_index):
        raise InvalidInput("task graph: link_share needs one entry per link_index entry")
    if link_model not in LINK_MODELS:
        raise InvalidInput(f"unknown link model {link_model!r}; expected one of {LINK_MODELS}")
    if len(tg.persistent_bytes) != tg.num_devices:
        raise InvalidInput("task graph: persistent_bytes needs one entry per device")
    if use_priority and not np.isfinite(tg.task_priority).all():
        raise InvalidInput("task graph: priorities must be finite to schedule by priority")
    if device_memory_bytes is not None and np.shape(device_memory_bytes) != (tg.num_devices,):
        raise InvalidInput(
            f"device_memory_bytes has shape {np.shape(device_memory_bytes)}, "
            f"expected ({tg.num_devices},)"
        )


def _idle_fraction(busy: np.ndarray, step_time_s: float) -> np.ndarray:
    if step_time_s <= 0:
        return np.ones_like(busy)
    return 1.0 - busy / step_time_s


def group_feedback(
    tg: TaskGraph,
    start_s: np.ndarray,
    finish_s: np.ndarray,
    task_copies: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-group makespan and mean idle before a transfer (TAG Table 1), dense by id.

    ``task_copies`` (a graph compiled by symmetry class, :mod:`~tagplan.planner.compile.
    symmetry`) says how many tasks each task stands for; an edge counts as many times as the
    more copied of its two ends (a compute task's copies each feeding the collective or
    barrier, or each feeding one of a transfer's flows), as the per-GPU graph has it."""
    group = tg.task_group
    num_groups = int(group.max()) + 1 if len(group) else 0
    num_groups = max(num_groups, 0)
    makespan = np.zeros(num_groups)
    idle = np.zeros(num_groups)
    if num_groups == 0:
        return makespan, idle
    member = np.flatnonzero(group >= 0)
    # by group, then reduced per group: what np.minimum.at would give, without its
    # per-element cost
    member = member[stable_order(group[member], num_groups)]
    g = group[member]
    starts = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1]))) if len(g) else g
    present = g[starts]
    makespan[present] = np.maximum.reduceat(finish_s[member], starts) - np.minimum.reduceat(
        start_s[member], starts
    )
    src = np.repeat(np.arange(tg.num_tasks), np.diff(tg.succ_ptr))
    dst = tg.succ_index
    feeds = (tg.task_kind[src] == COMPUTE) & (tg.task_kind[dst] != COMPUTE) & (group[src] >= 0)
    src, dst = src[feeds], dst[feeds]
    copies = (
        np.ones(len(src)) if task_copies is None else np.maximum(task_copies[src], task_copies[dst])
    )
    waits = start_s[dst] - finish_s[src]
    total = np.bincount(group[src], weights=waits * copies, minlength=num_groups)
    count = np.bincount(group[src], weights=copies, minlength=num_groups)
    np.divide(total, count, out=idle, where=count > 0)
    return makespan, idle


def simulate(
    tg: TaskGraph,
    *,
    device_memory_bytes: np.ndarray | None = None,
    reserve_bytes: int = 0,
    use_priority: bool = False,
    link_model: LinkModel = "shared",
    task_copies: np.ndarray | None = None,
) -> SimResult:
    """Schedule ``tg`` and report step time, memory and the feedback of TAG Table 1.

    Parameters
    ----------
    tg : TaskGraph
        Tasks with durations, dependencies, held links and buffers.
    device_memory_bytes : np.ndarray, optional
        Capacity of each device; without it nothing is out of memory.
    reserve_bytes : int
        Framework reserve per device (CUDA context, handles), added to every peak.
    use_priority : bool
        Schedule by ``tg.task_priority`` (HeteroG §4.2, e.g. :func:`upward_rank`) instead
        of FIFO (TAG §4.3.2); see :mod:`~tagplan.planner.sim.engine`.
    link_model : LinkModel
        ``shared`` (max-min fair bandwidth sharing) or ``exclusive`` (the former model:
        a transfer holds its links, FIFO or by priority); see :data:`LINK_MODELS`.
    task_copies : np.ndarray, optional
        A graph compiled by symmetry class: the tasks each task stands for, which weigh
        the groups' idle time before transfers (:func:`group_feedback`).

    Raises
    ------
    InvalidInput
        Mismatched array lengths, non-finite priorities in priority mode, an unknown link
        model, or a cycle.
    """
    _check(tg, device_memory_bytes, use_priority, link_model)
    start_s, finish_s, busy, scheduled = engine.schedule(
        # The declared dtypes (no copy when already so): one compiled specialization.
        np.asarray(tg.task_kind, dtype=np.int8),
        np.asarray(tg.task_device, dtype=np.int32),
        np.asarray(tg.task_duration_s, dtype=np.float64),
        np.asarray(tg.task_latency_s, dtype=np.float64),
        np.asarray(tg.task_priority, dtype=np.float64),
        np.asarray(tg.link_ptr, dtype=np.int32),
        np.asarray(tg.link_index, dtype=np.int32),
        np.asarray(tg.link_share, dtype=np.float64),
        np.asarray(tg.succ_ptr, dtype=np.int32),
        np.asarray(tg.succ_index, dtype=np.int32),
        int(tg.num_devices),
        int(tg.num_links),
        bool(use_priority),
        link_model == "shared",
    )
    if scheduled < tg.num_tasks:
        raise InvalidInput(
            f"task graph: {tg.num_tasks - scheduled} tasks never became ready "
            "(the dependencies form a cycle)"
        )
    step_time_s = float(finish_s.max()) if tg.num_tasks else 0.0
    device_busy = busy[: tg.num_devices]
    link_busy = busy[tg.num_devices :]
    peak = memory_profile(tg, start_s, finish_s).peak_bytes + np.int64(reserve_bytes)
    if device_memory_bytes is None:
        overflow = np.zeros(tg.num_devices, dtype=np.int64)
    else:
        capacity = np.asarray(device_memory_bytes, dtype=np.int64)
        overflow = np.maximum(peak - capacity, 0)
    group_makespan, group_idle = group_feedback(tg, start_s, finish_s, task_copies)
    return SimResult(
        step_time_s=step_time_s,
        start_s=start_s,
        finish_s=finish_s,
        device_busy_s=device_busy,
        device_idle_fraction=_idle_fraction(device_busy, step_time_s),
        link_busy_s=link_busy,
        link_idle_fraction=_idle_fraction(link_busy, step_time_s),
        peak_memory_bytes=peak,
        oom=bool((overflow > 0).any()),
        overflow_bytes=overflow,
        group_makespan_s=group_makespan,
        group_idle_before_transfer_s=group_idle,
        reserve_bytes=int(reserve_bytes),
    )


def upward_rank(tg: TaskGraph) -> np.ndarray:
    """Upward rank of every task (HeteroG §4.2, after HEFT), float64 seconds.

    .. math::

        \\mathrm{rank}(x) = p_x + \\max_{s \\in \\mathrm{succ}(x)} \\mathrm{rank}(s)

    with ``p_x`` the task's duration (compute or communication) and the max over no
    successors 0: the length of the longest path from ``x`` to the end of the step.
    Write it into ``task_priority`` and simulate with ``use_priority=True``.

    Raises
    ------
    InvalidInput
        If the dependencies form a cycle.
    """
    rank, ordered = engine.upward_rank_kernel(
        np.asarray(tg.task_duration_s, dtype=np.float64),
        np.asarray(tg.succ_ptr, dtype=np.int32),
        np.asarray(tg.succ_index, dtype=np.int32),
    )
    if ordered < tg.num_tasks:
        raise InvalidInput("task graph: dependencies form a cycle")
    return rank
