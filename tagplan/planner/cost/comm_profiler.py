"""Measured communication times: the comm-profile format and its TensorFlow profiler.

TAG §4.1.2 measures transfers between pairs of devices and AllReduce among groups of
devices at sizes from 1 KB doubling upwards, and fits segmented linear regressions that
the cost model uses in place of its closed forms (:class:`~.comm.CommModel`). A
:class:`CommProfile` holds those fitted models plus the raw runs; it is stored as JSON
(``docs/comm-profile.md``) and validated strictly on load.

:func:`profile_comm` measures with TensorFlow on the devices it sees: GPUs when there
are enough, otherwise virtual CPU devices carved out of the host CPU. TensorFlow is
imported only inside the measuring functions. Because TensorFlow fixes its devices when
its runtime starts, measuring runs by default in a fresh Python process, leaving the
caller's TensorFlow untouched.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
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
from .comm import SegmentedLinear, fit_segmented_linear

__all__ = [
    "COMM_PROFILE_FORMAT",
    "COMM_PROFILE_VERSION",
    "CommProfile",
    "Measurement",
    "P2PModels",
    "dumps_comm_profile",
    "load_comm_profile",
    "loads_comm_profile",
    "parse_comm_profile",
    "profile_comm",
    "profile_from_measurements",
    "save_comm_profile",
]

COMM_PROFILE_FORMAT = "tagplan.comm-profile"
"""The ``format`` field of every comm-profile file."""
COMM_PROFILE_VERSION = 1
"""The comm-profile version this release reads and writes."""

PositiveFinite = Annotated[float, Field(gt=0, allow_inf_nan=False)]

# TensorFlow keeps the parameters of every collective instance for the life of its
# runtime, so an instance key must never be used twice in one process, even across
# profiling runs with different sizes.
_instance_keys = itertools.count(1)


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
        raise InvalidInput(_describe_errors(exc)) from None


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


def save_comm_profile(profile: CommProfile, path: str | os.PathLike[str]) -> None:
    """Write ``profile`` as JSON to ``path``."""
    Path(path).write_text(dumps_comm_profile(profile), encoding="utf-8")


def _describe_errors(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False):
        where = "".join(
            f"[{item}]" if isinstance(item, int) else f".{item}" for item in error["loc"]
        ).lstrip(".")
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown field"
        elif error["type"] == "missing":
            message = "required field is missing"
        elif error["type"] != "value_error" and not isinstance(error.get("input"), dict | list):
            message = f"{message} (got {error.get('input')!r})"
        problems.append(f"{where}: {message}" if where else message)
    return "invalid comm profile: " + "; ".join(problems)


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


# --------------------------------------------------------------------------- measuring


def _doubling_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    if not isinstance(min_bytes, int) or min_bytes < 4:
        raise InvalidInput(f"min_bytes must be an integer >= 4 (one float32), got {min_bytes!r}")
    if not isinstance(max_bytes, int) or max_bytes < min_bytes:
        raise InvalidInput(f"max_bytes must be an integer >= min_bytes, got {max_bytes!r}")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(size // 4 * 4)
        size *= 2
    return sizes


def _check_options(devices: int, repeats: int) -> None:
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 2:
        raise InvalidInput(f"devices must be an integer >= 2, got {devices!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InvalidInput(f"repeats must be an integer >= 1, got {repeats!r}")


def _import_tensorflow() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError as exc:
        raise InvalidInput("measuring communication needs TensorFlow; install tagplan[tf]") from exc
    return tf


def _tf_devices(tf: Any, count: int) -> tuple[list[str], str, str]:
    """``count`` device names, their kind and a description of them.

    GPUs when TensorFlow sees enough; otherwise ``count`` virtual CPU devices, which
    must be configured before the runtime starts (or already exist).
    """
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) >= count:
        details = tf.config.experimental.get_device_details(gpus[0])
        kind = str(details.get("device_name", "GPU"))
        names = [d.name for d in tf.config.list_logical_devices("GPU")][:count]
        return names, kind, f"{count} GPUs ({kind})"
    cpu = tf.config.list_physical_devices("CPU")[0]
    # Raises once the runtime has started: then use the CPU devices it already has.
    with contextlib.suppress(RuntimeError):
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
    names = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(names) < count:
        raise RuntimeError(
            f"TensorFlow already started with {len(names)} CPU device(s), {count} needed; "
            "measure in a fresh process (in_process=False)"
        )
    return names[:count], "CPU", f"{count} virtual CPU devices of one host"


def _timed(
    fn: Callable[[], Any], repeats: int, sync: Callable[[], None], *, warm_up: int = 2
) -> list[float]:
    """Seconds of ``repeats`` calls of ``fn`` after ``warm_up`` untimed calls (the first
    traces the function)."""
    for _ in range(warm_up):
        fn()
        sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return times


def _measure(count: int, sizes: Sequence[int], repeats: int) -> tuple[list[Measurement], str, str]:
    """Measure in this process: (measurements, device kind, description)."""
    tf = _import_tensorflow()
    names, kind, where = _tf_devices(tf, count)
    sync = tf.test.experimental.sync_devices
    # Per-device ordering tokens keep the k collective ops of one call unordered with
    # respect to each other; chained in program order they would wait on each other.
    tokens = []
    for name in names:
        with tf.device(name):
            tokens.append(tf.Variable(0.0, name="ordering_token"))

    def copy_to(dst: str) -> Any:
        @tf.function
        def copy(x: Any) -> Any:
            with tf.device(dst):
                return x + 1.0

        return copy

    def allreduce_among(k: int, instance_key: int) -> Any:
        @tf.function
        def allreduce(*xs: Any) -> Any:
            outs = []
            for i in range(k):
                with tf.device(names[i]):
                    outs.append(
                        tf.raw_ops.CollectiveReduceV2(
                            input=xs[i],
                            group_size=k,
                            group_key=k,
                            instance_key=instance_key,
                            ordering_token=[tokens[i].handle],
                            merge_op="Add",
                            final_op="Id",
                            communication_hint="auto",
                            timeout_seconds=600.0,
                        )
                    )
            return outs

        return allreduce

    measurements: list[Measurement] = []
    copy = copy_to(names[1])
    for i, nbytes in enumerate(sizes):
        with tf.device(names[0]):
            x = tf.random.uniform([nbytes // 4], dtype=tf.float32)
        # The first calls of a fresh runtime are slow (thread pools, allocators): warm the
        # runtime up on the smallest copy before timing anything.
        times = _timed(lambda x=x: copy(x), repeats, sync, warm_up=20 if i == 0 else 2)
        measurements.append(
            Measurement(kind="p2p", scope="intra", devices=2, nbytes=nbytes, times_s=times)
        )
        del x
        for k in range(2, count + 1):
            xs = []
            for name in names[:k]:
                with tf.device(name):
                    xs.append(tf.random.uniform([nbytes // 4], dtype=tf.float32))
            allreduce = allreduce_among(k, next(_instance_keys))
            times = _timed(lambda f=allreduce, xs=xs: f(*xs), repeats, sync)
            measurements.append(
                Measurement(
                    kind="allreduce", scope="intra", devices=k, nbytes=nbytes, times_s=times
                )
            )
            del xs
    copy_note = (
        "virtual CPU devices share host memory, so the add's read and write of every byte "
        "is the copy"
        if kind == "CPU"
        else "the runtime copies the tensor between the devices before the add"
    )
    description = (
        f"TensorFlow {tf.__version__} on {where}. p2p: a float32 tensor resident on "
        f"{names[0]} consumed by an AddV2 placed on {names[1]} ({copy_note}). allreduce: "
        "CollectiveReduceV2 (sum, communication_hint=auto: ring on CPUs, NCCL on GPUs) "
        f"among the first k devices. Median of {repeats} timed runs after warm-up."
    )
    return measurements, kind, description


def _measure_in_child(
    count: int, min_bytes: int, max_bytes: int, repeats: int
) -> tuple[list[Measurement], str, str]:
    """Run :func:`_measure` in a fresh interpreter and read back its JSON."""
    package_root = str(Path(__file__).resolve().parents[3])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "measurements.json"
        command = [
            sys.executable,
            "-m",
            __name__,
            f"--devices={count}",
            f"--min-bytes={min_bytes}",
            f"--max-bytes={max_bytes}",
            f"--repeats={repeats}",
            f"--output={output}",
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[-15:])
            raise RuntimeError(f"communication profiling failed (exit {done.returncode}):\n{tail}")
        data = json.loads(output.read_text(encoding="utf-8"))
    measurements = [Measurement.model_validate(m) for m in data["measurements"]]
    return measurements, data["device_kind"], data["description"]


def profile_comm(
    devices: int = 4,
    min_bytes: int = 1024,
    max_bytes: int = 256 << 20,
    repeats: int = 5,
    *,
    device_kind: str | None = None,
    max_segments: int = 3,
    in_process: bool = False,
) -> CommProfile:
    """Measure p2p copies and AllReduce with TensorFlow and fit a :class:`CommProfile`.

    Sizes run from ``min_bytes`` doubling up to ``max_bytes`` (TAG §4.1.2 starts at 1 KB);
    each size is timed ``repeats`` times after two warm-up runs and the models are fitted
    to the medians (:func:`~.comm.fit_segmented_linear`). Measured:

    - **p2p** (``intra``): a tensor resident on the first device consumed by an add
      placed on the second;
    - **AllReduce** among the first ``k`` devices for ``k = 2..devices``: TensorFlow's
      collective sum (``CollectiveReduceV2``).

    Without ``devices`` GPUs the devices are virtual CPU devices of this host.
    ``device_kind`` overrides the recorded kind (``CPU``, or the GPU's name as
    TensorFlow reports it); set it to the cluster's GPU type name so :class:`~.comm.
    CommModel` applies the profile. ``in_process=True`` measures in this process, whose
    TensorFlow runtime must not have started yet (or already have the devices); the
    default runs a fresh interpreter.
    """
    _check_options(devices, repeats)
    sizes = _doubling_sizes(min_bytes, max_bytes)
    if in_process:
        measurements, kind, description = _measure(devices, sizes, repeats)
    else:
        measurements, kind, description = _measure_in_child(devices, min_bytes, max_bytes, repeats)
    return profile_from_measurements(
        measurements,
        device_kind or kind,
        description=description,
        max_segments=max_segments,
    )


def _main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Measure communication times (raw runs).")
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--min-bytes", type=int, default=1024)
    parser.add_argument("--max-bytes", type=int, default=256 << 20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    _check_options(args.devices, args.repeats)
    sizes = _doubling_sizes(args.min_bytes, args.max_bytes)
    measurements, kind, description = _measure(args.devices, sizes, args.repeats)
    data = {
        "device_kind": kind,
        "description": description,
        "measurements": [m.model_dump(mode="json") for m in measurements],
    }
    Path(args.output).write_text(json.dumps(data), encoding="utf-8")


if __name__ == "__main__":
    _main()
