"""A :class:`~tagplan.planner.sim.taskgraph.TaskGraph` built task by task.

The compiler (:mod:`.tasks`) adds hundreds of thousands of tasks, buffers and dependencies
a few at a time, fragment by fragment. A fragment's builder takes them in Python lists (an
extend of a few items costs a fifth of a typed array's, which converts each item as it
comes), converted once to typed arrays (:mod:`array`, in the graph's dtypes) when the
fragment is frozen; the builder the fragments are spliced into holds typed arrays, whose
buffers :meth:`TaskBuilder.build` copies into the graph's flat numpy arrays at once
(converting its hundreds of thousands of items from lists was a tenth of a compile).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from operator import itemgetter
from typing import Any, Protocol

import numpy as np

from tagplan.planner.csr import distinct_pairs_csr, stable_order
from tagplan.planner.sim.taskgraph import COMPUTE, TaskGraph

__all__ = ["FrozenTasks", "Piece", "TaskBuilder", "part_offset", "renumbered"]

_PART_SHIFT = 32  # tasks and buffers of other parts, in parts spliced together
_ITEM = (1 << _PART_SHIFT) - 1

# the columns that number tasks or buffers, shifted when frozen tasks are spliced in
_TASK_NUMBERS = ("edge_src", "edge_dst", "buffer_producer", "read_task")
_BUFFER_NUMBERS = ("read_buffer",)


class Piece(Protocol):
    """What a task reads: a buffer, and the task that produces it."""

    @property
    def task(self) -> int: ...

    @property
    def buffer(self) -> int: ...


def part_offset(part: int) -> int:
    """What a part built apart adds to the number of a task or buffer of part ``part``
    to name it (:meth:`TaskBuilder.spliced`)."""
    return (part + 1) << _PART_SHIFT


def renumbered(numbers: np.ndarray, own_first: np.ndarray, first: np.ndarray) -> np.ndarray:
    """``numbers`` (int64) of spliced parts as the spliced builder numbers them:
    ``own_first`` is, per number, the first number of the part it is in (its own items
    count from there), ``first`` every part's (another part's items, named by
    :func:`part_offset`, count from its)."""
    named = numbers >> _PART_SHIFT
    base = np.where(named == 0, own_first, first[np.maximum(named - 1, 0)])
    return base + (numbers & _ITEM)


Column = list | array  # a fragment's builder holds lists, a spliced one typed arrays


def _column(typecode: str) -> Any:
    """A column of :class:`TaskBuilder`, empty, whose items are of ``typecode`` (array's
    typecodes, numpy's too)."""
    return field(default_factory=list, metadata={"typecode": typecode})


@dataclass(frozen=True, eq=False)
class FrozenTasks:
    """Tasks, buffers and reads built apart and numbered from 0 (:meth:`TaskBuilder.freeze`),
    to splice into task graphs any number of times (:meth:`TaskBuilder.spliced`): each
    column's bytes, and the columns that number tasks or buffers as arrays to renumber."""

    num_tasks: int
    num_buffers: int
    names: list[str]
    plain: dict[str, bytes]
    numbers: dict[str, np.ndarray]


@dataclass(eq=False)
class TaskBuilder:
    """The task graph being built, one list or typed array per column (module docstring;
    the names: a list). Dependencies and buffer reads are ``(from, to)`` pairs that may
    repeat; :meth:`build` drops repeats and sorts them.

    Buffers are numbered in the order they are added, tasks too until :meth:`build`
    numbers them by the op each was made for (``made_for`` when it was added).
    """

    num_devices: int
    kind: Column = _column("b")
    device: Column = _column("i")
    duration: Column = _column("d")
    group: Column = _column("i")
    nbytes: Column = _column("q")
    latency: Column = _column("d")
    names: list[str] = field(default_factory=list)
    link_count: Column = _column("i")
    link_index: Column = _column("i")
    link_share: Column = _column("d")
    edge_src: Column = _column("q")
    edge_dst: Column = _column("q")
    buffer_device: Column = _column("i")
    buffer_bytes: Column = _column("q")
    buffer_producer: Column = _column("i")
    read_buffer: Column = _column("q")
    read_task: Column = _column("q")
    # the op each task is for
    origin: Column = _column("i")
    made_for: int = 0

    def task(
        self,
        kind: int,
        device: int,
        seconds: float,
        group: int,
        name: str,
        *,
        nbytes: int = 0,
        links: Sequence[int] = (),
        shares: Sequence[float] = (),
        latency_s: float = 0.0,
    ) -> int:
        """A task; a transfer or collective names its ``links`` with its ``shares`` of
        them (all of each when not given) and the latency part of its ``seconds``
        (:mod:`.links`)."""
        self.kind.append(kind)
        self.device.append(device)
        self.duration.append(float(seconds))
        self.group.append(group)
        self.nbytes.append(nbytes)
        self.latency.append(latency_s)
        self.names.append(name)
        self.origin.append(self.made_for)
        self.link_count.append(len(links))
        self.link_index.extend(links)
        self.link_share.extend(shares or [1.0] * len(links))
        return len(self.kind) - 1

    def buffer(self, device: int, nbytes: int, producer: int) -> int:
        self.buffer_device.append(device)
        self.buffer_bytes.append(nbytes)
        self.buffer_producer.append(producer)
        return len(self.buffer_device) - 1

    def buffers(
        self,
        devices: Sequence[int],
        nbytes: Sequence[int],
        first_producer: int,
        producer_offsets: Sequence[int],
    ) -> int:
        """Buffers ``i`` on ``devices[i]`` of ``nbytes[i]`` made by task ``first_producer
        + producer_offsets[i]``, numbered consecutively; the first's number."""
        first = len(self.buffer_device)
        self.buffer_device.extend(devices)
        self.buffer_bytes.extend(nbytes)
        self.buffer_producer.extend(map(first_producer.__add__, producer_offsets))
        return first

    def edge(self, pred: int, succ: int) -> None:
        self.edge_src.append(pred)
        self.edge_dst.append(succ)

    def compute_task(self, device: int, group: int, name: str) -> int:
        """One compute task, its seconds left at zero for the caller to set."""
        self.kind.append(COMPUTE)
        self.device.append(device)
        self.duration.append(0.0)
        self.group.append(group)
        self.nbytes.append(0)
        self.latency.append(0.0)
        self.names.append(name)
        self.origin.append(self.made_for)
        self.link_count.append(0)
        return len(self.kind) - 1

    def compute_tasks(self, devices: list[int], group: int, names: list[str]) -> list[int]:
        """Consecutive compute tasks, one per device, their seconds left at zero for the
        caller to set; what :meth:`task` does for many."""
        first = self.zero_time_tasks(COMPUTE, devices, [group] * len(devices), names)
        return list(range(first, first + len(devices)))

    def zero_time_tasks(
        self, kind: int, devices: list[int], groups: list[int], names: list[str]
    ) -> int:
        """Consecutive tasks of ``kind`` without links, their seconds at zero (compute
        tasks' for the caller to set); the first one's number."""
        count, first = len(devices), len(self.kind)
        self.kind.extend([kind] * count)
        self.device.extend(devices)
        self.duration.extend([0.0] * count)
        self.group.extend(groups)
        self.nbytes.extend([0] * count)
        self.latency.extend([0.0] * count)
        self.names.extend(names)
        self.origin.extend([self.made_for] * count)
        self.link_count.extend([0] * count)
        return first

    def reads(self, copies: Sequence[Piece], tasks: list[int]) -> None:
        """Each of ``tasks`` reads its copy, made by an earlier task (see :meth:`read`)."""
        self.edge_src.extend([copy.task for copy in copies])
        self.edge_dst.extend(tasks)
        self.read_buffer.extend([copy.buffer for copy in copies])
        self.read_task.extend(tasks)

    def reads_range(
        self, first_task: int, first_buffer: int, stride: int, tasks: list[int]
    ) -> None:
        """Each of ``tasks`` reads one buffer made by consecutive tasks from
        ``first_task``: the ``i``-th reads buffer ``first_buffer + i * stride``."""
        count = len(tasks)
        self.edge_src.extend(range(first_task, first_task + count))
        self.edge_dst.extend(tasks)
        self.read_buffer.extend(range(first_buffer, first_buffer + count * stride, stride))
        self.read_task.extend(tasks)

    def read(self, copy: Piece, task: int) -> None:
        """``task`` reads ``copy``: it waits for the copy's producer and keeps it alive."""
        if copy.task != task:
            self.edge(copy.task, task)
        self.read_buffer.append(copy.buffer)
        self.read_task.append(task)

    def _numpy(self, column: str) -> np.ndarray:
        """A copy of ``column`` as a numpy array of its type."""
        values = getattr(self, column)
        if isinstance(values, array):
            return np.frombuffer(values, dtype=values.typecode).copy()
        return np.fromiter(values, dtype=_TYPECODES[column], count=len(values))

    def freeze(self) -> FrozenTasks:
        """What was built, kept to splice into other builders."""
        shifted = _TASK_NUMBERS + _BUFFER_NUMBERS
        return FrozenTasks(
            num_tasks=len(self.kind),
            num_buffers=len(self.buffer_device),
            names=list(self.names),
            plain={
                c: array(code, getattr(self, c)).tobytes()
                for c, code in _TYPECODES.items()
                if c not in shifted
            },
            numbers={c: self._numpy(c) for c in shifted},
        )

    @classmethod
    def spliced(
        cls, num_devices: int, parts: Sequence[FrozenTasks]
    ) -> tuple[TaskBuilder, np.ndarray, np.ndarray]:
        """A builder holding ``parts`` one after another, and the numbers each part's first
        task and first buffer took. In a part, task or buffer ``i`` is its own ``i``-th,
        and ``part_offset(q) + i`` the ``i``-th of part ``q``: parts built apart may name
        each other's."""
        builder = cls(num_devices, **{c: array(code) for c, code in _TYPECODES.items()})
        first_task = np.cumsum([0] + [p.num_tasks for p in parts], dtype=np.int64)
        first_buffer = np.cumsum([0] + [p.num_buffers for p in parts], dtype=np.int64)
        if not parts:
            return builder, first_task[:-1], first_buffer[:-1]
        for column in parts[0].plain:
            getattr(builder, column).frombytes(b"".join(p.plain[column] for p in parts))
        for column in _TASK_NUMBERS + _BUFFER_NUMBERS:
            first = first_task if column in _TASK_NUMBERS else first_buffer
            numbers = [p.numbers[column] for p in parts]
            values = np.concatenate(numbers).astype(np.int64)
            part = np.repeat(np.arange(len(parts)), [len(n) for n in numbers])
            target = getattr(builder, column)
            target.frombytes(
                renumbered(values, first[part], first).astype(target.typecode).tobytes()
            )
        for p in parts:
            builder.names.extend(p.names)
        return builder, first_task[:-1], first_buffer[:-1]

    def build(
        self,
        persistent: np.ndarray,
        num_links: int,
        device_names,
        link_names,
        more_edges: tuple[np.ndarray, np.ndarray],
    ) -> tuple[TaskGraph, np.ndarray]:
        """The task graph, with ``more_edges`` (``(pred, succ)`` arrays) added, and the
        number each task takes in it: tasks are numbered by the op each was made for, then
        in the order they were added, as a graph compiled op after op in graph order
        numbers them (the simulator breaks ties by number, as TensorFlow's executor by
        the graph's order), whatever order the compiler made them in."""
        n = len(self.kind)
        origin = self._numpy("origin")
        order = stable_order(origin, int(origin.max()) + 1 if n else 0)
        number = np.empty(n, dtype=np.int64)
        number[order] = np.arange(n)
        src = number[np.concatenate([self._numpy("edge_src"), more_edges[0]]).astype(np.int64)]
        dst = number[np.concatenate([self._numpy("edge_dst"), more_edges[1]]).astype(np.int64)]
        succ_ptr, succ_index = distinct_pairs_csr(src, dst, n)
        consumer_ptr, consumer_task = distinct_pairs_csr(
            self._numpy("read_buffer"), number[self._numpy("read_task")], len(self.buffer_device)
        )
        link_count = self._numpy("link_count")
        link_start = np.cumsum(link_count) - link_count
        link_ptr = np.zeros(n + 1, dtype=np.int32)
        link_ptr[1:] = np.cumsum(link_count[order])
        links = np.repeat(link_start[order] - link_ptr[:-1], link_count[order])
        links += np.arange(len(links))
        names = self.names
        graph = TaskGraph(
            num_devices=self.num_devices,
            num_links=num_links,
            task_kind=self._numpy("kind")[order],
            task_device=self._numpy("device")[order],
            task_duration_s=self._numpy("duration")[order],
            task_priority=np.zeros(n, dtype=np.float64),
            task_group=self._numpy("group")[order],
            task_bytes=self._numpy("nbytes")[order],
            task_latency_s=self._numpy("latency")[order],
            link_ptr=link_ptr,
            link_index=self._numpy("link_index")[links],
            link_share=self._numpy("link_share")[links],
            succ_ptr=succ_ptr,
            succ_index=succ_index,
            buffer_device=self._numpy("buffer_device"),
            buffer_bytes=self._numpy("buffer_bytes"),
            buffer_producer=number[self._numpy("buffer_producer")].astype(np.int32),
            consumer_ptr=consumer_ptr,
            consumer_task=consumer_task,
            persistent_bytes=persistent,
            device_names=tuple(device_names),
            link_names=tuple(link_names),
            task_names=tuple(names) if n < 2 else itemgetter(*order.tolist())(names),
        )
        return graph, number


# every column's item type, as its field declares it
_TYPECODES = {f.name: f.metadata["typecode"] for f in fields(TaskBuilder) if f.metadata}
