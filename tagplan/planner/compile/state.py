"""Variable state of a distributed graph: the ops that initialize, save and restore it
under the original variable names, so a plan starts training and moves weights in and
out like the single-device graph it came from (docs/run-a-plan.md).

* **init**: the original initializers (the assignments the original ``init`` runs, or
  every assignment outside the training step when it has none) are copied once, on the
  CPU of the task holding the variable's first replica, and each value is assigned to
  every replica: one run of ``init`` gives all replicas of a variable the same value,
  optimizer slots and Adam's powers included. The copies keep their seeds, so the values
  are those the original ``init`` gives.
* **save** and **restore** are what ``tf.compat.v1.train.Saver`` builds (V2 format, one
  shard), on task 0's CPU: feed the checkpoint prefix to ``save/Const``; fetch
  ``save/control_dependency`` to write every variable's first replica under its original
  name; run ``save/restore_all`` to fill every replica from such a checkpoint. A
  checkpoint therefore goes from the single-device graph to the plan and back.

:func:`graph_digest` names a graph's content, so a runner can refuse a ``distributed.pb``
that is not the one its device map was written for.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any

from tagplan.planner.compile.node_bytes import NodeTemplate
from tagplan.planner.graph.protos import NodeDef

__all__ = ["graph_digest", "state_ops", "task_cpu"]

_DT_STRING = 7
_ASSIGN_OPS = ("AssignVariableOp", "Assign")
_CHIEF_CPU = "/job:worker/replica:0/task:0/device:CPU:0"


def _name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def task_cpu(device: str) -> str:
    """The CPU of the task that ``device`` (a worker GPU) belongs to."""
    return device.rsplit("/device:", 1)[0] + "/device:CPU:0"


def graph_digest(graph_def: Any) -> str:
    """SHA-256 of the graph's deterministic serialization (map fields in key order)."""
    return hashlib.sha256(graph_def.SerializeToString(deterministic=True)).hexdigest()


class _StateBuilder:
    """Copies initializers and adds the checkpoint ops to a compiled graph's nodes."""

    def __init__(
        self,
        source: Any,
        nodes: Mapping[str, Any],
        variables: Mapping[str, list[str]],
        name: Callable[[str], str],
    ) -> None:
        self.originals = {node.name: node for node in source.node}
        self.nodes, self.variables, self.name = nodes, variables, name
        self.added: list[tuple[str, Any]] = []  # (name, NodeDef or its serialization)
        self.copied: dict[str, str] = {}  # original initializer node -> its copy

    def node(self, wanted: str, op: str, device: str, inputs: list[str], **types: Any) -> Any:
        node = NodeDef(name=self.name(wanted), op=op, device=device)
        node.input.extend(inputs)
        for key, value in types.items():
            if isinstance(value, list):
                node.attr[key].list.type.extend(value)
            else:
                node.attr[key].type = value
        self.added.append((node.name, node))
        return node

    def replica_node(
        self, template: NodeTemplate, wanted: str, device: str, inputs: list[str]
    ) -> str:
        """One of the nodes a variable gets per replica, alike but for name, device and
        inputs: ``template``'s node, its shapes kept."""
        name = self.name(wanted)
        self.added.append((name, template.instance(name, inputs, device, template.shapes)))
        return name

    def strings(self, wanted: str, device: str, values: list[str], vector: bool = True) -> str:
        node = self.node(wanted, "Const", device, [], dtype=_DT_STRING)
        tensor = node.attr["value"].tensor
        tensor.dtype = _DT_STRING
        if vector:
            tensor.tensor_shape.dim.add().size = len(values)
        tensor.string_val.extend(v.encode() for v in values)
        return node.name

    def dtype(self, variable: str) -> int:
        return int(self.nodes[self.variables[variable][0]].attr["dtype"].type)

    def is_resource(self, variable: str) -> bool:
        return self.nodes[self.variables[variable][0]].op == "VarHandleOp"

    # init --------------------------------------------------------------------------------
    def initializers(self, step: set[str]) -> dict[str, Any]:
        """Original variable -> the assignment that initializes it: among the ancestors of
        ``init`` when the graph has one, else any assignment outside the step."""
        candidates = self.originals
        init = self.originals.get("init")
        if init is not None:
            seen, todo = set(), [init.name]
            while todo:
                current = todo.pop()
                if current in seen or current not in self.originals:
                    continue
                seen.add(current)
                todo.extend(_name(r) for r in self.originals[current].input)
            candidates = {n: self.originals[n] for n in sorted(seen)}
        found: dict[str, Any] = {}
        for node in candidates.values():
            if node.op in _ASSIGN_OPS and node.name not in step and node.input:
                target = _name(node.input[0])
                if target in self.variables:
                    found.setdefault(target, node)
        return found

    def copy(self, ref: str, device: str) -> str:
        """``ref`` of the original graph in the compiled one: a variable's first replica, or
        a copy of the initializer node (and its ancestors) on ``device``."""
        control, source = ref.startswith("^"), _name(ref)
        suffix = ref.lstrip("^")[len(source) :]
        if source in self.variables:
            target = self.variables[source][0]
        elif source in self.copied:
            target = self.copied[source]
        else:
            original = self.originals[source]
            target = self.name(source)
            self.copied[source] = target
            node = NodeDef()
            node.CopyFrom(original)
            node.name, node.device = target, device
            if "_class" in node.attr:
                del node.attr["_class"]
            del node.input[:]
            node.input.extend(self.copy(r, device) for r in original.input)
            self.added.append((target, node))
        return f"^{target}" if control else target + suffix

    def init(self, step: set[str]) -> tuple[str, list[str]]:
        """The init op and the variables it leaves uninitialized."""
        assigns = []
        initializers = self.initializers(step)
        for variable, assign in initializers.items():
            replicas = self.variables[variable]
            where = task_cpu(self.nodes[replicas[0]].device)
            value = self.copy(assign.input[1], where)
            controls = [self.copy(r, where) for r in assign.input[2:]]
            template = NodeTemplate(assign)
            assigns += [
                self.replica_node(
                    template,
                    f"{replica}/Assign",
                    self.nodes[replica].device,
                    [replica, value, *controls],
                )
                for replica in replicas
            ]
        init = self.node("init", "NoOp", _CHIEF_CPU, [])
        init.input.extend(f"^{a}" for a in assigns)
        return init.name, sorted(set(self.variables) - set(initializers))

    # checkpoints -------------------------------------------------------------------------
    def checkpoint(self, device: str) -> dict[str, str]:
        """Saver-compatible save and restore ops on ``device``; their names (those of
        ``tf.compat.v1.train.Saver``'s ``SaverDef``: filename, save and restore). A graph
        without variables of its own (a TF2 function's are captured) gets the three
        nodes, saving and restoring nothing: ``SaveV2`` takes at least one tensor."""
        names = sorted(self.variables)
        default = self.strings("save/filename/input", device, ["model"], vector=False)
        filename = self.node("save/filename", "PlaceholderWithDefault", device, [default])
        prefix = self.node("save/Const", "PlaceholderWithDefault", device, [filename.name])
        for node in (filename, prefix):
            node.attr["dtype"].type = _DT_STRING
            node.attr["shape"].shape.SetInParent()
        saved = self.save(prefix.name, names, device) if names else []
        done = self.node("save/control_dependency", "Identity", device, [prefix.name, *saved])
        done.attr["T"].type = _DT_STRING
        restored = self.restore(prefix.name, names, device) if names else []
        restore_all = self.node("save/restore_all", "NoOp", device, restored)
        return {"filename": prefix.name, "save": done.name, "restore": restore_all.name}

    def save(self, prefix: str, names: list[str], device: str) -> list[str]:
        """``SaveV2`` of the first replica of each variable of ``names``; its control input."""
        reads = []
        for variable in names:
            first = self.variables[variable][0]
            where = self.nodes[first].device
            if self.is_resource(variable):
                read = self.node(f"{first}/save_read", "ReadVariableOp", where, [first])
                read.attr["dtype"].type = self.dtype(variable)
            else:
                read = self.node(f"{first}/save_read", "Identity", where, [first])
                read.attr["T"].type = self.dtype(variable)
            reads.append(read.name)
        keys = self.strings("save/SaveV2/tensor_names", device, names)
        slices = self.strings("save/SaveV2/shape_and_slices", device, [""] * len(names))
        save = self.node("save/SaveV2", "SaveV2", device, [prefix, keys, slices, *reads])
        save.attr["dtypes"].list.type.extend(self.dtype(v) for v in names)
        return [f"^{save.name}"]

    def restore(self, prefix: str, names: list[str], device: str) -> list[str]:
        """``RestoreV2`` of ``names`` assigned to every replica; the assignments' control
        inputs."""
        keys = self.strings("save/RestoreV2/tensor_names", device, names)
        slices = self.strings("save/RestoreV2/shape_and_slices", device, [""] * len(names))
        restore = self.node("save/RestoreV2", "RestoreV2", device, [prefix, keys, slices])
        restore.attr["dtypes"].list.type.extend(self.dtype(v) for v in names)
        assigns = []
        for slot, variable in enumerate(names):
            value = f"{restore.name}:{slot}" if slot else restore.name
            assign = _restore_assign(self.is_resource(variable), self.dtype(variable))
            template, wanted = NodeTemplate(assign), f"save/{assign.op}"
            assigns += [
                "^" + self.replica_node(template, wanted, self.nodes[r].device, [r, value])
                for r in self.variables[variable]
            ]
        return assigns


def _restore_assign(resource: bool, dtype: int) -> Any:
    """The assignment of a restored value to a replica: of a resource or a ref variable."""
    if resource:
        node = NodeDef(op="AssignVariableOp")
        node.attr["dtype"].type = dtype
    else:
        node = NodeDef(op="Assign")
        node.attr["T"].type = dtype
        node.attr["validate_shape"].b = True
        node.attr["use_locking"].b = True
    return node


def state_ops(
    source: Any,
    nodes: Mapping[str, Any],
    variables: Mapping[str, list[str]],
    step: set[str],
    name: Callable[[str], str],
) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """The init, save and restore ops of a compiled graph and their device-map entries.

    ``source`` is the original graph, ``nodes`` the compiled graph's nodes by name,
    ``variables`` each original variable's replica nodes, ``step`` the original nodes
    of the training step (never initializers) and ``name`` hands out unused node names.
    The ops come as ``(name, node)`` pairs, a node a ``NodeDef`` or its deterministic
    serialization (:mod:`.node_bytes`).
    """
    builder = _StateBuilder(source, nodes, variables, name)
    init, uninitialized = builder.init(step)
    checkpoint = builder.checkpoint(_CHIEF_CPU)
    entries = {"init": init, "uninitialized": uninitialized, "checkpoint": checkpoint}
    return builder.added, entries
