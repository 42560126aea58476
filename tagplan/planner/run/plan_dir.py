"""A plan directory as ``tagplan compile`` and ``tagplan plan -o`` write it
(``distributed.pb``, ``device_map.json``), checked before anything runs: the graph must be
the one the device map was written for. Also what a runner takes from the user: the
worker addresses, the input function, and each batch split over the replica
placeholders by the device map's ``inputs``."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from tagplan.planner.compile.state import graph_digest
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.protos import GraphDef, dtype_name

__all__ = [
    "SYNTHETIC",
    "Plan",
    "load_input_function",
    "load_plan",
    "parse_workers",
    "synthetic_batches",
]

SYNTHETIC = "synthetic"
"""The ``--input`` that trains on random batches shaped like the plan's inputs."""

_REQUIRED = ("tasks", "variables", "inputs", "loss", "train_op", "init", "checkpoint")


@dataclass(frozen=True, eq=False)
class Plan:
    """A checked plan: its graph (this package's ``GraphDef``) and device map."""

    directory: Path
    graph_def: Any
    device_map: dict[str, Any]

    @property
    def num_tasks(self) -> int:
        return len(self.device_map["tasks"])

    def gpus(self, task: int) -> list[int]:
        """The local GPU indices task ``task`` uses."""
        return list(self.device_map["tasks"][str(task)]["gpus"])

    @property
    def captured(self) -> dict[str, dict[str, Any]]:
        """A TF2 function's captured variables: original placeholder -> the device map's
        entry (docs/run-a-plan.md); empty for a TF1 graph."""
        return self.device_map.get("captured_variables", {})

    @property
    def batch_size(self) -> int:
        """Rows of a whole batch: the end of the last replica's rows."""
        return max(
            (hi for pieces in self.device_map["inputs"].values() for _, _, hi in pieces), default=0
        )

    def split(self, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The feed of one whole batch: each replica placeholder gets its rows."""
        inputs = self.device_map["inputs"]
        missing = sorted(set(inputs) - set(batch))
        if missing:
            raise InvalidInput(
                f"the batch has no {missing[0]!r} (the plan's inputs: {', '.join(sorted(inputs))})"
            )
        feed = {}
        for name, pieces in inputs.items():
            value = np.asarray(batch[name])
            rows = value.shape[0] if value.ndim else 0
            if rows != self.batch_size:
                raise InvalidInput(
                    f"input {name!r} has {rows} rows; the plan takes batches of {self.batch_size}"
                )
            for node, lo, hi in pieces:
                feed[f"{node}:0"] = value[lo:hi]
        return feed


def synthetic_batches(plan: Plan, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Whole batches of random data shaped like the plan's inputs, as benchmarks train on
    synthetic data: floating inputs standard normal, integer ones (labels, token ids)
    zero, a value every class count and vocabulary accepts. Shapes and types are the
    replica placeholders'; a dimension other than the batch's must be known."""
    nodes = {node.name: node for node in plan.graph_def.node}
    shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    for name, pieces in plan.device_map["inputs"].items():
        placeholder = nodes[pieces[0][0]]
        dims = [d.size for d in placeholder.attr["shape"].shape.dim][1:]
        if any(size < 0 for size in dims):
            raise InvalidInput(
                f"input {name!r} has a dimension of unknown size {dims}: synthetic batches need "
                "known shapes, give --input module:function"
            )
        dtype = np.dtype(dtype_name(placeholder.attr["dtype"].type))
        shapes[name] = ((plan.batch_size, *dims), dtype)
    rng = np.random.default_rng(seed)
    while True:
        yield {
            name: rng.standard_normal(shape).astype(dtype)
            if np.issubdtype(dtype, np.floating)
            else np.zeros(shape, dtype)
            for name, (shape, dtype) in shapes.items()
        }


def load_plan(directory: Path) -> Plan:
    """Read ``directory`` and refuse it unless its graph matches its device map's digest."""
    if not directory.is_dir():
        raise InvalidInput(f"no plan directory at {directory}")
    paths = {name: directory / name for name in ("distributed.pb", "device_map.json")}
    for name, path in paths.items():
        if not path.is_file():
            raise InvalidInput(
                f"{directory} holds no {name}: write it with tagplan compile or tagplan plan -o"
            )
    try:
        device_map = json.loads(paths["device_map.json"].read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"{paths['device_map.json']} is not JSON: {exc}") from None
    missing = [
        key
        for key in (*_REQUIRED, "graph_sha256")
        if not isinstance(device_map, dict) or key not in device_map
    ]
    if missing:
        raise InvalidInput(
            f"{paths['device_map.json']} names no {missing[0]!r}: compile the plan again "
            "with this version"
        )
    try:
        graph_def = GraphDef.FromString(paths["distributed.pb"].read_bytes())
    except DecodeError:
        raise InvalidInput(f"{paths['distributed.pb']} is not a GraphDef") from None
    if graph_digest(graph_def) != device_map["graph_sha256"]:
        raise InvalidInput(
            f"{paths['distributed.pb']} is not the graph {paths['device_map.json']} was "
            "written for (its digest differs): copy both from the same plan"
        )
    return Plan(directory, graph_def, device_map)


def parse_workers(workers: str, plan: Plan, task: int) -> list[str]:
    """``host:port,host:port,...``: one address per task of ``plan``, ``task`` among them."""
    addresses = [a.strip() for a in workers.split(",") if a.strip()]
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidInput(f"worker address {address!r} is not host:port")
    if len(addresses) != plan.num_tasks:
        raise InvalidInput(
            f"the plan has {plan.num_tasks} tasks; --workers names {len(addresses)} addresses"
        )
    if not 0 <= task < plan.num_tasks:
        raise InvalidInput(f"task {task} is not one of the plan's tasks 0..{plan.num_tasks - 1}")
    return addresses


def load_input_function(spec: str, plan: Plan) -> Callable[[], Iterable[Mapping[str, Any]]]:
    """``module:function``, imported from the Python path and the working directory: a
    function of no arguments returning an iterable of whole batches (dicts of arrays);
    ``synthetic``: random batches shaped like ``plan``'s inputs."""
    if spec == SYNTHETIC:
        return lambda: synthetic_batches(plan)
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise InvalidInput(f"input function {spec!r} is not module:function")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InvalidInput(f"cannot import {module_name!r} for the input function: {exc}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise InvalidInput(f"{module_name} has no function {function_name!r}")
    return function
