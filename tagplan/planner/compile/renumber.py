"""Move a compiled distributed graph to another numbering of the same cluster
(docs/design.md §9, "Repeat jobs and warm starts").

A plan compiled for one cluster runs on an isomorphic one (machines renamed, listed in
another order, GPU slots reordered) once every node's device string names the
corresponding GPU or CPU: ``/job:worker/replica:0/task:<machine>/device:GPU:<slot>`` of
the source becomes the target's string for the device the isomorphism maps it to, and a
task's CPU follows its machine. Nothing else in the graph names a device — collectives
find their peers by group and instance keys, variables by node name — so the renumbered
graph computes what the compiled one does; its device map names the target's machines
and carries the new graph's digest. This costs a pass over the nodes instead of a
compilation (BERT-Large on 16 GPUs: 230,000 nodes in about a second instead of six).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from tagplan.planner.compile.graphdef import task_map, worker_device
from tagplan.planner.compile.state import task_cpu
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.protos import GraphDef
from tagplan.planner.topology import Cluster

__all__ = ["renumber_graph"]


def _device_strings(source: Cluster, target: Cluster, devices: np.ndarray) -> dict[str, str]:
    """Source device string -> target device string, GPUs and their tasks' CPUs."""
    strings: dict[str, str] = {}
    for d, to in enumerate(devices.tolist()):
        a, b = worker_device(source, d), worker_device(target, int(to))
        strings[a] = b
        cpu_a, cpu_b = task_cpu(a), task_cpu(b)
        if strings.setdefault(cpu_a, cpu_b) != cpu_b:
            raise InvalidInput("the device mapping splits a machine; the clusters differ")
    return strings


def renumber_graph(
    serialized: bytes,
    device_map: Mapping[str, Any],
    source: Cluster,
    target: Cluster,
    devices: np.ndarray,
) -> tuple[bytes, dict[str, Any]]:
    """The compiled graph ``serialized`` (with its ``device_map``) for ``source``, moved to
    ``target`` where source device ``d`` is target device ``devices[d]`` (module
    docstring). Returns the new graph's deterministic serialization and device map."""
    graph_def = GraphDef()
    graph_def.ParseFromString(serialized)
    strings = _device_strings(source, target, devices)
    for node in graph_def.node:
        if node.device:
            try:
                node.device = strings[node.device]
            except KeyError:
                raise InvalidInput(
                    f"node {node.name!r} is on {node.device!r}, not a device of the cluster "
                    "it was compiled for"
                ) from None
    data = graph_def.SerializeToString(deterministic=True)
    digest = hashlib.sha256(data).hexdigest()  # graph_digest's, from the bytes at hand
    renumbered = {**device_map, "tasks": task_map(target), "graph_sha256": digest}
    return data, renumbered
