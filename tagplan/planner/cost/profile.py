"""Measured op times: the profile file format and the sources the cost model reads.

TAG §4.1.2 profiles every op of a training graph on each GPU type at a few batch sizes
and predicts other batch sizes with a linear model. A :class:`Profile` is one such
measurement (one graph, one GPU type); a :class:`ProfileSource` answers
``lookup(cost_key, gpu_type, batch)`` from any number of them. Ops are keyed by the
analyzer's cost key (op type, input shapes with the batch dimension written ``B``,
attributes), which does not depend on the batch size, so a profile stores one time per
batch size under each key and ops of different graphs with the same key share them.

Times are seconds of one execution of one op. The file format is documented in
``docs/profile-format.md``; this module does not import TensorFlow.
"""

from __future__ import annotations

import bisect
import json
import math
import numbers
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tagplan.planner.errors import InvalidInput
from tagplan.planner.validation import describe_validation_error

__all__ = [
    "PROFILE_FORMAT",
    "PROFILE_VERSION",
    "InMemoryProfileSource",
    "OpProfile",
    "Profile",
    "ProfileDevice",
    "ProfileSource",
    "ProfiledGraph",
    "dumps_profile",
    "estimate_time",
    "load_profile",
]

PROFILE_FORMAT = "tagplan.profile"
PROFILE_VERSION = 1

Seconds = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
_INTEGER_KEY = re.compile(r"^[+-]?[0-9]+$")


def _batch_keys(value: Any) -> Any:
    """JSON object keys are strings: accept ``"8"`` as batch size 8, nothing looser."""
    if not isinstance(value, Mapping):
        return value
    converted: dict[Any, Any] = {}
    for key, seconds in value.items():
        if isinstance(key, str) and _INTEGER_KEY.match(key):
            converted[int(key)] = seconds
        elif isinstance(key, int) and not isinstance(key, bool):
            converted[key] = seconds
        else:
            raise ValueError(f"batch size keys must be integers, got {key!r}")
    return converted


def _check_batches(batches: Iterable[int]) -> None:
    bad = sorted(b for b in batches if b <= 0)
    if bad:
        raise ValueError(f"batch sizes must be positive, got {bad}")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class ProfileDevice(_Strict):
    """The device a profile was measured on. ``gpu_type`` names a catalog entry."""

    gpu_type: Annotated[str, Field(min_length=1)]
    description: str
    tensorflow_version: str

    @field_validator("gpu_type")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("gpu_type must not be blank")
        return value


class ProfiledGraph(_Strict):
    """The graph a profile was measured on: its name and content fingerprint."""

    graph: str
    fingerprint: str


class OpProfile(_Strict):
    """Times of the ops sharing one cost key: seconds per single op execution by batch size.

    ``count`` is how many ops of the profiled graph have this key; each time is the median
    over runs and over those ops.
    """

    cost_key: Annotated[str, Field(min_length=1)]
    op_type: Annotated[str, Field(min_length=1)]
    times_s: Annotated[dict[int, Seconds], Field(min_length=1)]
    count: Annotated[int, Field(ge=1)]

    _keys = field_validator("times_s", mode="before")(_batch_keys)

    @field_validator("times_s")
    @classmethod
    def _positive_batches(cls, value: dict[int, float]) -> dict[int, float]:
        _check_batches(value)
        return value


class Profile(_Strict):
    """One profiling run: one graph on one device type at several batch sizes (TAG §4.1.2)."""

    format: Literal["tagplan.profile"]
    version: Literal[1]
    device: ProfileDevice
    source: ProfiledGraph
    batch_sizes: Annotated[list[int], Field(min_length=1)]
    step_time_s: dict[int, Seconds]
    ops: list[OpProfile]

    _keys = field_validator("step_time_s", mode="before")(_batch_keys)

    @field_validator("version", mode="before")
    @classmethod
    def _not_bool(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(f"version must be the integer {PROFILE_VERSION}")
        return value

    @field_validator("batch_sizes")
    @classmethod
    def _unique_positive(cls, value: list[int]) -> list[int]:
        _check_batches(value)
        if len(set(value)) != len(value):
            raise ValueError(f"duplicate batch sizes in {value}")
        return value

    @field_validator("step_time_s")
    @classmethod
    def _positive_batches(cls, value: dict[int, float]) -> dict[int, float]:
        _check_batches(value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        declared = set(self.batch_sizes)
        extra = sorted(set(self.step_time_s) - declared)
        if extra:
            raise ValueError(f"step_time_s: batch sizes {extra} are not in batch_sizes")
        seen: dict[str, int] = {}
        for i, op in enumerate(self.ops):
            extra = sorted(set(op.times_s) - declared)
            if extra:
                raise ValueError(f"ops[{i}].times_s: batch sizes {extra} are not in batch_sizes")
            if op.cost_key in seen:
                raise ValueError(
                    f"ops[{i}].cost_key: duplicate cost key {op.cost_key!r} "
                    f"(also ops[{seen[op.cost_key]}])"
                )
            seen[op.cost_key] = i
        return self


def load_profile(source: str | os.PathLike[str] | bytes | Mapping[str, Any]) -> Profile:
    """Read and validate a profile from a file path, JSON bytes or a parsed JSON object.

    Every problem raises :class:`InvalidInput` naming the offending field, e.g.
    ``ops[3].times_s[8]: Input should be greater than or equal to 0``.
    """
    if isinstance(source, Mapping):
        data: Any = source
    else:
        if isinstance(source, bytes):
            raw = source
        else:
            path = Path(source)
            try:
                raw = path.read_bytes()
            except OSError as exc:
                raise InvalidInput(f"cannot read profile {path.name!r}: {exc.strerror}") from None
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"profile is not valid JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise InvalidInput("invalid profile: expected a JSON object at the top level")
    if data.get("format") != PROFILE_FORMAT:
        raise InvalidInput(
            f"invalid profile: format: expected {PROFILE_FORMAT!r}, got {data.get('format')!r}"
        )
    try:
        return Profile.model_validate(dict(data))
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(exc, "profile", limit=5)) from None


def dumps_profile(profile: Profile) -> str:
    """The profile as JSON text: one line per op, batch sizes as string keys."""
    data = profile.model_dump(mode="json")
    lines = ["{"]
    for name, value in data.items():
        if name == "ops":
            continue
        lines.append(f"  {json.dumps(name)}: {json.dumps(value)},")
    ops = [f"    {json.dumps(op)}" for op in data["ops"]]
    lines.append('  "ops": [' + ("\n" + ",\n".join(ops) + "\n  ]" if ops else "]"))
    lines.append("}")
    return "\n".join(lines) + "\n"


def _check_batch(batch: int) -> int:
    if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch <= 0:
        raise InvalidInput(f"batch size must be a positive integer, got {batch!r}")
    return int(batch)


def estimate_time(points: Mapping[int, float], batch: int) -> float:
    r"""Op time at ``batch`` from measured ``{batch size: seconds}`` points (TAG §4.1.2).

    With points :math:`(b_1, t_1) < \dots < (b_n, t_n)` sorted by batch size:

    * ``batch`` measured: its time.
    * :math:`b_i < b < b_{i+1}`: linear interpolation between the two neighbours.
    * :math:`b > b_n`: the line through the two largest points, TAG's linear model for
      large batches, never below :math:`t_n` (noise can make that line fall).
    * :math:`b < b_1`: the line through the two smallest points, clamped to
      :math:`[t_1 b / b_1,\ t_1]`: no more than the smallest measurement (a smaller batch
      is not slower) and no less than its proportional share (op times have a
      non-negative fixed part), so the result is positive whenever :math:`t_1 > 0`.
    * one point :math:`(b_0, t_0)`: :math:`t_0 b / b_0` above it, :math:`t_0` below.

    >>> estimate_time({8: 2.0, 16: 3.0}, 12)
    2.5
    >>> estimate_time({8: 2.0, 16: 3.0}, 32)
    5.0
    >>> estimate_time({8: 2.0, 16: 3.0}, 4)
    1.5
    """
    batch = _check_batch(batch)
    if not points:
        raise InvalidInput("no measured points to estimate an op time from")
    if batch in points:
        return float(points[batch])
    sizes = sorted(points)
    times = [float(points[b]) for b in sizes]
    if len(sizes) == 1:
        b0, t0 = sizes[0], times[0]
        return t0 * batch / b0 if batch > b0 else t0
    if batch > sizes[-1]:
        (b1, t1), (b2, t2) = (sizes[-2], times[-2]), (sizes[-1], times[-1])
        return max(t2, t2 + (t2 - t1) / (b2 - b1) * (batch - b2))
    if batch < sizes[0]:
        (b1, t1), (b2, t2) = (sizes[0], times[0]), (sizes[1], times[1])
        linear = t1 + (t2 - t1) / (b2 - b1) * (batch - b1)
        return min(t1, max(linear, t1 * batch / b1))
    right = bisect.bisect_right(sizes, batch)
    b1, b2 = sizes[right - 1], sizes[right]
    t1, t2 = times[right - 1], times[right]
    return t1 + (t2 - t1) * (batch - b1) / (b2 - b1)


@runtime_checkable
class ProfileSource(Protocol):
    """Where measured op times come from (docs/design.md §3)."""

    def lookup(self, cost_key: str, gpu_type: str, batch: int) -> float | None:
        """Seconds of one execution of an op with ``cost_key`` on ``gpu_type`` at local
        batch size ``batch``, or ``None`` when that key was never profiled on that type."""
        ...


def _gpu_key(gpu_type: str) -> str:
    return gpu_type.casefold()


class InMemoryProfileSource:
    """A table of measured points for any number of GPU types, filled by hand or from profiles.

    GPU type names match case-insensitively. Each (cost key, GPU type) keeps its own
    ``{batch size: seconds}`` points; :func:`estimate_time` turns them into an answer for
    any batch size.

    >>> source = InMemoryProfileSource()
    >>> source.add("Relu|float32[B,4]|T=float32", "V100-32GB", 8, 0.002)
    >>> source.add("Relu|float32[B,4]|T=float32", "V100-32GB", 16, 0.003)
    >>> source.lookup("Relu|float32[B,4]|T=float32", "v100-32gb", 12)
    0.0025
    """

    def __init__(self, profiles: Iterable[Profile] = ()) -> None:
        self._points: dict[tuple[str, str], dict[int, float]] = {}
        self._gpu_names: dict[str, str] = {}
        for profile in profiles:
            self.add_profile(profile)

    def add(self, cost_key: str, gpu_type: str, batch: int, seconds: float) -> None:
        """Record one measured point, replacing an earlier one for the same batch size."""
        self._set(cost_key, gpu_type, batch, seconds, replace=True)

    def add_profile(
        self, profile: Profile, *, gpu_type: str | None = None, replace: bool = False
    ) -> None:
        """Record every op time of ``profile`` under its device's GPU type (or ``gpu_type``).

        Points already present for the same key, GPU type and batch size are kept unless
        ``replace`` is set; points at other batch sizes are merged.
        """
        target = gpu_type if gpu_type is not None else profile.device.gpu_type
        for op in profile.ops:
            for batch, seconds in op.times_s.items():
                self._set(op.cost_key, target, batch, seconds, replace=replace)

    def _set(self, cost_key: str, gpu_type: str, batch: int, seconds: float, *, replace: bool):
        if not cost_key:
            raise InvalidInput("cost key must not be empty")
        if not gpu_type.strip():
            raise InvalidInput("gpu_type must not be empty")
        batch = _check_batch(batch)
        if not math.isfinite(seconds) or seconds < 0:
            raise InvalidInput(f"op time must be finite and non-negative, got {seconds!r}")
        self._gpu_names.setdefault(_gpu_key(gpu_type), gpu_type)
        points = self._points.setdefault((_gpu_key(gpu_type), cost_key), {})
        if replace or batch not in points:
            points[batch] = float(seconds)

    def points(self, cost_key: str, gpu_type: str) -> dict[int, float]:
        """The measured ``{batch size: seconds}`` of a key on a GPU type (empty if none)."""
        return dict(self._points.get((_gpu_key(gpu_type), cost_key), {}))

    @property
    def gpu_types(self) -> list[str]:
        """GPU types with at least one point, spelled as first added."""
        return list(self._gpu_names.values())

    def __len__(self) -> int:
        """Number of (cost key, GPU type) entries."""
        return len(self._points)

    def lookup(self, cost_key: str, gpu_type: str, batch: int) -> float | None:
        """Seconds at ``batch`` by :func:`estimate_time`, ``None`` when never profiled."""
        points = self._points.get((_gpu_key(gpu_type), cost_key))
        if not points:
            _check_batch(batch)
            return None
        return estimate_time(points, batch)
