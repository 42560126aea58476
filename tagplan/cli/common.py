"""What every command shares: graph and cluster arguments, errors as exit code 2."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import typer
from rich.console import Console

from tagplan.planner.errors import PlannerError

__all__ = ["EXIT_BAD_INPUT", "console", "print_json", "user_errors"]

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
