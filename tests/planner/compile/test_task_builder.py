"""The task-graph builder: numbering, repeated dependencies and reads, CSR order."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tagplan.planner.compile.task_builder import TaskBuilder, part_offset
from tagplan.planner.sim.taskgraph import COMPUTE, TRANSFER


class _Piece(NamedTuple):
    task: int
    buffer: int


def test_repeated_edges_and_reads_are_kept_once_in_ascending_order() -> None:
    out = TaskBuilder(num_devices=2)
    a = out.task(COMPUTE, 0, 1.0, 0, "a")
    b = out.task(COMPUTE, 1, 2.0, 0, "b")
    send = out.task(TRANSFER, -1, 0.5, 0, "send", nbytes=8, links=[0, 3])
    assert (a, b, send) == (0, 1, 2)
    buffer = out.buffer(0, 8, a)
    out.read(_Piece(a, buffer), send)
    out.read(_Piece(a, buffer), send)  # a second read of the same buffer by the same task
    out.edge(b, send)
    tasks = out.compute_tasks([0, 1], 1, ["c/replica_0", "c/replica_1"])
    assert tasks == [3, 4]
    out.reads([_Piece(a, buffer), _Piece(a, buffer)], tasks)
    extra = (np.array([b, a]), np.array([4, 4]))
    graph, number = out.build(
        np.zeros(2, dtype=np.int64), 4, ["g0", "g1"], ["l0", "l1", "l2", "l3"], extra
    )
    assert number.tolist() == [0, 1, 2, 3, 4]  # made for one op: numbered as added
    graph.validate()
    successors = [
        graph.succ_index[graph.succ_ptr[t] : graph.succ_ptr[t + 1]].tolist() for t in range(5)
    ]
    assert successors == [[2, 3, 4], [2, 4], [], [], []]
    assert graph.consumer_task.tolist() == [2, 3, 4]
    assert graph.link_index[graph.link_ptr[2] : graph.link_ptr[3]].tolist() == [0, 3]
    assert graph.task_duration_s.tolist() == [1.0, 2.0, 0.5, 0.0, 0.0]  # the caller sets them
    assert graph.task_group.tolist() == [0, 0, 0, 1, 1]
    assert graph.task_names == ("a", "b", "send", "c/replica_0", "c/replica_1")


def test_range_reads_and_buffers_are_what_one_at_a_time_gives() -> None:
    """``buffers`` and ``reads_range`` add what ``buffer`` and ``read`` add one by one."""
    ranged, single = TaskBuilder(num_devices=2), TaskBuilder(num_devices=2)
    for out in (ranged, single):
        for device in (0, 1, 0):
            out.task(COMPUTE, device, 1.0, 0, f"producer on {device}")
        out.compute_tasks([0, 1, 0], 1, ["r0", "r1", "r2"])
    # two outputs per producer: instance i's k-th output is buffer 2 i + k
    assert ranged.buffers([0, 0, 1, 1, 0, 0], [8, 4, 8, 4, 8, 4], 0, [0, 0, 1, 1, 2, 2]) == 0
    ranged.reads_range(0, 1, 2, [3, 4, 5])  # the second output of each producer
    for i, device in enumerate((0, 1, 0)):
        single.buffer(device, 8, i)
        single.buffer(device, 4, i)
    for i, reader in enumerate((3, 4, 5)):
        single.read(_Piece(i, 2 * i + 1), reader)
    graphs = [
        out.build(np.zeros(2, dtype=np.int64), 0, ["g0", "g1"], [], (np.zeros(0), np.zeros(0)))[0]
        for out in (ranged, single)
    ]
    for name in ("succ_ptr", "succ_index", "buffer_device", "buffer_bytes", "buffer_producer"):
        np.testing.assert_array_equal(getattr(graphs[0], name), getattr(graphs[1], name))
    np.testing.assert_array_equal(graphs[0].consumer_task, graphs[1].consumer_task)
    assert graphs[0].consumer_ptr.tolist() == [0, 0, 1, 1, 2, 2, 3]
    assert graphs[0].buffer_producer.tolist() == [0, 0, 1, 1, 2, 2]


def _graph(out: TaskBuilder):
    return out.build(np.zeros(2, dtype=np.int64), 2, ["g0", "g1"], ["l0", "l1"], _NO_EDGES)


_NO_EDGES = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def test_tasks_are_numbered_by_the_op_they_are_made_for_then_as_added() -> None:
    out = TaskBuilder(2)
    out.made_for = 7
    late = out.task(COMPUTE, 0, 1.0, 0, "late")
    out.made_for = 2
    early = out.compute_task(1, 0, "early")
    send = out.task(TRANSFER, -1, 0.5, 0, "send", links=[1, 0], shares=[0.5, 1.0])
    out.edge(early, send)
    out.edge(send, late)
    out.read(_Piece(early, out.buffer(1, 8, early)), send)
    graph, number = _graph(out)
    assert number.tolist() == [2, 0, 1]
    assert graph.task_names == ("early", "send", "late")
    assert graph.task_duration_s.tolist() == [0.0, 0.5, 1.0]
    assert graph.succ_index.tolist() == [1, 2] and graph.succ_ptr.tolist() == [0, 1, 2, 2]
    assert graph.link_ptr.tolist() == [0, 0, 2, 2]
    assert graph.link_index.tolist() == [1, 0] and graph.link_share.tolist() == [0.5, 1.0]
    assert graph.buffer_producer.tolist() == [0] and graph.consumer_task.tolist() == [1]


def test_spliced_parts_name_their_own_and_each_others_tasks_and_buffers() -> None:
    first = TaskBuilder(2)  # two tasks, a buffer
    a = first.task(COMPUTE, 0, 1.0, 0, "a")
    b = first.task(COMPUTE, 0, 1.0, 0, "b")
    first.edge(a, b)
    made = first.buffer(0, 8, a)
    second = TaskBuilder(2)  # a transfer reading the first part's buffer, feeding its b
    send = second.task(TRANSFER, -1, 0.5, 0, "send", links=[0])
    other = part_offset(0)  # part 0, numbered from its second part
    second.read(_Piece(other + a, other + made), send)
    second.edge(send, other + b)
    second.buffer(1, 8, send)
    out, first_task, first_buffer = TaskBuilder.spliced(2, [first.freeze(), second.freeze()])
    assert first_task.tolist() == [0, 2] and first_buffer.tolist() == [0, 1]
    graph, _ = _graph(out)
    assert graph.task_names == ("a", "b", "send")
    successors = [
        graph.succ_index[graph.succ_ptr[t] : graph.succ_ptr[t + 1]].tolist() for t in range(3)
    ]
    assert successors == [[1, 2], [], [1]]
    assert graph.buffer_producer.tolist() == [0, 2]
    assert graph.consumer_ptr.tolist() == [0, 1, 1] and graph.consumer_task.tolist() == [2]
