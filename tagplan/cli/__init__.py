"""The ``tagplan`` command line: one entry point for every job a user or operator has."""

from __future__ import annotations

import typer

from tagplan.cli import (
    analyze,
    bench,
    cluster,
    compile,
    cost,
    keys,
    plan,
    profile,
    run,
    service,
    simulate,
    train,
    zoo,
)

app = typer.Typer(
    name="tagplan",
    help="Plan distributed training of TensorFlow graphs on heterogeneous GPU allocations.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("analyze")(analyze.analyze_command)
app.command("cluster")(cluster.cluster_command)
app.command("cost")(cost.cost_command)
app.command("simulate")(simulate.simulate_command)
app.command("compile")(compile.compile_command)
app.command("verify")(compile.verify_command)
app.command("plan")(plan.plan_command)
app.command("run")(run.run_command)
app.command("profile")(profile.profile_command)
app.command("profile-comm")(profile.profile_comm_command)
app.command("train")(train.train_command)
app.add_typer(zoo.app, name="zoo")
app.command("serve")(service.serve_command)
app.command("worker")(service.worker_command)
app.command("submit")(service.submit_command)
app.command("demo")(service.demo_command)
app.add_typer(keys.app, name="keys")
app.command("bench", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
    bench.bench_command
)


def main() -> None:
    """Console entry point."""
    app()
