"""Hand-built task graphs for the simulator tests: a list of tasks and a list of edges."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tagplan.planner.sim.taskgraph import COLLECTIVE, COMPUTE, TRANSFER, TaskGraph


@dataclass(frozen=True)
class Task:
    kind: int
    duration_s: float
    device: int = -1
    links: tuple[int, ...] = ()
    priority: float = 0.0
    group: int = -1
    nbytes: int = 0
    name: str = ""
    latency_s: float = 0.0
    shares: tuple[float, ...] = ()  # per link; empty: 1 on every link


@dataclass(frozen=True)
class Buffer:
    device: int
    nbytes: int
    producer: int
    consumers: tuple[int, ...] = ()


def compute(
    device: int, duration_s: float, *, priority: float = 0.0, group: int = -1, name: str = ""
) -> Task:
    return Task(COMPUTE, duration_s, device=device, priority=priority, group=group, name=name)


def transfer(
    links: Sequence[int],
    duration_s: float,
    *,
    priority: float = 0.0,
    group: int = -1,
    nbytes: int = 0,
    name: str = "",
    latency_s: float = 0.0,
    shares: Sequence[float] = (),
) -> Task:
    return Task(
        TRANSFER,
        duration_s,
        links=tuple(links),
        priority=priority,
        group=group,
        nbytes=nbytes,
        name=name,
        latency_s=latency_s,
        shares=tuple(shares),
    )


def collective(
    links: Sequence[int],
    duration_s: float,
    *,
    priority: float = 0.0,
    group: int = -1,
    nbytes: int = 0,
    latency_s: float = 0.0,
    shares: Sequence[float] = (),
) -> Task:
    return Task(
        COLLECTIVE,
        duration_s,
        links=tuple(links),
        priority=priority,
        group=group,
        nbytes=nbytes,
        latency_s=latency_s,
        shares=tuple(shares),
    )


def _csr(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    ptr = np.zeros(len(rows) + 1, dtype=np.int32)
    ptr[1:] = np.cumsum([len(r) for r in rows])
    index = np.array([i for r in rows for i in r], dtype=np.int32)
    return ptr, index


def build(
    tasks: Sequence[Task],
    edges: Sequence[tuple[int, int]] = (),
    *,
    num_devices: int = 1,
    num_links: int = 0,
    buffers: Sequence[Buffer] = (),
    persistent_bytes: Sequence[int] | None = None,
) -> TaskGraph:
    """A task graph of ``tasks`` where each edge ``(a, b)`` makes ``b`` wait for ``a``."""
    succ: list[list[int]] = [[] for _ in tasks]
    for a, b in edges:
        succ[a].append(b)
    link_ptr, link_index = _csr([t.links for t in tasks])
    shares = [s for t in tasks for s in (t.shares or (1.0,) * len(t.links))]
    succ_ptr, succ_index = _csr(succ)
    consumer_ptr, consumer_task = _csr([b.consumers for b in buffers])
    names = tuple(t.name for t in tasks)
    return TaskGraph(
        num_devices=num_devices,
        num_links=num_links,
        task_kind=np.array([t.kind for t in tasks], dtype=np.int8),
        task_device=np.array([t.device for t in tasks], dtype=np.int32),
        task_duration_s=np.array([t.duration_s for t in tasks], dtype=np.float64),
        task_priority=np.array([t.priority for t in tasks], dtype=np.float64),
        task_group=np.array([t.group for t in tasks], dtype=np.int32),
        task_bytes=np.array([t.nbytes for t in tasks], dtype=np.int64),
        task_latency_s=np.array([t.latency_s for t in tasks], dtype=np.float64),
        link_ptr=link_ptr,
        link_index=link_index,
        link_share=np.array(shares, dtype=np.float64),
        succ_ptr=succ_ptr,
        succ_index=succ_index,
        buffer_device=np.array([b.device for b in buffers], dtype=np.int32),
        buffer_bytes=np.array([b.nbytes for b in buffers], dtype=np.int64),
        buffer_producer=np.array([b.producer for b in buffers], dtype=np.int32),
        consumer_ptr=consumer_ptr,
        consumer_task=consumer_task,
        persistent_bytes=np.array(
            persistent_bytes if persistent_bytes is not None else [0] * num_devices,
            dtype=np.int64,
        ),
        task_names=names if any(names) else (),
    )


def chain(
    device: int, durations: Sequence[float], *, first: int = 0
) -> tuple[list[Task], list[tuple[int, int]]]:
    """Compute tasks on ``device`` in a chain, numbered from ``first``: tasks and edges."""
    tasks = [compute(device, d) for d in durations]
    return tasks, [(first + i, first + i + 1) for i in range(len(tasks) - 1)]
