"""``tagplan simulate``: the predicted step of a graph under a strategy on a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tagplan.cli.common import (
    BatchInputOption,
    BatchSizeOption,
    GraphArgument,
    LossOption,
    analyze_source,
    console,
    print_json,
    user_errors,
)
from tagplan.planner.errors import InvalidInput
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.search.baselines import BASELINES, baseline_strategy
from tagplan.planner.sim.trace import dump_chrome_trace
from tagplan.planner.strategy import Strategy, load_strategy
from tagplan.planner.topology import load_cluster

GIB = 2**30


def load_strategy_argument(spec: str, evaluator: Evaluator) -> Strategy:
    """A baseline name or a strategy JSON file."""
    if spec in BASELINES:
        return baseline_strategy(spec, evaluator.ir, evaluator.cluster, evaluator.costs)
    path = Path(spec)
    if not path.is_file():
        raise InvalidInput(
            f"strategy {spec!r} is neither a baseline ({', '.join(BASELINES)}) nor a file"
        )
    return load_strategy(path.read_bytes())


def simulate_command(
    graph: GraphArgument,
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="Cluster file or name.")],
    strategy: Annotated[
        str, typer.Option("--strategy", "-s", help=f"{' | '.join(BASELINES)} or a JSON file.")
    ],
    batch_size: BatchSizeOption = None,
    loss: LossOption = None,
    batch_input: BatchInputOption = None,
    trace: Annotated[
        Path | None, typer.Option(help="Write a Chrome trace (opens in Perfetto).")
    ] = None,
    priority: Annotated[
        bool, typer.Option(help="Schedule by upward rank instead of FIFO (HeteroG §4.2).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Compile a strategy to tasks and simulate one training step."""
    with user_errors():
        source, ir = analyze_source(graph, batch_size, loss=loss, batch_inputs=batch_input)
        evaluator = Evaluator(ir, load_cluster(cluster), use_priority=priority)
        chosen = load_strategy_argument(strategy, evaluator)
        evaluation = evaluator.evaluate(chosen, by_class=False)  # every GPU's lanes
    result, tasks = evaluation.result, evaluation.compiled.task_graph
    devices = evaluator.cluster.device_names
    if trace is not None:
        dump_chrome_trace(trace, tasks, result)
    summary = {
        "graph": source.label,
        "cluster": cluster,
        "strategy": chosen.name or strategy,
        "batch_size": ir.batch_size,
        "step_time_s": result.step_time_s,
        "oom": bool(result.oom),
        "peak_memory_bytes": {
            d: int(b) for d, b in zip(devices, result.peak_memory_bytes, strict=True)
        },
        "overflow_bytes": {
            d: int(b) for d, b in zip(devices, result.overflow_bytes, strict=True) if b
        },
        "device_busy_fraction": {
            d: float(1 - f) for d, f in zip(devices, result.device_idle_fraction, strict=True)
        },
        "tasks": tasks.num_tasks,
        "measured_compute_fraction": evaluation.compiled.measured_fraction,
    }
    if as_json:
        print_json(summary)
        return
    console.print(
        f"[bold]{source.label}[/] on {cluster} with {summary['strategy']}: "
        f"step {result.step_time_s * 1e3:,.1f} ms ({tasks.num_tasks:,} tasks)"
        + (" [bold red]OUT OF MEMORY[/]" if result.oom else "")
    )
    table = Table()
    for column in ("GPU", "busy", "peak GiB", "capacity GiB"):
        table.add_column(column, justify="left" if column == "GPU" else "right")
    capacity = evaluator.cluster.device_memory_bytes
    for d, name in enumerate(devices):
        peak = result.peak_memory_bytes[d]
        table.add_row(
            name,
            f"{100 * (1 - result.device_idle_fraction[d]):.0f}%",
            f"{peak / GIB:,.1f}" + (" (OOM)" if peak > capacity[d] else ""),
            f"{capacity[d] / GIB:,.0f}",
        )
    console.print(table)
    if trace is not None:
        console.print(f"trace written to {trace}")
