"""Plans run on TensorFlow's gRPC runtime: one ``tagplan run`` process per task on
loopback, each GPU a CPU device (``--cpu``), real cross-process transfers and collectives.
Two steps from ``init``, or from a checkpoint the original graph wrote, compute what two
steps of the single-device graph compute (verification's reference runner and criterion);
the checkpoint the plan writes restores into the original graph; replicas stay equal. A TF2
function's plan binds its captured variables, starts from verification's drawn values and
saves and restores them by name."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from tagplan.cli import app
from tagplan.planner.compile.graphdef import compile_graphdef
from tagplan.planner.evaluate import resolve_planned
from tagplan.planner.topology import load_cluster
from tagplan.planner.verify.check import check_variable
from tagplan.planner.verify.reference import load_original, load_tensorflow, run_reference
from tagplan.planner.verify.values import ValueStore
from tests.planner.compile.test_graphdef import committed, strategy
from tests.planner.compile.test_state import restore_original, save_original
from tests.planner.run.batches import BATCH_FILE

pytestmark = [pytest.mark.tf, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
RTOL, ATOL = 1e-3, 1e-5  # verification's float32 criterion (the plans run in float32)
_T4 = {"type": "T4", "count": 2}
CLUSTERS = {
    "two_by_two": {
        "machines": [{"name": f"m{i}", "gpus": _T4, "intra_bandwidth_gbps": 100} for i in range(2)],
        "network": {"bandwidth_gbps": 10, "latency_us": 10},
    },
    "three": {
        "machines": [
            {"name": f"m{i}", "gpus": {**_T4, "count": 1}, "intra_bandwidth_gbps": 100}
            for i in range(3)
        ],
        "network": {"bandwidth_gbps": 10, "latency_us": 10},
    },
}
# (model, strategy, cluster, start from a checkpoint): collectives with unequal shares,
# a parameter server beside NCCL, parameter servers on three tasks, model parallelism,
# sufficient-factor broadcast, a layer replicated on one machine only, two replicas on one
# GPU and none on another, a layer computed whole on every GPU, bucketed AllReduces over
# two sets of GPUs: every option the compiler emits
CASES = [
    ("mlp", "weights", "two_by_two", False),
    ("small_cnn", "partial-ps", "two_by_two", True),
    ("tiny_lstm", "dp-ps", "three", False),
    ("small_cnn", "model-parallel", "two_by_two", False),
    ("mlp", "sfb", "two_by_two", False),
    ("small_cnn", "partial", "two_by_two", False),
    ("mlp", "replicas", "two_by_two", False),
    ("mlp", "duplicate", "two_by_two", False),
    ("small_cnn", "bucketed-apart", "two_by_two", False),
]
LAYERS = {"mlp": "dense_2", "small_cnn": "logits", "tiny_lstm": "decoder", "mlp_tf2": "MatMul_2"}


def free_ports(count: int) -> list[int]:
    """Ports nothing listens on (held open together so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def write_plan(tmp_path: Path, model: str, name: str, cluster_name: str) -> tuple[Path, Any]:
    """``tagplan compile`` of the case into a plan directory, and the same compile here."""
    cluster_file = tmp_path / "cluster.json"
    cluster_file.write_text(json.dumps(CLUSTERS[cluster_name]))
    cluster = load_cluster(CLUSTERS[cluster_name])
    graph_def, ir = committed(model)
    chosen = strategy(name, ir, cluster, LAYERS[model])
    strategy_file = tmp_path / "strategy.json"
    strategy_file.write_text(chosen.to_json())
    plan_dir = tmp_path / "plan"
    args = ["compile", f"zoo:{model}", "-c", str(cluster_file), "-s", str(strategy_file)]
    done = CliRunner().invoke(app, [*args, "-o", str(plan_dir)])
    assert done.exit_code == 0, done.output
    compiled = compile_graphdef(graph_def, ir, cluster, resolve_planned(chosen, ir, cluster))
    written = json.loads((plan_dir / "device_map.json").read_text())
    assert written["graph_sha256"] == compiled.device_map["graph_sha256"]
    return plan_dir, compiled


def run_tasks(plan_dir: Path, tasks: int, env: dict[str, str], *chief_args: str) -> dict:
    """Every task of the plan in a process of its own; task 0's JSON result."""
    workers = ",".join(f"localhost:{port}" for port in free_ports(tasks))
    base = [sys.executable, "-m", "tagplan", "run", str(plan_dir), "--workers", workers, "--cpu"]
    options: dict[str, Any] = {"cwd": REPO, "env": env, "text": True}
    others = [
        subprocess.Popen([*base, "--task", str(t)], stderr=subprocess.PIPE, **options)
        for t in range(1, tasks)
    ]
    try:
        chief = subprocess.run(
            [*base, "--task", "0", "--json", *chief_args],
            capture_output=True,
            timeout=240,
            **options,
        )
        assert chief.returncode == 0, chief.stderr[-3000:]
        for other in others:  # task 0 ends them
            assert other.wait(timeout=30) == 0, other.stderr.read()[-3000:]
    finally:
        for other in others:
            if other.poll() is None:
                other.kill()
                other.wait()
    return json.loads(chief.stdout)


def reference_steps(model: str, steps: int, scratch: Path) -> tuple[Any, list]:
    """The original graph with its random batch, and ``steps`` reference steps from its
    ``init``, each starting from the last one's values."""
    tf, batch = load_tensorflow(), committed(model)[1].batch_size
    original = load_original(f"zoo:{model}", batch, None, 0, False, ValueStore(scratch / "s0"))
    references = []
    for step in range(steps):
        references.append(
            run_reference(tf, original, (), False, ValueStore(scratch / f"s{step + 1}"))
        )
        original = dataclasses.replace(original, initial=references[-1].updated)
    return original, references


@pytest.mark.parametrize(("model", "name", "cluster_name", "restore"), CASES)
def test_a_plan_trains_as_the_single_device_graph_does(
    model: str, name: str, cluster_name: str, restore: bool, tmp_path: Path
) -> None:
    plan_dir, compiled = write_plan(tmp_path, model, name, cluster_name)
    tf = load_tensorflow()
    first = 1 if restore else 0  # from a checkpoint of the values after one step
    original, references = reference_steps(model, first + 2, tmp_path / "values")
    np.savez(tmp_path / "batch.npz", **original.feed)
    env = {**os.environ, "PYTHONPATH": str(REPO), BATCH_FILE: str(tmp_path / "batch.npz")}
    args = ["--input", "tests.planner.run.batches:repeated", "--steps", "2", "--check-replicas"]
    names = sorted(compiled.device_map["variables"])
    if restore:
        start = references[0].updated
        save_original(tf, model, {n: start.get(n) for n in names}, tmp_path / "start")
        args += ["--restore", str(tmp_path / "start")]
    started = time.perf_counter()
    result = run_tasks(
        plan_dir,
        len(CLUSTERS[cluster_name]["machines"]),
        env,
        *args,
        "--save",
        str(tmp_path / "out" / "ckpt"),
    )
    elapsed_s = time.perf_counter() - started
    expected_losses = [r.loss for r in references[first:]]
    np.testing.assert_allclose(result["losses"], expected_losses, rtol=RTOL, atol=ATOL)
    assert result["replica_difference"] in (None, 0.0)
    values = restore_original(tf, model, names, tmp_path / "out" / "ckpt")
    checks = [
        check_variable(references[-1], compiled, n, [(n, values[n])], RTOL, ATOL) for n in names
    ]
    problems = [p for _, found in checks for p in found]
    assert problems == []
    worst = max(checks, key=lambda c: c[0].max_rel_error)[0]
    print(
        f"{model} {name} on {cluster_name}: losses {result['losses']} vs {expected_losses}, "
        f"worst relative error {worst.max_rel_error:.2e} ({worst.name}, abs "
        f"{worst.max_abs_error:.2e}), {elapsed_s:.1f} s for every task"
    )


def test_a_tf2_plan_binds_its_captured_variables(tmp_path: Path) -> None:
    """zoo:mlp_tf2 (a Keras 3 MLP traced with tf.function), data parallel with unequal
    shares: two steps from verification's drawn values compute the reference's, every
    replica of each captured variable (parameters, Adam's slots, step counter, learning
    rate) stays equal, and a checkpoint keyed by the variables' names restores into
    every replica and saves back unchanged."""
    plan_dir, compiled = write_plan(tmp_path, "mlp_tf2", "weights", "two_by_two")
    tf = load_tensorflow()
    original, references = reference_steps("mlp_tf2", 2, tmp_path / "values")
    np.savez(tmp_path / "batch.npz", **original.feed)
    env = {**os.environ, "PYTHONPATH": str(REPO), BATCH_FILE: str(tmp_path / "batch.npz")}
    args = ["--input", "tests.planner.run.batches:repeated", "--steps", "2", "--check-replicas"]
    saved = tmp_path / "out" / "ckpt"
    result = run_tasks(plan_dir, 2, env, *args, "--save", str(saved))
    np.testing.assert_allclose(result["losses"], [r.loss for r in references], rtol=RTOL, atol=ATOL)
    assert result["replica_difference"] == 0.0
    # the plan the CLI wrote names the variables after the zoo manifest
    entries = json.loads((plan_dir / "device_map.json").read_text())["captured_variables"]
    assert len(entries) == 20 and all(len(e["replicas"]) == 4 for e in entries.values())
    checkpoint = tf.train.load_checkpoint(str(saved))
    keys = {name: entry["variable"] for name, entry in entries.items()}
    assert sorted(checkpoint.get_variable_to_shape_map()) == sorted(keys.values())
    checks = [
        check_variable(references[-1], compiled, n, [(n, checkpoint.get_tensor(k))], RTOL, ATOL)
        for n, k in keys.items()
    ]
    assert [p for _, found in checks for p in found] == []

    again = tmp_path / "again" / "ckpt"
    restore = ["--steps", "0", "--check-replicas", "--restore", str(saved), "--save", str(again)]
    restored = run_tasks(plan_dir, 2, env, *restore)
    assert restored["restored"] == str(saved) and restored["replica_difference"] == 0.0
    back = tf.train.load_checkpoint(str(again))
    for key in keys.values():
        np.testing.assert_array_equal(back.get_tensor(key), checkpoint.get_tensor(key))
    print(
        f"mlp_tf2 weights on two_by_two: losses {result['losses']} vs "
        f"{[r.loss for r in references]}, {len(keys)} captured variables x 4 replicas"
    )
