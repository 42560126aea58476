"""``tagplan bench``: the benchmarks behind BENCHMARKS.md, listed or run by name.

They live in the source tree's ``bench/`` beside the package (each a module run as
``python -m bench.NAME``, writing its own section of BENCHMARKS.md), not in the installed
package: an install without the source tree has none, and says so.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tagplan.cli.common import EXIT_BAD_INPUT, console, error_console

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def benchmarks() -> dict[str, str]:
    """Each benchmark (a module of ``bench/`` that runs as a script) and the first line of
    its docstring; empty without the source tree."""
    found = {}
    for path in sorted(BENCH_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        runs = any(
            isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body
        )
        if runs:
            found[path.stem] = (ast.get_docstring(tree) or "").split("\n\n")[0].replace("\n", " ")
    return found


def bench_command(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Argument(help="A benchmark; none lists them.")] = None,
) -> None:
    """List the benchmarks, or run one with the options after its name (`tagplan bench
    NAME -- --help` shows them); each writes its section of BENCHMARKS.md."""
    found = benchmarks()
    if not found:
        error_console.print(
            "[bold red]error:[/] no benchmarks here: they ship with the source tree "
            f"(bench/ beside tagplan/), not with the package ({BENCH_DIR} is missing)",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    if name is None:
        table = Table(title="benchmarks (tagplan bench NAME [OPTIONS])")
        table.add_column("name")
        table.add_column("what it measures")
        for bench, summary in found.items():
            table.add_row(bench, summary)
        console.print(table)
        return
    if name not in found:
        error_console.print(
            f"[bold red]error:[/] no benchmark {name!r}; known: {', '.join(found)}",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(EXIT_BAD_INPUT)
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", *ctx.args], cwd=BENCH_DIR.parent, check=False
    )
    raise typer.Exit(done.returncode)
