"""``tagplan run``: one task of a plan on TensorFlow's distributed runtime; task 0 trains
(docs/run-a-plan.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tagplan.cli.common import console, print_json, user_errors
from tagplan.planner.errors import InvalidInput
from tagplan.planner.run.plan_dir import load_input_function, load_plan, parse_workers
from tagplan.planner.run.runtime import RunOptions, serve, train


def run_command(
    plan_dir: Annotated[
        Path, typer.Argument(help="Directory written by tagplan compile or plan -o.")
    ],
    task: Annotated[int, typer.Option("--task", help="This process's task index (0 trains).")],
    workers: Annotated[
        str,
        typer.Option(
            "--workers", help="Every task's address, in task order: host:port,host:port,..."
        ),
    ],
    input_function: Annotated[
        str | None,
        typer.Option(
            "--input",
            help="Task 0: module:function returning an iterable of whole batches (dicts of "
            "numpy arrays keyed by the original input names), or synthetic: random batches "
            "shaped like the plan's inputs.",
        ),
    ] = None,
    steps: Annotated[int, typer.Option(min=0, help="Task 0: training steps to run.")] = 1,
    restore: Annotated[
        str | None,
        typer.Option(help="Task 0: start from this checkpoint (prefix or directory), not init."),
    ] = None,
    save: Annotated[
        str | None, typer.Option(help="Task 0: write a checkpoint here at the end.")
    ] = None,
    cpu: Annotated[
        bool, typer.Option("--cpu", help="Run each GPU of the plan as a CPU device.")
    ] = False,
    connect_timeout_s: Annotated[
        float,
        typer.Option("--connect-timeout-s", min=0.0, help="How long task 0 waits for the others."),
    ] = 60.0,
    step_timeout_s: Annotated[
        float, typer.Option("--step-timeout-s", min=0.0, help="Longest a session run may take.")
    ] = 600.0,
    check_replicas: Annotated[
        bool,
        typer.Option(
            "--check-replicas",
            help="Task 0: report how far a variable's replicas differ after the start or any step.",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Task 0: print one JSON object.")] = False,
) -> None:
    """Start task TASK of a plan on this machine; task 0 also initializes (or restores),
    trains, saves and then stops the other tasks."""
    with user_errors():
        plan = load_plan(plan_dir)
        options = RunOptions(
            task=task,
            workers=parse_workers(workers, plan, task),
            cpu=cpu,
            connect_timeout_s=connect_timeout_s,
            step_timeout_s=step_timeout_s,
        )
        if task != 0:
            serve(plan, options)
            return
        if input_function is None and steps:
            raise InvalidInput(
                "task 0 trains: name its batches with --input module:function (or synthetic)"
            )
        batches = load_input_function(input_function, plan)() if input_function else ()
        with Progress(
            TextColumn("step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TimeElapsedColumn(),
            console=console,
            disable=as_json,
        ) as bar:
            shown = bar.add_task("training", total=steps, loss="-")

            def show(step: int, loss: float) -> None:
                bar.update(shown, completed=step + 1, loss=f"{loss:.6g}")
                if not as_json:
                    console.log(f"step {step}: loss {loss:.6g}", highlight=False)

            result = train(
                plan,
                options,
                batches,
                steps,
                restore=restore,
                save=save,
                check_replicas=check_replicas,
                on_step=show,
            )
    if as_json:
        print_json(result.to_dict())
        return
    rate = f", {len(result.losses) / result.steps_s:.2f} steps/s" if result.steps_s else ""
    console.print(f"{len(result.losses)} steps{rate}", highlight=False)
    if len(result.losses) < steps:
        console.print(f"the input ended after {len(result.losses)} batches", highlight=False)
    if result.replica_difference is not None:
        console.print(
            f"replicas differ by at most {result.replica_difference:.3g} ({result.worst_variable})",
            highlight=False,
        )
    if result.saved:
        console.print(f"saved {result.saved}", highlight=False)
