"""What every command shares: graph and cluster arguments, errors as exit code 2."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from tagplan.planner.errors import PlannerError
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.source import GraphSource, load_graph_source

__all__ = [
    "EXIT_BAD_INPUT",
    "BatchInputOption",
    "BatchSizeOption",
    "GraphArgument",
    "LossOption",
    "analyze_source",
    "console",
    "print_json",
    "user_errors",
]

GraphArgument = Annotated[str, typer.Argument(help="Graph file (GraphDef or JSON) or zoo:NAME.")]
BatchSizeOption = Annotated[
    int | None, typer.Option("--batch-size", "-b", help="Job batch size (default: the graph's).")
]

LossOption = Annotated[
    str | None,
    typer.Option(
        help="Name of the loss node (default: 'loss', else the one scalar the step returns)."
    ),
]
BatchInputOption = Annotated[
    list[str] | None,
    typer.Option("--batch-input", help="A node feeding training data (repeatable)."),
]

EXIT_BAD_INPUT = 2
console = Console()
error_console = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the engine's errors into one line on stderr and exit code 2, never a traceback."""
    try:
        yield
    except PlannerError as exc:
        error_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float (an infinite relative error, a NaN) as None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def print_json(document: Any) -> None:
    """Machine-readable output: one JSON object on stdout, strict JSON (RFC 8259): a number
    that is infinite or not a number is written as ``null``."""
    sys.stdout.write(json.dumps(_finite(document), indent=2, allow_nan=False) + "\n")


def analyze_source(
    graph: str,
    batch_size: int | None,
    *,
    loss: str | None = None,
    batch_inputs: list[str] | None = None,
) -> tuple[GraphSource, GraphIR]:
    """Load ``graph`` (a path or ``zoo:NAME``) and analyze it at ``batch_size``; say on
    stderr when no loss was found."""
    source = load_graph_source(graph)
    ir = analyze(
        source.graph_def,
        batch_size=batch_size,
        batch_inputs=batch_inputs or source.batch_inputs,
        loss=loss or source.loss,
    )
    if ir.loss_op < 0:
        error_console.print(
            f"[yellow]warning:[/] no loss found in {source.label}: name it with --loss (the "
            "plan, its compiled graph and verification need it)",
            highlight=False,
            soft_wrap=True,
        )
    return source, ir
