"""The task-graph builder: numbering, repeated dependencies and reads, CSR order."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tagplan.planner.compile.task_builder import TaskBuilder
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
    tasks = out.compute_tasks([0, 1], [3.0, 4.0], 1, ["c/replica_0", "c/replica_1"])
    assert tasks == [3, 4]
    out.reads([_Piece(a, buffer), _Piece(a, buffer)], tasks)
    extra = (np.array([b, a]), np.array([4, 4]))
    graph = out.build(np.zeros(2, dtype=np.int64), 4, ["g0", "g1"], ["l0", "l1", "l2", "l3"], extra)
    graph.validate()
    successors = [
        graph.succ_index[graph.succ_ptr[t] : graph.succ_ptr[t + 1]].tolist() for t in range(5)
    ]
    assert successors == [[2, 3, 4], [2, 4], [], [], []]
    assert graph.consumer_task.tolist() == [2, 3, 4]
    assert graph.link_index[graph.link_ptr[2] : graph.link_ptr[3]].tolist() == [0, 3]
    assert graph.task_duration_s.tolist() == [1.0, 2.0, 0.5, 3.0, 4.0]
    assert graph.task_group.tolist() == [0, 0, 0, 1, 1]
    assert graph.task_names == ("a", "b", "send", "c/replica_0", "c/replica_1")
