"""What every command shares: graph and cluster arguments, errors as exit code 2."""

from __future__ import annotations

import json
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
    "BatchSizeOption",
    "GraphArgument",
    "analyze_source",
    "console",
    "print_json",
    "user_errors",
]

GraphArgument = Annotated[str, typer.Argument(help="Graph file (GraphDef or JSON) or zoo:NAME.")]
BatchSizeOption = Annotated[
    int | None, typer.Option("--batch-size", "-b", help="Job batch size (default: the graph's).")
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


def print_json(document: Any) -> None:
    """Machine-readable output: one JSON object on stdout."""
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=False) + "\n")


def analyze_source(
    graph: str,
    batch_size: int | None,
    *,
    loss: str | None = None,
    batch_inputs: list[str] | None = None,
) -> tuple[GraphSource, GraphIR]:
    """Load ``graph`` (a path or ``zoo:NAME``) and analyze it at ``batch_size``."""
    source = load_graph_source(graph)
    ir = analyze(
        source.graph_def,
        batch_size=batch_size,
        batch_inputs=batch_inputs or source.batch_inputs,
        loss=loss or source.loss,
    )
    return source, ir
