"""One task of a plan on TensorFlow's gRPC runtime: every task runs a
``tf.distribute.Server``; task 0 also opens a TF1 session against its own server and
drives training (init or restore, steps, save), the other tasks serve until task 0 says
it is done.

Why these settings: cross-process ``CollectiveReduceV2`` needs a group leader
(``collective_group_leader``, task 0) in every server's configuration; TensorFlow waits
for an unreachable worker without end, so task 0 first connects to every worker's port
and gives up after ``connect_timeout_s``, and every run has an operation timeout, so a
worker lost mid-training ends the run with an error instead of a hang. Task 0 ends the
other tasks through a one-element queue on each task's CPU (``shared_name`` shared by
sessions of one server), so a Kubernetes Job's pods all complete.
"""

from __future__ import annotations

import contextlib
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tagplan.planner.errors import InvalidInput, PlannerError
from tagplan.planner.run import captured
from tagplan.planner.run.cpu import on_cpu
from tagplan.planner.run.plan_dir import Plan
from tagplan.planner.verify.reference import assign_values, load_tensorflow, reader
from tagplan.planner.verify.values import ValueStore

__all__ = ["RunFailed", "RunOptions", "RunResult", "serve", "train"]

_LEADER = "/job:worker/replica:0/task:0"
_PROBE_INTERVAL_S = 0.2
_DONE_POLL_MS = 1000
_DONE_SIGNAL_MS = 10_000


class RunFailed(PlannerError):
    """TensorFlow stopped a run (a lost worker, a step over its timeout); one line."""


@dataclass(frozen=True)
class RunOptions:
    """How a task runs: its index, every task's address and the runtime's settings."""

    task: int
    workers: list[str]
    cpu: bool = False
    connect_timeout_s: float = 60.0
    step_timeout_s: float = 600.0


@dataclass
class RunResult:
    """What task 0's training did: the loss of every step and the time they took."""

    losses: list[float] = field(default_factory=list)
    steps_s: float = 0.0
    restored: str | None = None
    saved: str | None = None
    replica_difference: float | None = None  # the largest |replica - first|, any step
    worst_variable: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def _server(tf: Any, plan: Plan, options: RunOptions) -> Any:
    config = tf.compat.v1.ConfigProto()
    config.experimental.collective_group_leader = _LEADER
    if options.cpu:
        config.device_count["CPU"] = max(plan.gpus(options.task), default=0) + 1
    spec = tf.train.ClusterSpec({"worker": options.workers})
    try:
        return tf.distribute.Server(spec, job_name="worker", task_index=options.task, config=config)
    except (tf.errors.OpError, RuntimeError) as exc:
        address = options.workers[options.task]
        raise InvalidInput(
            f"cannot start task {options.task} at {address}: {_first_line(exc)}"
        ) from None


def _session_config(tf: Any, options: RunOptions, task_only: bool) -> Any:
    config = tf.compat.v1.ConfigProto(allow_soft_placement=not options.cpu)
    config.experimental.collective_group_leader = _LEADER
    config.operation_timeout_in_ms = int(options.step_timeout_s * 1000)
    if task_only:
        config.device_filters.append(f"/job:worker/replica:0/task:{options.task}")
    return config


def _done_queue(tf: Any, task: int) -> Any:
    """The queue through which task 0 tells task ``task`` that the run is over."""
    with tf.device(f"/job:worker/replica:0/task:{task}/device:CPU:0"):
        return tf.queue.FIFOQueue(
            1,
            [tf.int32],
            shapes=[[]],
            shared_name=f"tagplan_run_done_{task}",
            name=f"tagplan_run/done_{task}",
        )


def wait_for_workers(workers: list[str], task: int, timeout_s: float) -> None:
    """Connect to every other task's port until it answers; refuse after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    for index, address in enumerate(workers):
        if index == task:
            continue
        host, _, port = address.rpartition(":")
        while True:
            try:
                with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                    break
            except OSError:
                if time.monotonic() >= deadline:
                    raise InvalidInput(
                        f"worker task {index} at {address} did not answer within {timeout_s:g} s: "
                        f"start it with tagplan run PLAN --task {index}, or check the address"
                    ) from None
                time.sleep(_PROBE_INTERVAL_S)


def serve(plan: Plan, options: RunOptions) -> None:
    """Run task ``options.task`` (not 0) until task 0 says the run is over."""
    tf = load_tensorflow()
    server = _server(tf, plan, options)
    with tf.Graph().as_default():
        done = _done_queue(tf, options.task).dequeue()
        poll = tf.compat.v1.RunOptions(timeout_in_ms=_DONE_POLL_MS)
        with tf.compat.v1.Session(
            server.target, config=_session_config(tf, options, True)
        ) as session:
            while True:
                try:
                    session.run(done, options=poll)
                    return
                except tf.errors.DeadlineExceededError:
                    continue


def _checkpoint_prefix(tf: Any, path: str) -> str:
    """A checkpoint prefix, or the newest checkpoint of a directory."""
    if Path(path).is_dir():
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            raise InvalidInput(f"{path} holds no checkpoint")
        return latest
    if not Path(f"{path}.index").is_file():
        raise InvalidInput(f"no checkpoint at {path} (expected {path}.index)")
    return str(Path(path).resolve())


def _replica_readers(tf: Any, graph: Any, variables: Mapping[str, list[str]]) -> dict[str, list]:
    """Read ops of every replica of each variable that has more than one, built once."""
    return {
        name: [reader(tf, graph, r) for r in replicas]
        for name, replicas in variables.items()
        if len(replicas) > 1
    }


def _replica_difference(session: Any, readers: Mapping[str, list]) -> tuple[float, str | None]:
    """The largest elementwise difference between a variable's replicas, and which."""
    worst, difference = None, 0.0
    for name, reads in readers.items():
        values = session.run(reads)
        found = max(float(np.max(np.abs(v - values[0]), initial=0.0)) for v in values[1:])
        if worst is None or found > difference:
            worst, difference = name, found
    return difference, worst


def _note_replicas(result: RunResult, session: Any, readers: Mapping[str, list]) -> None:
    """Keep in ``result`` the largest difference between replicas found so far."""
    if readers:
        found, variable = _replica_difference(session, readers)
        if result.replica_difference is None or found > result.replica_difference:
            result.replica_difference, result.worst_variable = found, variable


def _start(
    tf: Any,
    session: Any,
    plan: Plan,
    restored: str | None,
    assigns: Mapping[str, tuple[Any, Any, str]],
    values: ValueStore,
) -> None:
    """Initialize or restore: TF1 variables by the plan's own ``init`` or ``restore`` ops,
    captured ones by assigning every replica its value in ``values``."""
    checkpoint = plan.device_map["checkpoint"]
    if restored:
        try:
            session.run(checkpoint["restore"], {f"{checkpoint['filename']}:0": restored})
        except (tf.errors.NotFoundError, tf.errors.InvalidArgumentError) as exc:
            raise InvalidInput(f"cannot restore {restored}: {_first_line(exc)}") from None
    else:
        session.run(plan.device_map["init"])
    assign_values(session, assigns, values)


def train(
    plan: Plan,
    options: RunOptions,
    batches: Iterable[Mapping[str, Any]],
    steps: int,
    *,
    restore: str | None = None,
    save: str | None = None,
    check_replicas: bool = False,
    on_step: Callable[[int, float], None] | None = None,
) -> RunResult:
    """Run task 0: start its server, wait for the others, initialize or restore, run
    ``steps`` steps on ``batches`` (whole batches, split by :meth:`Plan.split`), save,
    and tell the other tasks to stop. A TF2 plan's captured variables get their values
    (drawn, or read from ``restore``) before the server starts, so a checkpoint that does
    not fit is refused at once."""
    device_map = plan.device_map
    if not restore and device_map["uninitialized"]:
        names = device_map["uninitialized"]
        raise InvalidInput(
            f"{len(names)} variables ({names[0]}, ...) have no initializer: --restore a checkpoint"
        )
    if plan.captured and device_map["variables"]:
        raise InvalidInput(
            "the plan has both TF1 variables and captured variables: tagplan run initializes, "
            "saves and restores one kind or the other"
        )
    tf = load_tensorflow()
    restored = _checkpoint_prefix(tf, restore) if restore else None
    with tempfile.TemporaryDirectory(prefix="tagplan-run-") as scratch:
        values = ValueStore(Path(scratch))
        if plan.captured and restored:
            captured.checkpoint_values(tf, plan, restored, values)
        elif plan.captured:
            captured.drawn_values(plan, values)
        server = _server(tf, plan, options)
        wait_for_workers(options.workers, options.task, options.connect_timeout_s)
        graph_def = on_cpu(plan.graph_def) if options.cpu else plan.graph_def
        if plan.captured:
            graph_def = captured.bind(plan, graph_def)
        result = RunResult(restored=restored)
        with tf.Graph().as_default() as graph:
            tf.compat.v1.import_graph_def(
                tf.compat.v1.GraphDef.FromString(graph_def.SerializeToString()), name=""
            )
            signals = [_done_queue(tf, t).enqueue(0) for t in range(1, plan.num_tasks)]
            assigns = captured.assigns(tf, graph, plan)
            if plan.captured:
                prefix, save_op = captured.saver(tf, graph, plan, f"{_LEADER}/device:CPU:0")
            else:
                checkpoint = device_map["checkpoint"]
                prefix, save_op = f"{checkpoint['filename']}:0", f"{checkpoint['save']}:0"
            variables = {**device_map["variables"], **captured.replicas(plan)}
            readers = _replica_readers(tf, graph, variables) if check_replicas else {}
            fetch = [f"{device_map['loss']}:0", device_map["train_op"]]
            with tf.compat.v1.Session(
                server.target, config=_session_config(tf, options, False)
            ) as session:
                try:
                    _start(tf, session, plan, restored, assigns, values)
                    _note_replicas(result, session, readers)  # equal from the start
                    for step, batch in zip(range(steps), batches, strict=False):
                        started = time.perf_counter()
                        try:
                            loss, _ = session.run(fetch, plan.split(batch))
                        except ValueError as exc:
                            raise InvalidInput(f"step {step}: {_first_line(exc)}") from None
                        result.steps_s += time.perf_counter() - started
                        result.losses.append(float(loss))
                        if on_step is not None:
                            on_step(step, float(loss))
                        _note_replicas(result, session, readers)
                    if save:
                        target = Path(save).resolve()
                        target.parent.mkdir(parents=True, exist_ok=True)
                        session.run(save_op, {prefix: str(target)})
                        result.saved = str(target)
                except tf.errors.OpError as exc:
                    raise RunFailed(f"TensorFlow stopped the run: {_first_line(exc)}") from None
                finally:
                    stop = tf.compat.v1.RunOptions(timeout_in_ms=_DONE_SIGNAL_MS)
                    for signal in signals:  # a task that is gone needs no signal
                        with contextlib.suppress(tf.errors.OpError):
                            session.run(signal, options=stop)
    return result
