"""The ``tagplan`` command: JSON output, and bad input as exit code 2 with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tagplan.cli import app
from tagplan.cli.bench import benchmarks
from tagplan.cli.common import EXIT_BAD_INPUT, print_json
from tests.planner.graph.builders import const, dense_graph, document, op

runner = CliRunner()
PROFILES = Path(__file__).resolve().parents[2] / "bench" / "profiles"


def invoke(*args: str):
    return runner.invoke(app, list(args))


def test_analyze_json_has_the_documented_fields() -> None:
    result = invoke("analyze", "zoo:mlp", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    for key in (
        "ops",
        "tensors",
        "param_bytes",
        "gradients",
        "batch_size",
        "split_categories",
        "fingerprint",
    ):
        assert key in summary
    assert summary["batch_size"] == 32
    assert set(summary["split_categories"]) == {"split-concat", "split-sum", "none"}


def test_analyze_lists_op_types_without_a_cost_formula(tmp_path) -> None:
    doc = dense_graph(batch=8)
    doc["nodes"] += [
        const("axis", [0]),
        op("running", "Cumsum", ["y", "axis"], [8, 3], Tidx={"type": "int32"}),
    ]
    for entry in doc["nodes"]:  # the loss sums the running sums
        if entry["name"] == "loss":
            entry["inputs"][0] = "running"
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(doc))
    result = invoke("analyze", str(path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["no_cost_formula"] == {"Cumsum": 1}
    assert "without a cost formula" in invoke("analyze", str(path)).output


def test_a_graph_without_a_clear_loss_is_named_in_a_warning_and_takes_loss(tmp_path) -> None:
    doc = dense_graph(batch=8)
    doc["nodes"].append(op("total", "Sum", ["y", "axes"], [], Tidx={"type": "int32"}))
    for entry in doc["nodes"]:  # two scalars nobody reads, neither named "loss"
        if entry["name"] == "loss":
            entry["name"] = "other"
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(doc))
    unclear = invoke("analyze", str(path), "--json")
    assert unclear.exit_code == 0 and "no loss found" in unclear.stderr
    extras = {"analyze": [], "cost": ["--gpu", "T4"], "simulate": ["-c", "testbed", "-s", "single"]}
    for command, extra in extras.items():
        named = invoke(command, str(path), "--loss", "total", *extra, "--json")
        assert named.exit_code == 0, named.output
        assert "no loss found" not in named.stderr


def test_json_output_is_strict_json_with_null_for_non_finite_numbers(capsys) -> None:
    print_json({"worst": float("inf"), "errors": [float("nan"), 1.5]})
    assert json.loads(capsys.readouterr().out) == {"worst": None, "errors": [None, 1.5]}


def test_analyze_batch_size_option(tmp_path) -> None:
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(dense_graph(batch=8)))
    result = invoke("analyze", str(path), "--batch-size", "32", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["batch_size"] == 32


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x0a\xff\xff\xff\xff\x0f", "not a valid binary GraphDef"),
        (
            json.dumps(
                document([op("a", "Relu", ["b"], [1]), op("b", "Relu", ["a"], [1])])
            ).encode(),
            "cycle",
        ),
        (json.dumps(document([op("a", "Relu", [], [1])])).encode(), "no batch input"),
    ],
)
def test_bad_graphs_exit_2_with_the_reason(tmp_path, content: bytes, message: str) -> None:
    path = tmp_path / "graph.pb"
    path.write_bytes(content)
    result = invoke("analyze", str(path))
    assert result.exit_code == EXIT_BAD_INPUT
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_unknown_zoo_model_lists_the_known_ones() -> None:
    result = invoke("analyze", "zoo:alexnet")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "vgg19" in result.stderr


def test_train_refuses_to_leave_out_a_model_it_does_not_train_on(tmp_path) -> None:
    result = invoke("train", "--out", str(tmp_path / "run"), "--exclude", "bert_large")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "bert_large" in result.stderr
    assert not (tmp_path / "run").exists()


def test_cluster_json_and_named_listing() -> None:
    result = invoke("cluster", "testbed", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["machines"], summary["gpus"]) == (7, 16)
    listing = invoke("cluster")
    assert "random:SEED" in listing.stdout


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {
                "machines": [
                    {"name": "a", "gpus": {"type": "Z100", "count": 1}, "intra_bandwidth_gbps": 10}
                ]
            },
            "known types: A10",
        ),
        (
            {
                "machines": [
                    {"name": "a", "gpus": {"type": "T4", "count": 1}, "intra_bandwidth_gbps": 0}
                ]
            },
            "intra_bandwidth_gbps",
        ),
    ],
)
def test_bad_clusters_exit_2_with_the_reason(tmp_path, spec: dict, message: str) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(spec))
    result = invoke("cluster", str(path))
    assert result.exit_code == EXIT_BAD_INPUT
    assert message in result.stderr


def test_zoo_list_names_every_model() -> None:
    result = invoke("zoo", "list", "--json")
    assert result.exit_code == 0
    names = {m["name"] for m in json.loads(result.stdout)["models"]}
    assert {
        "vgg19",
        "resnet101",
        "inception_v3",
        "transformer",
        "bert_small",
        "bert_large",
    } <= names


def test_cost_json_has_the_documented_fields() -> None:
    result = invoke("cost", "zoo:mlp", "--gpu", "V100-32GB", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    for key in (
        "compute_time_s",
        "param_bytes",
        "optimizer_bytes",
        "activation_bytes",
        "estimated_fraction",
    ):
        assert key in summary
    assert summary["estimated_fraction"] == 1.0  # no profile given
    assert summary["optimizer_bytes"] == 2 * summary["param_bytes"]  # Adam's m and v


def test_simulate_json_and_trace(tmp_path) -> None:
    trace = tmp_path / "trace.json"
    result = invoke(
        "simulate",
        "zoo:mlp",
        "--cluster",
        "testbed",
        "--strategy",
        "dp-nccl",
        "--trace",
        str(trace),
        "--json",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["step_time_s"] > 0 and summary["oom"] is False
    assert len(summary["peak_memory_bytes"]) == len(summary["device_busy_fraction"]) == 16
    assert json.loads(trace.read_text())["traceEvents"]


def test_simulate_refuses_an_unknown_strategy() -> None:
    result = invoke("simulate", "zoo:mlp", "--cluster", "testbed", "--strategy", "magic")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "dp-nccl" in result.stderr


@pytest.mark.tf
def test_profile_writes_a_profile_that_cost_accepts(tmp_path) -> None:
    out = tmp_path / "profile.json"
    result = invoke(
        "profile",
        "zoo:mlp",
        "--out",
        str(out),
        "--batch-sizes",
        "8,16",
        "--runs",
        "3",
        "--warmup",
        "1",
    )
    assert result.exit_code == 0, result.output
    cost = invoke("cost", "zoo:mlp", "--gpu", "CPU", "-b", "16", "--profile", str(out), "--json")
    assert cost.exit_code == 0, cost.output
    assert json.loads(cost.stdout)["estimated_fraction"] < 0.5


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p["device"].update(gpu_type="Z100"), "unknown GPU type 'Z100'"),
        (lambda p: p["ops"][0]["times_s"].update({"2": -1.0}), "times_s"),
        (lambda p: p.update(format="other"), "format"),
    ],
)
def test_cost_refuses_bad_profiles_with_the_reason(tmp_path, edit, message) -> None:
    profile = json.loads((PROFILES / "cpu_vgg19.json").read_text())
    edit(profile)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    result = invoke("cost", "zoo:vgg19", "--gpu", "CPU", "-b", "2", "--profile", str(path))
    assert result.exit_code == EXIT_BAD_INPUT
    assert message in result.stderr


def test_compile_writes_the_graph_and_device_map(tmp_path) -> None:
    result = invoke("compile", "zoo:mlp", "-c", "testbed", "-s", "dp-nccl", "-o", str(tmp_path))
    assert result.exit_code == 0, result.output
    device_map = json.loads((tmp_path / "device_map.json").read_text())
    assert device_map["train_op"] and device_map["variables"]
    from tagplan.planner.graph.load import load_graph_def

    graph = load_graph_def(tmp_path / "distributed.pb")
    devices = {node.device for node in graph.node if node.device}
    assert any("/task:0/device:GPU:3" in d for d in devices)


def test_compile_places_a_model_parallel_split_where_the_planner_evaluated_it(tmp_path) -> None:
    """The default model-parallel split is balanced by the ops' FLOPs when the planner
    evaluates a strategy; the compiled GraphDef puts every op where that evaluation did
    (with every op weighing the same, some ops land on other GPUs)."""
    from tagplan.planner.compile.graphdef import worker_device
    from tagplan.planner.evaluate import Evaluator, resolve_planned
    from tagplan.planner.graph.load import load_graph_def
    from tagplan.planner.strategy import GroupDecision, Option, Strategy, resolve
    from tagplan.planner.topology import load_cluster
    from tests.planner.zoo_graphs import zoo_ir

    ir, cluster = zoo_ir("mlp"), load_cluster("testbed")
    strategy = Strategy(
        name="split", default=GroupDecision(device_groups=[0, 1], option=Option.MODEL_PARALLEL)
    )
    evaluated = Evaluator(ir, cluster).evaluate(strategy).resolved
    assert (resolve_planned(strategy, ir, cluster).op_device == evaluated.op_device).all()
    assert (resolve(strategy, ir, cluster).op_device != evaluated.op_device).any()
    path = tmp_path / "split.json"
    path.write_text(strategy.to_json())
    result = invoke("compile", "zoo:mlp", "-c", "testbed", "-s", str(path), "-o", str(tmp_path))
    assert result.exit_code == 0, result.output
    devices = {n.name: n.device for n in load_graph_def(tmp_path / "distributed.pb").node}
    placed = list(zip(ir.op_names, evaluated.op_device.tolist(), strict=True))
    assert sum(name in devices for name, _ in placed) == ir.num_ops
    for name, device in placed:
        assert devices[name] == worker_device(cluster, int(device)), name


@pytest.mark.tf
def test_verify_passes_for_data_parallelism_and_reports_json() -> None:
    result = invoke("verify", "zoo:mlp", "-c", "testbed", "-s", "dp-nccl", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["passed"] is True


@pytest.mark.tf
def test_verify_takes_loss_as_the_other_commands_do() -> None:
    named = invoke("verify", "zoo:mlp", "-c", "testbed", "-s", "dp-nccl", "--loss", "loss")
    assert named.exit_code == 0, named.output
    unknown = invoke("verify", "zoo:mlp_tf2", "-c", "testbed", "-s", "dp-nccl", "--loss", "x")
    assert unknown.exit_code == EXIT_BAD_INPUT
    assert "loss node 'x' is not in the graph" in unknown.output


@pytest.mark.tf
def test_compile_maps_a_tf2_functions_captured_variables(tmp_path) -> None:
    args = ("compile", "zoo:mlp_tf2", "-c", "testbed", "-s", "dp-nccl", "-o", str(tmp_path))
    assert invoke(*args).exit_code == 0
    captured = json.loads((tmp_path / "device_map.json").read_text())["captured_variables"]
    assert captured["adam/Add/ReadVariableOp/resource"]["variable"] == "adam/iteration"
    assert {len(entry["replicas"]) for entry in captured.values()} == {16}


@pytest.mark.tf
def test_verify_runs_a_graph_file_at_its_own_batch_and_says_so(tmp_path) -> None:
    from tagplan.planner.zoo import read_graph_bytes

    path = tmp_path / "mlp.pb"
    path.write_bytes(read_graph_bytes("mlp"))
    result = invoke("verify", str(path), "-c", "testbed", "-s", "dp-nccl", "-b", "4")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "was built for batch 32 and runs at it" in result.output


@pytest.mark.tf
def test_verify_refuses_another_image_size_for_a_model_without_global_pooling() -> None:
    result = invoke("verify", "zoo:mlp", "-c", "testbed", "-s", "dp-nccl", "--image-size", "64")
    assert result.exit_code != 0
    assert "not rebuilt at another image size" in result.output


@pytest.mark.tf
def test_verify_refuses_a_step_over_its_memory_limit_with_the_estimate() -> None:
    result = invoke(
        "verify", "zoo:mlp", "-c", "testbed", "-s", "dp-nccl", "--max-memory-gib", "0.5"
    )
    assert result.exit_code == 2
    assert "needs about 1.0 GiB of memory and the limit is 0.5 GiB" in result.output
    assert "--precision float32" in result.output


def test_submit_to_a_closed_port_is_one_line_and_its_own_exit_code() -> None:
    import socket

    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = invoke("submit", "zoo:mlp", "-c", "testbed", "--server", f"http://127.0.0.1:{port}")
    assert result.exit_code == 3
    lines = result.stderr.strip().splitlines()
    url = f"http://127.0.0.1:{port}"
    assert len(lines) == 1 and f"cannot reach the tagplan service at {url}" in lines[0]
    assert "Traceback" not in result.output


def test_submit_of_a_missing_graph_file_is_bad_input() -> None:
    result = invoke("submit", "no/such/graph.pb", "-c", "testbed")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "No such file" in result.stderr and "Traceback" not in result.output


def test_bench_lists_the_benchmarks_and_runs_one_with_its_options() -> None:
    """``tagplan bench`` lists bench/'s scripts with what each measures; a name runs it
    with the options after it (its own exit code back); an unknown name is bad input."""
    listed = invoke("bench")
    assert listed.exit_code == 0, listed.output
    assert "search_depth" in listed.output
    assert "search_depth" in benchmarks() and "report" not in benchmarks()  # a helper
    assert invoke("bench", "search_depth", "--", "--help").exit_code == 0
    assert invoke("bench", "search_depth", "--no-such-option").exit_code == 2  # argparse's
    unknown = invoke("bench", "nope")
    assert unknown.exit_code == EXIT_BAD_INPUT and "no benchmark 'nope'" in unknown.output
