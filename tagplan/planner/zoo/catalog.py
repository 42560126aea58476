"""Read the committed model zoo without TensorFlow.

The zoo is ``manifest.json`` (one entry per model, written by
:mod:`tagplan.planner.zoo.generate`) plus ``graphs/<name>.pb.gz``: the gzip of a
binary ``GraphDef`` of one training step on one device. The catalog only reads
these files, so the API and tests can use the zoo without importing TensorFlow.
"""

from __future__ import annotations

import functools
import gzip
import json
import pathlib
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, TypedDict

from tagplan.planner.errors import InvalidInput

__all__ = [
    "MANIFEST_PATH",
    "ZOO_DIR",
    "CapturedVariable",
    "InputSpec",
    "TagReference",
    "ZooModel",
    "clear_cache",
    "get_model",
    "graph_path",
    "list_models",
    "load_manifest",
    "model_from_entry",
    "read_graph_bytes",
]

ZOO_DIR = pathlib.Path(__file__).resolve().parent
MANIFEST_PATH = ZOO_DIR / "manifest.json"
GRAPHS_DIRNAME = "graphs"
MIB = 1024 * 1024


class InputSpec(TypedDict):
    """A data input placeholder. Integer inputs take values in ``[0, high)``."""

    name: str
    dtype: str
    shape: list[int]
    high: NotRequired[int]


class TagReference(TypedDict):
    """A model's row in TAG Table 3: op count and float32 parameter size in MiB."""

    ops: int
    param_size_mib: float


class CapturedVariable(TypedDict):
    """TF2 graphs only: a ``DT_RESOURCE`` placeholder and the variable it stands for."""

    placeholder: str
    variable: str
    dtype: str
    shape: list[int]
    trainable: bool


@dataclass(frozen=True)
class ZooModel:
    """One committed training graph and the facts recorded about it.

    ``style`` is ``"tf1"`` (VarHandleOp + ResourceApplyAdam, runnable on its own
    after ``init_node``) or ``"tf2"`` (a concrete function: variables are resource
    placeholders listed in ``captured_variables``; ``runnable`` is False).
    ``op_count`` is the number of nodes in the GraphDef; ``param_count`` and
    ``param_bytes`` cover the trainable parameters only.
    """

    name: str
    batch_size: int
    style: Literal["tf1", "tf2"]
    description: str
    inputs: list[InputSpec] = field(hash=False)
    loss_node: str
    train_node: str
    init_node: str | None
    runnable: bool
    op_count: int
    param_count: int
    param_bytes: int
    trainable_variables: int
    graph_sha256: str
    tensorflow_version: str
    config: dict[str, Any] = field(hash=False, default_factory=dict)
    captured_variables: list[CapturedVariable] = field(hash=False, default_factory=list)
    tag_table3: TagReference | None = field(hash=False, default=None)

    @property
    def param_mib(self) -> float:
        """Trainable parameter size in MiB, the unit of TAG Table 3."""
        return self.param_bytes / MIB

    @property
    def input_names(self) -> list[str]:
        """Names of the data input placeholders, in manifest order."""
        return [spec["name"] for spec in self.inputs]


def model_from_entry(name: str, entry: dict[str, Any]) -> ZooModel:
    """Build a :class:`ZooModel` from one manifest entry."""
    return ZooModel(
        name=name,
        batch_size=int(entry["batch_size"]),
        style=entry["style"],
        description=entry["description"],
        inputs=[InputSpec(**spec) for spec in entry["inputs"]],
        loss_node=entry["loss_node"],
        train_node=entry["train_node"],
        init_node=entry.get("init_node"),
        runnable=bool(entry["runnable"]),
        op_count=int(entry["op_count"]),
        param_count=int(entry["param_count"]),
        param_bytes=int(entry["param_bytes"]),
        trainable_variables=int(entry["trainable_variables"]),
        graph_sha256=entry["graph_sha256"],
        tensorflow_version=entry["tensorflow_version"],
        config=dict(entry.get("config", {})),
        captured_variables=[CapturedVariable(**c) for c in entry.get("captured_variables", [])],
        tag_table3=TagReference(**entry["tag_table3"]) if entry.get("tag_table3") else None,
    )


def load_manifest(path: pathlib.Path | None = None) -> dict[str, ZooModel]:
    """All models of a manifest file (default: the committed one), in file order."""
    if path is None:
        return dict(_committed())
    return _parse(path)


def _parse(path: pathlib.Path) -> dict[str, ZooModel]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return {name: model_from_entry(name, entry) for name, entry in data["models"].items()}


@functools.lru_cache(maxsize=1)
def _committed() -> dict[str, ZooModel]:
    return _parse(MANIFEST_PATH)


def clear_cache() -> None:
    """Forget the parsed committed manifest (after the generator rewrote it)."""
    _committed.cache_clear()


def list_models() -> list[ZooModel]:
    """Every committed model: the six TAG benchmarks first, then the tiny ones."""
    return list(_committed().values())


def get_model(name: str) -> ZooModel:
    """The committed model called ``name``; ``InvalidInput`` names the known ones."""
    models = _committed()
    try:
        return models[name]
    except KeyError:
        known = ", ".join(models)
        raise InvalidInput(f"unknown zoo model {name!r}; known models: {known}") from None


def graph_path(name: str) -> pathlib.Path:
    """Path of the committed ``<name>.pb.gz`` (gzip of a binary GraphDef)."""
    get_model(name)
    return ZOO_DIR / GRAPHS_DIRNAME / f"{name}.pb.gz"


def read_graph_bytes(name: str) -> bytes:
    """The serialized (uncompressed) GraphDef of model ``name``."""
    return gzip.decompress(graph_path(name).read_bytes())
