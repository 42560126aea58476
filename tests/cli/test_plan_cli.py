"""``tagplan plan``: the JSON document, the output directory, and bad input as exit 2."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tagplan.cli import app
from tagplan.cli.common import EXIT_BAD_INPUT
from tagplan.gnn import shipped_prior_name
from tagplan.planner.graph.protos import GraphDef
from tagplan.planner.strategy import load_strategy

runner = CliRunner()


def test_plan_json_and_output_directory(tmp_path) -> None:
    out = tmp_path / "plan"
    args = ["plan", "zoo:mlp", "-c", "testbed", "--iterations", "5", "--seed", "1"]
    result = runner.invoke(app, [*args, "--json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    for key in ("step_time_s", "baselines", "lower_bound_s", "speedup_vs_dp_nccl", "plan_time_s"):
        assert key in summary
    assert summary["iterations"] == 5
    assert summary["prior"] == shipped_prior_name()  # the shipped GNN guides by default
    assert summary["speedup_vs_dp_nccl"] == summary["baselines"]["dp-nccl"] / summary["step_time_s"]
    assert load_strategy(json.dumps(summary["strategy"])) == load_strategy(
        (out / "strategy.json").read_text()
    )
    files = {p.name for p in out.iterdir()}
    assert files >= {
        "strategy.json",
        "distributed.pb",
        "device_map.json",
        "trace.json",
        "report.md",
    }
    load_strategy((out / "strategy.json").read_text())
    graph = GraphDef()
    graph.ParseFromString((out / "distributed.pb").read_bytes())
    assert graph.node and all(node.device.startswith("/job:worker/") for node in graph.node)
    assert "| m-etf |" in (out / "report.md").read_text()
    assert json.loads((out / "trace.json").read_text())["traceEvents"]


def test_a_graphdef_past_the_budget_is_written_after_the_plan(tmp_path, monkeypatch) -> None:
    """With ``--out``, a GraphDef whose compile did not fit in the budget is compiled
    after the plan, said on stderr, and written like any other."""
    from tagplan.planner import plan as plan_module

    monkeypatch.setattr(plan_module, "_GRAPHDEF_EVALUATIONS", 10**6)
    out = tmp_path / "plan"
    args = ["plan", "zoo:mlp", "-c", "testbed", "--iterations", "3", "--no-sfb", "--json"]
    result = runner.invoke(app, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["graphdef_deferred"] is True
    assert "compiled after the plan" in " ".join(result.stderr.split())
    graph = GraphDef.FromString((out / "distributed.pb").read_bytes())
    assert graph.node and json.loads((out / "device_map.json").read_text())


def test_plan_refuses_bad_input_with_exit_2() -> None:
    result = runner.invoke(app, ["plan", "zoo:mlp", "-c", "nowhere"])
    assert result.exit_code == EXIT_BAD_INPUT
    result = runner.invoke(app, ["plan", "zoo:mlp", "-c", "testbed", "--budget-s", "0"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "budget_s" in result.output


def test_plan_takes_the_prior_by_name_or_file(tmp_path) -> None:
    args = ["plan", "zoo:mlp", "-c", "testbed", "--iterations", "3", "--no-sfb", "--json"]
    uniform = runner.invoke(app, [*args, "--prior", "uniform"])
    assert uniform.exit_code == 0, uniform.output
    assert json.loads(uniform.stdout)["prior"] == "uniform"
    missing = runner.invoke(app, [*args, "--prior", str(tmp_path / "none.pt")])
    assert missing.exit_code == EXIT_BAD_INPUT and "checkpoint file" in missing.output
    broken = tmp_path / "broken.pt"
    broken.write_bytes(b"not torch")
    refused = runner.invoke(app, [*args, "--prior", str(broken)])
    assert refused.exit_code == EXIT_BAD_INPUT and "refused" in refused.output
