"""The GPU catalog: peak compute, memory and memory bandwidth per GPU type.

The built-in table (``gpu_catalog.yaml``, shipped as package data) holds public
datasheet figures, each with its ``source``. A cluster spec may add types or replace
built-in ones under ``gpu_types`` (docs/design.md §2). Type names match case-insensitively
and are normalized to the spelling of their definition, so ``v100-32gb`` and
``V100-32GB`` name the same type (and give the same cluster fingerprint).
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

__all__ = [
    "GpuTypeSpec",
    "builtin_catalog",
    "gpu_type_table",
    "known_type_names",
    "lookup_gpu_type",
]

_TYPE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")

MAX_PEAK = 1e6
"""Bound of every peak figure (TFLOPS, GB/s, GiB): far above any GPU, finite in float64."""
PositiveFinite = Annotated[float, Field(gt=0, le=MAX_PEAK, allow_inf_nan=False)]


class GpuTypeSpec(BaseModel):
    """One GPU type: peak figures in the units named by each field.

    ``fp16_tflops`` is the dense tensor-core rate where the GPU has tensor cores;
    ``None`` means unknown, and the engine then uses ``fp32_tflops`` for FP16 work.
    ``tf32_tflops`` is the dense TF32 tensor-core rate (Ampere and later), which
    TensorFlow uses for float32 convolutions and matrix products by default.
    ``winograd`` says whether the device's convolution library offers Winograd
    algorithms for 3x3 convolutions (cuDNN does on every NVIDIA GPU; TensorFlow's CPU
    kernels do not), which the cost model then considers (:mod:`tagplan.planner.cost.conv_algo`).
    ``gemm_tile`` is the side of the output tile the device's matrix-product and
    convolution libraries compute a large product in; the cost model rounds a product's
    work up to whole tiles (:mod:`tagplan.planner.cost.gemm_shape`). ``None`` (the
    default) keeps the flops: set only where kernels timed on the GPU show the rounding.
    ``multiprocessors`` is the GPU's count of streaming multiprocessors; on a type that
    names it the cost model bounds a float32 training batch norm by its channels, each
    streamed on one multiprocessor at a fixed rate
    (:mod:`tagplan.planner.cost.channel_streams`). ``None``: no such bound.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    fp32_tflops: PositiveFinite
    fp16_tflops: PositiveFinite | None = None
    tf32_tflops: PositiveFinite | None = None
    memory_bandwidth_gb_per_s: PositiveFinite
    memory_gib: PositiveFinite
    winograd: bool = True
    gemm_tile: Annotated[int, Field(gt=0)] | None = None
    multiprocessors: Annotated[int, Field(gt=0)] | None = None
    source: str | None = None

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        value = value.strip()
        if not _TYPE_NAME_RE.match(value):
            raise ValueError(
                f"GPU type name {value!r} must start with a letter or digit and contain "
                "only letters, digits and . _ + -"
            )
        return value


@functools.cache
def builtin_catalog() -> Mapping[str, GpuTypeSpec]:
    """The built-in GPU types by name, read once from ``gpu_catalog.yaml``."""
    text = importlib.resources.files(__package__).joinpath("gpu_catalog.yaml").read_text("utf-8")
    raw = yaml.safe_load(text)
    table: dict[str, GpuTypeSpec] = {}
    for entry in raw["gpu_types"]:
        try:
            spec = GpuTypeSpec.model_validate(entry)
        except ValidationError as exc:  # pragma: no cover - guards the shipped data
            raise RuntimeError(f"bad built-in GPU catalog entry {entry!r}: {exc}") from exc
        if not spec.source:  # pragma: no cover - guards the shipped data
            raise RuntimeError(f"built-in GPU catalog entry {spec.name!r} has no source")
        table[spec.name] = spec
    return MappingProxyType(table)


def gpu_type_table(extra: Iterable[GpuTypeSpec] = ()) -> dict[str, GpuTypeSpec]:
    """The built-in catalog with ``extra`` types added or replacing built-ins by name.

    A replacement keeps the built-in spelling of the name. Keys are the canonical names.
    """
    table = dict(builtin_catalog())
    by_fold = {name.casefold(): name for name in table}
    for spec in extra:
        existing = by_fold.get(spec.name.casefold())
        if existing is not None:
            del table[existing]
            spec = spec.model_copy(update={"name": existing})
        table[spec.name] = spec
        by_fold[spec.name.casefold()] = spec.name
    return table


def lookup_gpu_type(name: str, table: Mapping[str, GpuTypeSpec]) -> GpuTypeSpec | None:
    """Find ``name`` in ``table`` ignoring case; ``None`` when it is not there."""
    if name in table:
        return table[name]
    folded = name.strip().casefold()
    for key, spec in table.items():
        if key.casefold() == folded:
            return spec
    return None


def known_type_names(table: Mapping[str, GpuTypeSpec]) -> list[str]:
    """The names in ``table``, sorted case-insensitively (for error messages and listings)."""
    return sorted(table, key=str.casefold)
