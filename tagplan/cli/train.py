"""``tagplan train``: train the GNN prior from the search's own visit counts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tagplan.cli.common import console, print_json, user_errors


def train_command(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Run directory (data, state, checkpoint).")
    ],
    models: Annotated[
        str | None,
        typer.Option(help="Comma-separated zoo models or graph files (default: the zoo's)."),
    ] = None,
    exclude: Annotated[
        str | None, typer.Option(help="Comma-separated models to leave out (unseen-model tests).")
    ] = None,
    clusters_per_model: Annotated[int, typer.Option(help="Random clusters per model.")] = 8,
    larger_machines: Annotated[
        tuple[int, int],
        typer.Option(help="Machines (low high) of every third case's larger cluster."),
    ] = (4, 8),
    iterations: Annotated[int, typer.Option(help="Search iterations per case.")] = 150,
    epochs: Annotated[int, typer.Option(help="Training epochs per round.")] = 40,
    rounds: Annotated[
        int, typer.Option(help="Generate-and-fit rounds (AlphaZero: round k searches with k-1).")
    ] = 2,
    seed: Annotated[int, typer.Option(help="Seed of the cases, the split and the weights.")] = 0,
    workers: Annotated[int, typer.Option(help="Processes generating data.")] = 2,
    ablation: Annotated[
        str,
        typer.Option(help="Train without a part of the graph: none, no-feedback, no-device-graph."),
    ] = "none",
    min_visits: Annotated[
        int | None,
        typer.Option(
            help="Visits a vertex needs to be a training example (default: 6; 3 with "
            "--layout-head-on, whose vertices are fewer)."
        ),
    ] = None,
    layout_head_on: Annotated[
        Path | None,
        typer.Option(
            help="Train only a layout head (pipelines in the search) on this checkpoint's "
            "network, whose weights stay as they are."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Generate search data over zoo models x random clusters and fit the prior (or, with
    --layout-head-on, its layout head); rerun the same command to resume. Writes
    ROUND/prior.pt (+ .json) and run.json in OUT."""
    with user_errors():
        from tagplan.gnn.model import DEFAULT_HYPER
        from tagplan.gnn.train import TRAIN_MODELS, TrainOptions, train
        from tagplan.gnn.train_layouts import train_layouts
        from tagplan.planner.errors import InvalidInput

        chosen = tuple(m for m in (models.split(",") if models else TRAIN_MODELS) if m)
        left_out = tuple(m for m in (exclude.split(",") if exclude else ()) if m)
        unknown = sorted(set(left_out) - set(chosen))
        if unknown:
            raise InvalidInput(f"--exclude names models the run does not train on: {unknown}")
        options = TrainOptions(
            models=chosen,
            exclude=left_out,
            clusters_per_model=clusters_per_model,
            larger_machines=larger_machines,
            seed=seed,
            rounds=rounds,
            iterations=iterations,
            epochs=epochs,
            workers=workers,
            min_visits=min_visits or (3 if layout_head_on else 6),
            hyper={**DEFAULT_HYPER, "ablation": ablation},
        )
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            disable=as_json,
        ) as bar:
            tasks: dict[str, int] = {}

            def show(stage: str, done: int, total: int) -> None:
                if stage not in tasks:
                    tasks[stage] = bar.add_task(stage, total=total)
                bar.update(tasks[stage], completed=done, total=total)

            if layout_head_on is None:
                checkpoint = train(out, options, progress=show)
            else:
                checkpoint = train_layouts(out, layout_head_on, options, progress=show)
    record = json.loads((out / "run.json").read_text())
    metrics = record["rounds"][-1]["metrics"]
    if as_json:
        print_json({"checkpoint": str(checkpoint), "metrics": metrics})
        return
    console.print(f"checkpoint: {checkpoint}")
    for name, value in metrics.items():
        shown = f"{value:.4g}" if isinstance(value, float) else str(value)
        console.print(f"  {name}: {shown}")
