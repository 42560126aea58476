"""The task graph the compiler hands to the simulator (docs/design.md §5-§6).

Flat arrays, one row per task. A task is either a *compute* task that occupies one device
for its duration (an op replica, or an auxiliary Split / Concat / AddN the compiler
inserted), or a *communication* task (a point-to-point transfer, or a collective such as
a ring AllReduce) that holds every link in its link set for its duration. Durations are
computed by the compiler from the cost model, so the simulator only schedules.

Memory is described by *buffers*: a buffer of ``buffer_bytes`` lives on
``buffer_device``; it is allocated when its producer task starts and freed when the last
of its consumer tasks has finished (TAG §4.3.2's reference counting). A buffer with no
consumers is freed when its producer finishes. ``persistent_bytes`` per device (variables,
optimizer slots) are resident for the whole step.

Links are resources of the cluster the compiler chose to model (e.g. each device's port
into its machine's interconnect, each machine's network uplink and downlink); a
communication task lists the links it crosses, each with its *share*: the fraction of
that link's bandwidth the task uses when it runs uncontended (1 on its bottleneck; above 1
when the task stands for several equal flows, as one compiled for a class of symmetric
GPUs does, :mod:`~tagplan.planner.compile.symmetry`). Its
duration splits into a latency part (``task_latency_s``) and a bandwidth part, the rest.
Concurrent tasks share a link's bandwidth, each slowed by the contention on its links
(:mod:`~tagplan.planner.sim.engine`). Compute tasks list no links.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tagplan.planner.errors import InvalidInput

__all__ = ["COLLECTIVE", "COMPUTE", "TASK_COLUMNS", "TRANSFER", "TaskGraph"]

COMPUTE = 0
TRANSFER = 1
COLLECTIVE = 2

TASK_COLUMNS = (
    "task_device",
    "task_duration_s",
    "task_priority",
    "task_group",
    "task_bytes",
    "task_latency_s",
)
"""The per-task arrays besides ``task_kind``: one row per task each."""


@dataclass(frozen=True, eq=False)
class TaskGraph:
    """A step of distributed training as tasks, dependencies, resources and buffers."""

    num_devices: int
    num_links: int
    task_kind: np.ndarray  # int8: COMPUTE, TRANSFER, COLLECTIVE
    task_device: np.ndarray  # int32: device of a compute task, -1 for communication
    task_duration_s: np.ndarray  # float64
    task_priority: np.ndarray  # float64: larger runs first among tasks ready at once
    task_group: np.ndarray  # int32: op group the task belongs to (-1 for none), for feedback
    task_bytes: np.ndarray  # int64: bytes moved by a communication task (0 for compute)
    task_latency_s: np.ndarray  # float64: latency part of a duration (0 for compute)
    link_ptr: np.ndarray  # int32 CSR over link_index: links used by each task
    link_index: np.ndarray  # int32
    link_share: np.ndarray  # float64 > 0, per link_index entry: bandwidth share
    succ_ptr: np.ndarray  # int32 CSR over succ_index: tasks that wait for each task
    succ_index: np.ndarray  # int32
    buffer_device: np.ndarray  # int32
    buffer_bytes: np.ndarray  # int64
    buffer_producer: np.ndarray  # int32: the task that allocates it
    consumer_ptr: np.ndarray  # int32 CSR over consumer_task: tasks that read each buffer
    consumer_task: np.ndarray  # int32
    persistent_bytes: np.ndarray  # int64 per device
    device_names: tuple[str, ...] = ()
    link_names: tuple[str, ...] = ()
    task_names: tuple[str, ...] = field(default=(), repr=False)

    @property
    def num_tasks(self) -> int:
        return len(self.task_kind)

    @property
    def num_buffers(self) -> int:
        return len(self.buffer_bytes)

    def validate(self) -> None:
        """Check shapes, index ranges and acyclicity; raise InvalidInput naming the fault."""
        n = self.num_tasks
        for name in TASK_COLUMNS:
            if len(getattr(self, name)) != n:
                raise InvalidInput(
                    f"task graph: {name} has {len(getattr(self, name))} rows, expected {n}"
                )
        for ptr_name, ptr, rows in (
            ("link_ptr", self.link_ptr, n),
            ("succ_ptr", self.succ_ptr, n),
            ("consumer_ptr", self.consumer_ptr, self.num_buffers),
        ):
            if len(ptr) != rows + 1 or ptr[0] != 0 or (np.diff(ptr) < 0).any():
                raise InvalidInput(f"task graph: {ptr_name} is not a CSR pointer over {rows} rows")
        compute = self.task_kind == COMPUTE
        if (compute & ((self.task_device < 0) | (self.task_device >= self.num_devices))).any():
            raise InvalidInput("task graph: a compute task has no valid device")
        if (self.task_duration_s < 0).any() or not np.isfinite(self.task_duration_s).all():
            raise InvalidInput("task graph: durations must be finite and non-negative")
        if len(self.link_index) and (
            self.link_index.min() < 0 or self.link_index.max() >= self.num_links
        ):
            raise InvalidInput("task graph: a link index is out of range")
        if len(self.link_share) != len(self.link_index):
            raise InvalidInput("task graph: link_share needs one entry per link_index entry")
        if not ((self.link_share > 0) & np.isfinite(self.link_share)).all():
            raise InvalidInput("task graph: link shares must be positive and finite")
        if (compute & (np.diff(self.link_ptr) > 0)).any():
            raise InvalidInput("task graph: a compute task lists links")
        latency = self.task_latency_s
        if not ((latency >= 0) & (latency <= self.task_duration_s)).all():
            raise InvalidInput("task graph: latencies must lie between 0 and the duration")
        if len(self.succ_index) and (self.succ_index.min() < 0 or self.succ_index.max() >= n):
            raise InvalidInput("task graph: a successor index is out of range")
        if len(self.persistent_bytes) != self.num_devices:
            raise InvalidInput("task graph: persistent_bytes needs one entry per device")
        indegree = np.bincount(self.succ_index, minlength=n)
        order = list(np.flatnonzero(indegree == 0))
        head = 0
        while head < len(order):
            task = order[head]
            head += 1
            for succ in self.succ_index[self.succ_ptr[task] : self.succ_ptr[task + 1]]:
                indegree[succ] -= 1
                if indegree[succ] == 0:
                    order.append(succ)
        if len(order) != n:
            raise InvalidInput("task graph: dependencies form a cycle")
