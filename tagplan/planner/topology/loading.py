"""Reading cluster specs from mappings, JSON/YAML text and files, and named clusters.

Every failure is an :class:`InvalidInput` whose message names the field and the
problem, e.g. ``machines[1] (m1).intra_bandwidth_gbps: Input should be greater than 0
(got 0)``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ValidationError

from ..errors import InvalidInput
from ..validation import describe_validation_error
from .cluster import Cluster
from .named import named_cluster_spec
from .schema import ClusterSpec

__all__ = [
    "ClusterSource",
    "dumps_cluster_spec",
    "load_cluster",
    "load_cluster_spec",
    "loads_cluster_spec",
    "parse_cluster_spec",
]

ClusterSource = Cluster | ClusterSpec | Mapping[str, Any] | str | os.PathLike[str]
"""Anything :func:`load_cluster` accepts."""

_FILE_SUFFIXES: dict[str, Literal["json", "yaml"]] = {
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
}
_GPUS_FORM_TAGS = frozenset({"count", "list"})


def parse_cluster_spec(data: Mapping[str, Any] | ClusterSpec) -> ClusterSpec:
    """Validate a mapping (parsed JSON/YAML) as a :class:`ClusterSpec`."""
    if isinstance(data, ClusterSpec):
        return data.model_copy(deep=True)
    if not isinstance(data, Mapping):
        raise InvalidInput(
            f"a cluster spec must be a mapping with 'machines', got {type(data).__name__}"
        )
    try:
        return ClusterSpec.model_validate(dict(data))
    except ValidationError as exc:
        raise InvalidInput(
            describe_validation_error(
                exc,
                "cluster spec",
                location=lambda loc: _render_loc(loc, data),
                unknown_field="unknown field (field names carry their unit, e.g. bandwidth_gbps)",
            )
        ) from None


def loads_cluster_spec(text: str, *, fmt: Literal["json", "yaml"] | None = None) -> ClusterSpec:
    """Parse JSON or YAML text (``fmt=None``: YAML, which also reads JSON)."""
    try:
        data = json.loads(text) if fmt == "json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise InvalidInput(f"cluster spec is not valid {fmt or 'YAML/JSON'}: {exc}") from None
    return parse_cluster_spec(data)


def load_cluster_spec(path: str | os.PathLike[str]) -> ClusterSpec:
    """Read a ``.json``, ``.yaml`` or ``.yml`` cluster file."""
    file = Path(path)
    fmt = _FILE_SUFFIXES.get(file.suffix.lower())
    if fmt is None:
        raise InvalidInput(f"cluster file {str(path)!r} must end in .json, .yaml or .yml")
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"cluster file {str(path)!r} does not exist") from None
    except OSError as exc:
        raise InvalidInput(f"cannot read cluster file {str(path)!r}: {exc}") from None
    return loads_cluster_spec(text, fmt=fmt)


def load_cluster(source: ClusterSource) -> Cluster:
    """A :class:`Cluster` from whatever names one.

    ``source`` may be a :class:`Cluster` (returned as is), a :class:`ClusterSpec`, a
    mapping, a named cluster (``testbed``, ``cloud``, ``random:SEED``), a path to a
    ``.json``/``.yaml``/``.yml`` file, or JSON/YAML text (recognized by a newline or a
    leading ``{``).
    """
    if isinstance(source, Cluster):
        return source
    if isinstance(source, ClusterSpec | Mapping):
        return Cluster.from_spec(parse_cluster_spec(source))
    if isinstance(source, os.PathLike):
        return Cluster.from_spec(load_cluster_spec(source))
    if not isinstance(source, str):
        raise InvalidInput(f"cannot load a cluster from a {type(source).__name__}")
    text = source.strip()
    if "\n" in text or text.startswith("{"):
        return Cluster.from_spec(loads_cluster_spec(text))
    if Path(text).suffix.lower() in _FILE_SUFFIXES:
        return Cluster.from_spec(load_cluster_spec(text))
    return Cluster.from_spec(named_cluster_spec(text))


def dumps_cluster_spec(
    spec: ClusterSpec | Cluster, *, fmt: Literal["json", "yaml"] = "yaml"
) -> str:
    """Serialize a spec (or a cluster's spec) as JSON or YAML that loads back the same."""
    if isinstance(spec, Cluster):
        spec = spec.spec
    data = spec.model_dump(mode="json", exclude_none=True)
    if not data["gpu_types"]:
        del data["gpu_types"]
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None)


def _render_loc(loc: tuple[int | str, ...], data: Mapping[str, Any]) -> str:
    parts: list[str] = []
    for i, item in enumerate(loc):
        if i > 0 and loc[i - 1] == "gpus" and item in _GPUS_FORM_TAGS:
            continue  # the union tag of the two gpus forms, not a field
        if isinstance(item, int):
            parts.append(f"[{item}]")
            if i == 1 and loc[0] == "machines":
                parts.append(_machine_label(data, item))
        else:
            parts.append(f".{item}" if parts else item)
    return "".join(parts)


def _machine_label(data: Mapping[str, Any], index: int) -> str:
    machines = data.get("machines")
    if isinstance(machines, list) and index < len(machines):
        entry = machines[index]
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            return f" ({entry['name']})"
    return ""
