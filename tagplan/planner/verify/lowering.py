"""What verification by execution (:mod:`.verify`) changes in a graph to run it on this
machine: GPU devices and collectives become CPU devices and sums (:func:`lower_for_cpu`),
the captured variables of a TF2 function become variables of the graph
(:func:`bind_captured`), and the computation is widened to double precision
(:func:`to_float64`), fused batch norms included (:func:`~.batchnorm.lower_batch_norms`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from tagplan.planner.compile.graphdef import CapturedVariable
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.constants import tensor_ints
from tagplan.planner.graph.protos import DTYPE_NAMES, GraphDef, NodeDef
from tagplan.planner.topology import Cluster
from tagplan.planner.verify.batchnorm import lower_batch_norms

__all__ = [
    "bind_captured",
    "lower_for_cpu",
    "replica_bindings",
    "to_float64",
]

_DT_FLOAT, _DT_DOUBLE, _REF = 1, 2, 100
_DTYPES = {name: number for number, name in DTYPE_NAMES.items() if number < _REF}
_WORKER_DEVICE = re.compile(r"^/job:worker/replica:0/task:(\d+)/device:(GPU|CPU):(\d+)$")


def _name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _cpu_devices(cluster: Cluster) -> dict[tuple[int, str, int], str]:
    """Worker device -> its virtual CPU: a GPU's own; a task's CPU (where the state ops
    of :mod:`.state` run) shares that of the task's first GPU."""
    found: dict[tuple[int, str, int], str] = {}
    for d in range(cluster.num_devices):
        machine = int(cluster.device_machine[d])
        device = f"/job:localhost/replica:0/task:0/device:CPU:{d}"
        found[(machine, "GPU", int(cluster.device_local_index[d]))] = device
        found.setdefault((machine, "CPU", 0), device)
    return found


def lower_for_cpu(graph_def: Any, cluster: Cluster) -> Any:
    """A copy of a compiled graph that runs on one CPU device per GPU (module docstring)."""
    cpus = _cpu_devices(cluster)
    by_name = {node.name: node for node in graph_def.node}
    groups: dict[tuple[str, ...], list[Any]] = {}
    for node in graph_def.node:
        if node.op == "NcclAllReduce":
            groups.setdefault(("nccl", node.attr["shared_name"].s.decode()), []).append(node)
        elif node.op == "CollectiveReduceV2":
            keys = []
            for ref in node.input[2:4]:
                key = by_name.get(_name(ref))
                if key is None or key.op != "Const":
                    raise InvalidInput(f"{node.name}: collective keys must be constants")
                keys.append(str(tensor_ints(key.attr["value"].tensor)))
            groups.setdefault(("collective", *keys), []).append(node)
    lowered: dict[str, Any] = {}
    for members in groups.values():
        first = members[0]
        controls = [i for i in first.input if i.startswith("^")]
        data = [next(i for i in m.input if not i.startswith("^")) for m in members]
        total = NodeDef(name=first.name, op="AddN", device=first.device)
        total.input.extend(data + controls)
        total.attr["N"].i = len(members)
        total.attr["T"].type = first.attr["T"].type
        lowered[first.name] = total
        for member in members[1:]:
            copy = NodeDef(name=member.name, op="Identity", device=member.device)
            copy.input.extend([first.name] + [i for i in member.input if i.startswith("^")])
            copy.attr["T"].type = member.attr["T"].type
            lowered[member.name] = copy
    out = GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    for node in graph_def.node:
        new = out.node.add()
        new.CopyFrom(lowered.get(node.name, node))
        if new.device:
            match = _WORKER_DEVICE.match(new.device)
            key = (int(match.group(1)), match.group(2), int(match.group(3))) if match else None
            if key not in cpus:
                raise InvalidInput(f"{node.name}: device {new.device!r} is not in the cluster")
            new.device = cpus[key]
    return out


def to_float64(graph_def: Any) -> Any:
    """A copy of ``graph_def`` computing in double precision: every ``float32`` type
    attribute (``T``, ``dtype``, ``DstT``, ...) becomes ``float64``, every ``float32``
    constant is widened and fused batch norms, which have no ``float64`` kernels, become
    the ops they compute (:func:`~.batchnorm.lower_batch_norms`)."""
    out = GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        for attr in node.attr.values():
            if attr.type in (_DT_FLOAT, _DT_FLOAT + _REF):
                attr.type += _DT_DOUBLE - _DT_FLOAT
            kinds = attr.list.type
            for i, kind in enumerate(kinds):
                if kind in (_DT_FLOAT, _DT_FLOAT + _REF):
                    kinds[i] = kind + _DT_DOUBLE - _DT_FLOAT
            if attr.HasField("tensor") and attr.tensor.dtype == _DT_FLOAT:
                _widen(attr.tensor)
    return lower_batch_norms(out)


def _widen(tensor: Any) -> None:
    shape = [d.size for d in tensor.tensor_shape.dim]
    count = int(np.prod(shape)) if shape else 1
    if tensor.tensor_content:
        values = np.frombuffer(tensor.tensor_content, dtype=np.float32)
    else:  # repeated values fill the shape with the last one, none means zeros
        given = list(tensor.float_val) or [0.0]
        values = np.array(given + given[-1:] * (count - len(given)))
    tensor.ClearField("float_val")
    tensor.dtype = _DT_DOUBLE
    tensor.tensor_content = values.astype(np.float64).tobytes()


def replica_bindings(device_map: Mapping[str, Any]) -> dict[str, CapturedVariable]:
    """Each replica placeholder of a captured variable in a compiled graph's device map ->
    the variable (dtype, shape) it is bound to."""
    return {
        replica["placeholder"]: CapturedVariable(entry["dtype"], entry["shape"])
        for entry in device_map.get("captured_variables", {}).values()
        for replica in entry["replicas"]
    }


def bind_captured(graph_def: Any, captured: Mapping[str, CapturedVariable]) -> Any:
    """A copy of ``graph_def`` whose resource placeholders named in ``captured`` are
    ``VarHandleOp`` s of the value's dtype and shape, on the placeholder's device, each
    its own variable (``shared_name`` its node name): the variables a runtime binds to a
    TF2 function's captured handles (docs/run-a-plan.md), made part of the graph so a
    session can assign, run and read them like a TF1 graph's."""
    out = GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        spec = captured.get(node.name)
        if spec is None:
            continue
        if spec.dtype is None or spec.shape is None:
            raise InvalidInput(
                f"captured variable {node.name}: the graph gives no dtype and shape for its "
                "value (no read or whole write of it), so it cannot be created"
            )
        handle = NodeDef(name=node.name, op="VarHandleOp", device=node.device)
        handle.attr["dtype"].type = _DTYPES[spec.dtype]
        handle.attr["shape"].shape.SetInParent()
        for size in spec.shape:
            handle.attr["shape"].shape.dim.add().size = size
        handle.attr["shared_name"].s = node.name.encode()
        handle.attr["container"].s = b""
        node.CopyFrom(handle)
    return out
