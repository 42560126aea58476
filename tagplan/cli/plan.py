"""``tagplan plan``: search a deployment strategy and write everything a deployment needs."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from tagplan.cli.common import (
    BatchInputOption,
    BatchSizeOption,
    GraphArgument,
    LossOption,
    analyze_source,
    console,
    error_console,
    print_json,
    user_errors,
)
from tagplan.gnn import resolve_prior
from tagplan.planner.budget import Deadline
from tagplan.planner.plan import PlanOptions, PlanProgress, plan
from tagplan.planner.topology import load_cluster


def _write_outputs(out: Path, result, label: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "strategy.json").write_text(result.strategy.to_json())
    (out / "trace.json").write_text(json.dumps(result.chrome_trace()))
    (out / "report.md").write_text(result.report_markdown(f"tagplan plan: {label}"))
    (out / "summary.json").write_text(json.dumps(result.summary(), indent=2))
    if result.distributed is not None:
        (out / "distributed.pb").write_bytes(result.distributed.graph_def_bytes)
        (out / "device_map.json").write_text(json.dumps(result.distributed.device_map, indent=2))


def plan_command(
    graph: GraphArgument,
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="Cluster file or name.")],
    batch_size: BatchSizeOption = None,
    loss: LossOption = None,
    batch_input: BatchInputOption = None,
    budget_s: Annotated[
        float, typer.Option("--budget-s", help="Wall-clock budget of the whole plan.")
    ] = 60.0,
    iterations: Annotated[
        int | None, typer.Option(help="Iteration budget of each search tree.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the search (and of METIS).")] = 0,
    sfb: Annotated[
        bool, typer.Option("--sfb/--no-sfb", help="Decide sufficient-factor broadcast.")
    ] = True,
    shards: Annotated[int, typer.Option(help="Root-parallel search trees.")] = 1,
    processes: Annotated[
        int,
        typer.Option(
            min=1,
            help="Search trees run at once, each in a process of its own (for a machine's "
            "spare cores; raises --shards to as many).",
        ),
    ] = 1,
    pipeline: Annotated[
        bool,
        typer.Option(
            "--pipeline/--no-pipeline", help="Weigh pipelined strategies (micro-batches) too."
        ),
    ] = True,
    every_baseline: Annotated[
        bool,
        typer.Option(
            "--every-baseline",
            help="Simulate every baseline, also those a bound shows slower than one "
            "simulated before (they cannot be the plan; left out by default).",
        ),
    ] = False,
    prior: Annotated[
        str,
        typer.Option(
            help="The search's prior: 'gnn' (the shipped checkpoint), 'uniform', or a "
            "checkpoint file made by `tagplan train`."
        ),
    ] = "gnn",
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Write strategy.json, distributed.pb, device_map.json, trace.json, report.md.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Plan a graph on a cluster: MCTS over op groups, SFB, compile; compared with every
    baseline and the lower bound."""
    with user_errors():
        options = PlanOptions(
            budget_s=budget_s,
            iterations=iterations,
            seed=seed,
            sfb=sfb,
            shards=max(shards, processes),
            pipeline=pipeline,
            every_baseline=every_baseline,
        )
        deadline = Deadline.after(budget_s)  # reading and analyzing the graph count too
        search_prior, note = resolve_prior(prior)
        if note:
            error_console.print(f"note: {note}", highlight=False)
        source, ir = analyze_source(graph, batch_size, loss=loss, batch_inputs=batch_input)
        target = load_cluster(cluster)
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=as_json,
        ) as bar:
            task = bar.add_task("planning", total=budget_s, status="")

            def show(p: PlanProgress) -> None:
                best = f"best {p.best_speedup:.2f}x DP-NCCL" if p.best_speedup else ""
                bar.update(
                    task,
                    completed=min(p.elapsed_s, budget_s),
                    description=p.phase,
                    status=f"{p.iterations} it {best}",
                )

            result = plan(
                ir,
                target,
                graph_def=source.graph_def if out is not None else None,
                options=options,
                progress=show,
                deadline=deadline,
                prior=search_prior,
                processes=processes,
            )
        if result.graphdef_deferred:
            started = time.perf_counter()
            result = result.with_graphdef(source.graph_def, ir, target)
            error_console.print(
                "note: the distributed GraphDef did not fit in the budget and was compiled "
                f"after the plan ({time.perf_counter() - started:.1f} s)",
                highlight=False,
            )
    if out is not None:
        _write_outputs(out, result, source.label)
    if as_json:
        document = {"graph": source.label, "cluster": cluster, "batch_size": ir.batch_size}
        print_json(document | result.summary())
        return
    console.print(result.report_markdown(f"{source.label} on {cluster}"), highlight=False)
    if out is not None:
        console.print(f"written to {out}/")
