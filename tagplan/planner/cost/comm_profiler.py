"""Measuring communication with TensorFlow (TAG §4.1.2): transfers between pairs of devices
and AllReduce among groups of devices at sizes from 1 KB doubling upwards, fitted into a
:class:`~.comm_profile.CommProfile`.

:func:`profile_comm` measures on the devices TensorFlow sees: GPUs when there are enough,
otherwise virtual CPU devices carved out of the host CPU. TensorFlow is imported only
inside the measuring functions. Because TensorFlow fixes its devices when its runtime
starts, measuring runs by default in a fresh Python process (this module's ``__main__``,
which writes the raw runs as JSON), leaving the caller's TensorFlow untouched.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tagplan.planner.tensorflow_import import import_tensorflow

from ..errors import InvalidInput
from .comm_profile import CommProfile, Measurement, profile_from_measurements

__all__ = ["profile_comm"]

# TensorFlow keeps the parameters of every collective instance for the life of its
# runtime, so an instance key must never be used twice in one process, even across
# profiling runs with different sizes.
_instance_keys = itertools.count(1)


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
    tf = import_tensorflow("measuring communication needs TensorFlow; install tagplan[tf]")
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
