"""A TF2 plan's captured variables on the runtime (docs/run-a-plan.md, "Captured
variables"): a TF2 function's graph holds no variables, only the ``DT_RESOURCE``
placeholders its caller binds, so ``tagplan run`` binds them as verification does.

Each replica placeholder becomes a variable of its own on its device
(:func:`~tagplan.planner.verify.lowering.bind_captured`); every replica of a captured
variable is assigned the same value, drawn as verification draws it (so a plan starts
from the values ``tagplan verify`` checked) or read from a checkpoint; a checkpoint
holds the first replica of each. Checkpoints are TensorFlow's V2 format keyed by the
variables' names (the ``variable`` of the device map, else the placeholder's): the
format of a TF1 plan's checkpoints, which ``tf.compat.v1.train.Saver`` with a dict of
variables writes and ``tf.train.load_checkpoint`` reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tagplan.planner.compile.graphdef import CapturedVariable
from tagplan.planner.errors import InvalidInput
from tagplan.planner.run.plan_dir import Plan
from tagplan.planner.verify.lowering import bind_captured, replica_bindings
from tagplan.planner.verify.reference import assigner, captured_value, reader
from tagplan.planner.verify.values import ValueStore

__all__ = ["SEED", "assigns", "bind", "checkpoint_values", "drawn_values", "replicas", "saver"]

SEED = 0
"""Verification's default seed: the initial values a plan starts from are those
``tagplan verify`` draws for the same graph."""


def _spec(entry: Mapping[str, Any]) -> CapturedVariable:
    return CapturedVariable(entry["dtype"], entry["shape"])


def _key(placeholder: str, entry: Mapping[str, Any]) -> str:
    """The variable's name in a checkpoint: its own, else its original placeholder's."""
    return entry["variable"] or placeholder


def replicas(plan: Plan) -> dict[str, list[str]]:
    """Each captured variable, by its checkpoint name -> its replica placeholders."""
    return {
        _key(name, entry): [r["placeholder"] for r in entry["replicas"]]
        for name, entry in plan.captured.items()
    }


def bind(plan: Plan, graph_def: Any) -> Any:
    """``graph_def`` with each replica placeholder a ``VarHandleOp`` of its own."""
    return bind_captured(graph_def, replica_bindings(plan.device_map))


def drawn_values(plan: Plan, store: ValueStore) -> None:
    """Verification's initial value of every captured variable (drawn from :data:`SEED`
    and the original placeholder's name) into ``store``, under that name."""
    for name, entry in plan.captured.items():
        store.put(name, captured_value(name, _spec(entry), entry["trainable"], SEED, False))


def checkpoint_values(tf: Any, plan: Plan, prefix: str, store: ValueStore) -> None:
    """Every captured variable's value from checkpoint ``prefix`` into ``store`` under its
    original placeholder's name; refuse a checkpoint that lacks one or holds another shape
    or type."""
    try:
        checkpoint = tf.train.load_checkpoint(prefix)
        shapes = checkpoint.get_variable_to_shape_map()
        dtypes = checkpoint.get_variable_to_dtype_map()
        for name, entry in plan.captured.items():
            key = _key(name, entry)
            if key not in shapes:
                raise InvalidInput(f"{prefix} holds no {key!r} (captured variable {name})")
            found = (dtypes[key].name, list(shapes[key]))
            if found != (entry["dtype"], entry["shape"]):
                raise InvalidInput(
                    f"{prefix}: {key!r} is {found[0]} {found[1]}; the plan's is "
                    f"{entry['dtype']} {entry['shape']}"
                )
            store.put(name, checkpoint.get_tensor(key))
    except tf.errors.OpError as exc:
        raise InvalidInput(f"cannot restore {prefix}: {exc.message}".splitlines()[0]) from None


def assigns(tf: Any, graph: Any, plan: Plan) -> dict[str, tuple[Any, Any, str]]:
    """Replica placeholder -> ``(value placeholder, assign op, original name)``, for
    :func:`~tagplan.planner.verify.reference.assign_values`: every replica of a captured
    variable gets the value stored under its original placeholder's name."""
    return {
        replica["placeholder"]: (*assigner(tf, graph, replica["placeholder"]), name)
        for name, entry in plan.captured.items()
        for replica in entry["replicas"]
    }


def saver(tf: Any, graph: Any, plan: Plan, device: str) -> tuple[Any, Any]:
    """A string placeholder for a checkpoint prefix and the op, on ``device`` (task 0's
    CPU: the files are that process's), that writes every captured variable's first
    replica there under its checkpoint name."""
    names = replicas(plan)
    reads = [reader(tf, graph, nodes[0]) for nodes in names.values()]
    with graph.as_default(), tf.device(device):
        prefix = tf.compat.v1.placeholder(tf.string, [], name="tagplan_run/captured_prefix")
        save = tf.raw_ops.SaveV2(
            prefix=prefix,
            tensor_names=list(names),
            shape_and_slices=[""] * len(names),
            tensors=reads,
        )
    return prefix, save
