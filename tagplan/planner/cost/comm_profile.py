"""The communication-profile format: measured transfer and AllReduce times and the
segmented-linear models fitted to them (TAG §4.1.2), stored as JSON
(``docs/comm-profile.md``) and validated strictly on load. :mod:`.comm_profiler` measures
them; :class:`~.comm.CommModel` uses them in place of its closed forms."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ..errors import InvalidInput
from ..validation import describe_validation_error
from .fit import SegmentedLinear, fit_segmented_linear

__all__ = [
    "COMM_PROFILE_FORMAT",
    "COMM_PROFILE_VERSION",
    "CommProfile",
    "Measurement",
    "P2PModels",
    "dump_comm_profile",
    "dumps_comm_profile",
    "load_comm_profile",
    "loads_comm_profile",
    "parse_comm_profile",
    "profile_from_measurements",
]

COMM_PROFILE_FORMAT = "tagplan.comm-profile"
"""The ``format`` field of every comm-profile file."""
COMM_PROFILE_VERSION = 1
"""The comm-profile version this release reads and writes."""

PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Measurement(_Model):
    """The raw runs of one transfer: ``kind`` among ``devices`` devices of ``nbytes``."""

    kind: Literal["p2p", "allreduce"]
    scope: Literal["intra", "inter"]
    """``intra``: the devices share a machine; ``inter``: they span machines."""
    devices: Annotated[int, Field(strict=True, ge=2)]
    nbytes: Annotated[int, Field(strict=True, gt=0)]
    times_s: tuple[PositiveFinite, ...] = Field(min_length=1)
    """Wall-clock seconds of each timed run (after warm-up)."""

    @field_validator("times_s", mode="before")
    @classmethod
    def _check_times(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            bad = [t for t in value if isinstance(t, int | float) and not t > 0]
            if bad:
                raise ValueError(f"times must be > 0 seconds, got {bad[0]!r}")
        return value

    @model_validator(mode="after")
    def _check_pair(self) -> Measurement:
        if self.kind == "p2p" and self.devices != 2:
            raise ValueError(f"a p2p measurement is between 2 devices, got devices={self.devices}")
        return self

    @property
    def median_s(self) -> float:
        """The median run, the value the models are fitted to."""
        return float(statistics.median(self.times_s))


class P2PModels(_Model):
    """Point-to-point models by path kind; a missing one falls back to the closed form."""

    intra: SegmentedLinear | None = None
    """Two devices of one machine."""
    inter: SegmentedLinear | None = None
    """Two devices on different machines."""


class CommProfile(_Model):
    """Fitted communication models of one device kind (TAG §4.1.2).

    ``device_kind`` is the GPU type as a cluster spec names it (``V100-32GB``) or
    ``CPU``; the models apply to transfers among devices of that type.
    ``allreduce["k"]`` is AllReduce among ``k`` devices of one machine.
    """

    format: Literal["tagplan.comm-profile"] = COMM_PROFILE_FORMAT
    version: Literal[1] = COMM_PROFILE_VERSION
    device_kind: str
    description: str = ""
    p2p: P2PModels = P2PModels()
    allreduce: dict[str, SegmentedLinear] = Field(default_factory=dict)
    measurements: tuple[Measurement, ...] = ()

    @field_validator("device_kind")
    @classmethod
    def _check_kind(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("device_kind must name a device type, e.g. 'V100-32GB' or 'CPU'")
        return value

    @field_validator("allreduce")
    @classmethod
    def _check_group_sizes(cls, value: dict[str, SegmentedLinear]) -> dict[str, SegmentedLinear]:
        for key in value:
            if not (key.isdigit() and int(key) >= 2 and str(int(key)) == key):
                raise ValueError(
                    f"allreduce keys are device counts >= 2 written as decimal strings, got {key!r}"
                )
        return value


# --------------------------------------------------------------------------- reading, writing


def parse_comm_profile(data: Mapping[str, Any] | CommProfile) -> CommProfile:
    """Validate a mapping (parsed JSON) as a :class:`CommProfile`.

    Raises :class:`InvalidInput` naming the first problems: a missing or foreign
    ``format``, another ``version``, unknown fields, non-positive times, negative
    slopes or intercepts, breakpoints that do not increase, malformed ``allreduce`` keys.
    """
    if isinstance(data, CommProfile):
        return data
    if not isinstance(data, Mapping):
        raise InvalidInput(f"a comm profile must be a JSON object, got {type(data).__name__}")
    if data.get("format") != COMM_PROFILE_FORMAT:
        raise InvalidInput(
            f"not a comm profile: format is {data.get('format')!r}, "
            f"expected {COMM_PROFILE_FORMAT!r}"
        )
    if data.get("version") != COMM_PROFILE_VERSION:
        raise InvalidInput(
            f"unsupported comm-profile version {data.get('version')!r}; this release reads "
            f"version {COMM_PROFILE_VERSION}"
        )
    try:
        return CommProfile.model_validate(dict(data))
    except ValidationError as exc:
        raise InvalidInput(describe_validation_error(exc, "comm profile")) from None


def loads_comm_profile(text: str) -> CommProfile:
    """Parse a comm profile from JSON text."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"comm profile is not valid JSON: {exc}") from None
    return parse_comm_profile(data)


def load_comm_profile(path: str | os.PathLike[str]) -> CommProfile:
    """Read a comm-profile JSON file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidInput(f"comm profile {str(path)!r} does not exist") from None
    except OSError as exc:
        raise InvalidInput(f"cannot read comm profile {str(path)!r}: {exc}") from None
    return loads_comm_profile(text)


def dumps_comm_profile(profile: CommProfile) -> str:
    """JSON text of ``profile`` that :func:`loads_comm_profile` reads back equal."""
    return json.dumps(profile.model_dump(mode="json"), indent=1) + "\n"


def dump_comm_profile(profile: CommProfile, path: str | os.PathLike[str]) -> None:
    """Write ``profile`` as JSON to ``path``."""
    Path(path).write_text(dumps_comm_profile(profile), encoding="utf-8")


# --------------------------------------------------------------------------- fitting


def profile_from_measurements(
    measurements: Sequence[Measurement],
    device_kind: str,
    *,
    description: str = "",
    max_segments: int = 3,
) -> CommProfile:
    """Fit a :class:`CommProfile` to raw runs: one segmented line per p2p path kind and
    per AllReduce group size (of one machine), over the median time of each size."""
    series: dict[tuple[str, str, int], tuple[list[float], list[float]]] = {}
    for m in measurements:
        sizes, times = series.setdefault((m.kind, m.scope, m.devices), ([], []))
        sizes.append(m.nbytes)
        times.append(m.median_s)
    p2p: dict[str, SegmentedLinear] = {}
    allreduce: dict[str, SegmentedLinear] = {}
    for (kind, scope, devices), (sizes, times) in sorted(series.items()):
        model = fit_segmented_linear(sizes, times, max_segments=max_segments)
        if kind == "p2p":
            p2p[scope] = model
        elif scope == "intra":
            allreduce[str(devices)] = model
    return CommProfile(
        device_kind=device_kind,
        description=description,
        p2p=P2PModels(**p2p),
        allreduce=allreduce,
        measurements=tuple(measurements),
    )
