"""``--cpu``: a plan tried on machines without GPUs. Each GPU ``i`` of a task becomes
the task's CPU device ``i`` (the server makes as many), and the ``NcclAllReduce`` s of one
``shared_name``, which have no CPU kernel, become ``CollectiveReduceV2`` s over the same
devices, with group and instance keys after the plan's own; everything else runs as
planned, cross-machine collectives included."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from tagplan.planner.graph.constants import tensor_ints
from tagplan.planner.graph.protos import GraphDef, NodeDef

__all__ = ["on_cpu"]

_DT_INT32 = 3
_GPU = re.compile(r"/device:GPU:(\d+)$")


def _keys(graph_def: Any) -> tuple[int, int]:
    """The largest group and instance keys of the graph's collectives."""
    by_name = {node.name: node for node in graph_def.node}
    found = [(0, 0)]
    for node in graph_def.node:
        if node.op == "CollectiveReduceV2":
            group, instance = (
                tensor_ints(by_name[ref.split(":")[0]].attr["value"].tensor)[0]
                for ref in node.input[2:4]
            )
            found.append((group, instance))
    return max(g for g, _ in found), max(i for _, i in found)


def _const(name: str, device: str, value: int) -> Any:
    node = NodeDef(name=name, op="Const", device=device)
    node.attr["dtype"].type = _DT_INT32
    node.attr["value"].tensor.dtype = _DT_INT32
    node.attr["value"].tensor.tensor_content = np.array(value, np.int32).tobytes()
    return node


def _collective(member: Any, keys: list[str]) -> Any:
    node = NodeDef(name=member.name, op="CollectiveReduceV2", device=member.device)
    data = [i for i in member.input if not i.startswith("^")]
    node.input.extend([*data, *keys, *(i for i in member.input if i.startswith("^"))])
    node.attr["T"].CopyFrom(member.attr["T"])
    node.attr["merge_op"].s = b"Add"
    node.attr["final_op"].s = b"Id"
    node.attr["communication_hint"].s = b"auto"
    node.attr["timeout_seconds"].f = 0.0
    node.attr["is_stateless"].b = False
    node.attr["Nordering_token"].i = 0
    node.attr["max_subdivs_per_device"].i = -1
    return node


def on_cpu(graph_def: Any) -> Any:
    """A copy of a plan's graph for CPU devices (module docstring)."""
    out = GraphDef()
    out.CopyFrom(graph_def)
    groups: dict[str, list[Any]] = {}
    for node in out.node:
        node.device = _GPU.sub(r"/device:CPU:\1", node.device)
        if node.op == "NcclAllReduce":
            groups.setdefault(node.attr["shared_name"].s.decode(), []).append(node)
    group_key, instance_key = _keys(out)
    group_keys: dict[tuple[str, ...], int] = {}
    replaced: dict[str, Any] = {}
    for members in groups.values():
        devices = tuple(sorted(m.device for m in members))
        group = group_keys.setdefault(devices, group_key + len(group_keys) + 1)
        instance_key += 1
        for member in members:
            values = {"group_size": len(members), "group_key": group, "instance_key": instance_key}
            consts = [_const(f"{member.name}/{k}", member.device, v) for k, v in values.items()]
            out.node.extend(consts)
            replaced[member.name] = _collective(member, [c.name for c in consts])
    for node in out.node:
        if node.name in replaced:
            node.CopyFrom(replaced[node.name])
    return out
