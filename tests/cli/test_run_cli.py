"""``tagplan run``'s bad input: one line on stderr and exit code 2, before anything starts
(a missing or mismatched plan, a wrong task or address, no batches, a checkpoint that lacks a
captured variable, a plan with both kinds of variables), and a worker that never answers
is refused after ``--connect-timeout-s``, not waited for."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tagplan.cli import app
from tagplan.cli.common import EXIT_BAD_INPUT
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.protos import dtype_name
from tagplan.planner.run.plan_dir import (
    SYNTHETIC,
    load_input_function,
    load_plan,
    synthetic_batches,
)
from tagplan.planner.verify.reference import load_tensorflow
from tests.planner.run.test_run import CLUSTERS, REPO, free_ports

runner = CliRunner()


def _compile(tmp_path: Path, strategy: str, model: str = "mlp") -> Path:
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps(CLUSTERS["two_by_two"]))
    out = tmp_path / f"{model}-{strategy}"
    result = runner.invoke(
        app, ["compile", f"zoo:{model}", "-c", str(cluster), "-s", strategy, "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("plans")
    found = {name: _compile(root, name) for name in ("dp-nccl", "dp-ps")}
    return {**found, "tf2": _compile(root, "dp-nccl", "mlp_tf2")}


def _refused(*args: str) -> str:
    result = runner.invoke(app, ["run", *args])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    return lines[0]


WORKERS = "localhost:1,localhost:2"


def test_help_names_every_option_an_operator_needs() -> None:
    result = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    for option in (
        "--task",
        "--workers",
        "--input",
        "--steps",
        "--restore",
        "--save",
        "--cpu",
        "--connect-timeout-s",
        "--step-timeout-s",
        "--check-replicas",
    ):
        assert option in result.output, option


def test_a_missing_plan_directory_is_refused(tmp_path: Path) -> None:
    assert "no plan directory" in _refused(
        str(tmp_path / "none"), "--task", "0", "--workers", WORKERS
    )


def test_a_graph_that_is_not_the_device_maps_is_refused(
    plans: dict[str, Path], tmp_path: Path
) -> None:
    mixed = tmp_path / "mixed"
    shutil.copytree(plans["dp-nccl"], mixed)
    shutil.copy(plans["dp-ps"] / "distributed.pb", mixed / "distributed.pb")
    assert "digest differs" in _refused(str(mixed), "--task", "1", "--workers", WORKERS)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "2", "--workers", WORKERS], "task 2 is not one of the plan's tasks 0..1"),
        (["--task", "0", "--workers", "localhost:1"], "the plan has 2 tasks"),
        (["--task", "0", "--workers", "localhost,localhost:2"], "is not host:port"),
        (["--task", "0", "--workers", WORKERS], "--input module:function"),
        (["--task", "0", "--workers", WORKERS, "--input", "no_such_module:f"], "cannot import"),
    ],
)
def test_a_wrong_task_address_or_input_is_refused(
    plans: dict[str, Path], args: list[str], message: str
) -> None:
    assert message in _refused(str(plans["dp-nccl"]), *args)


@pytest.mark.tf
@pytest.mark.slow
def test_a_worker_that_never_answers_is_refused_after_the_timeout(plans: dict[str, Path]) -> None:
    chief, absent = free_ports(2)
    started = time.perf_counter()
    workers = f"localhost:{chief},localhost:{absent}"
    run = [sys.executable, "-m", "tagplan", "run", str(plans["dp-nccl"]), "--task", "0"]
    done = subprocess.run(
        [*run, "--workers", workers, "--cpu", "--steps", "0", "--connect-timeout-s", "2"],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_BAD_INPUT, done.stderr[-2000:]
    assert f"worker task 1 at localhost:{absent} did not answer within 2 s" in done.stderr
    assert "Traceback" not in done.stderr
    assert time.perf_counter() - started < 60


def test_synthetic_batches_take_the_shapes_and_types_of_the_plans_inputs(
    plans: dict[str, Path],
) -> None:
    plan = load_plan(plans["dp-nccl"])
    batches = load_input_function(SYNTHETIC, plan)()
    first, second = next(iter(batches)), next(iter(batches))
    placeholders = {node.name: node for node in plan.graph_def.node if node.op == "Placeholder"}
    assert sorted(first) == sorted(plan.device_map["inputs"])
    for name, value in first.items():
        node = placeholders[plan.device_map["inputs"][name][0][0]]
        dims = [d.size for d in node.attr["shape"].shape.dim]
        assert value.shape == (32, *dims[1:])
        assert value.dtype == np.dtype(dtype_name(node.attr["dtype"].type))
        if np.issubdtype(value.dtype, np.integer):
            assert not value.any()  # a valid class and token id for every model
        else:
            assert value.std() > 0.5 and not np.array_equal(value, second[name])
    feed = plan.split(first)  # the replica placeholders' rows make up the whole batch
    for name, pieces in plan.device_map["inputs"].items():
        rows = np.concatenate([feed[f"{node}:0"] for node, _, _ in pieces])
        np.testing.assert_array_equal(rows, first[name])


def test_synthetic_batches_need_known_shapes(plans: dict[str, Path]) -> None:
    plan = load_plan(plans["dp-nccl"])
    graph_def = type(plan.graph_def).FromString(plan.graph_def.SerializeToString())
    placeholder = plan.device_map["inputs"]["features"][0][0]
    node = next(n for n in graph_def.node if n.name == placeholder)
    node.attr["shape"].shape.dim[1].size = -1
    unknown = dataclasses.replace(plan, graph_def=graph_def)
    with pytest.raises(InvalidInput, match="unknown size"):
        next(iter(synthetic_batches(unknown)))


@pytest.mark.tf
@pytest.mark.parametrize(
    ("saved", "message"),
    [
        ({"dense_0/bias": np.zeros(256, np.float32)}, "holds no 'dense_0/kernel'"),
        (
            {"dense_0/kernel": np.zeros(3, np.float32)},
            "'dense_0/kernel' is float32 [3]; the plan's is float32 [784, 256]",
        ),
    ],
)
def test_a_checkpoint_without_a_captured_variable_is_refused_before_anything_starts(
    plans: dict[str, Path], tmp_path: Path, saved: dict[str, np.ndarray], message: str
) -> None:
    prefix = str(tmp_path / "ckpt")
    load_tensorflow().raw_ops.SaveV2(
        prefix=prefix,
        tensor_names=list(saved),
        shape_and_slices=[""] * len(saved),
        tensors=list(saved.values()),
    )
    args = ["--task", "0", "--workers", WORKERS, "--steps", "0", "--restore", prefix]
    assert message in _refused(str(plans["tf2"]), *args)


def test_a_plan_with_both_kinds_of_variables_is_refused(
    plans: dict[str, Path], tmp_path: Path
) -> None:
    mixed = tmp_path / "mixed"
    shutil.copytree(plans["tf2"], mixed)
    device_map = json.loads((mixed / "device_map.json").read_text())
    device_map["variables"] = {"w": ["w/replica_0"]}
    (mixed / "device_map.json").write_text(json.dumps(device_map))
    args = ["--task", "0", "--workers", WORKERS, "--steps", "0"]
    assert "both TF1 variables and captured variables" in _refused(str(mixed), *args)
