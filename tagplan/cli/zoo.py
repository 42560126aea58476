"""``tagplan zoo``: the committed model-zoo training graphs."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from tagplan.cli.common import console, print_json, user_errors
from tagplan.planner.zoo import catalog

app = typer.Typer(help="List and regenerate the model-zoo training graphs.", no_args_is_help=True)


@app.command("list")
def list_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """The zoo models with batch size, op count and parameter size (vs TAG Table 3)."""
    models = catalog.list_models()
    if as_json:
        print_json(
            {
                "models": [
                    {
                        "name": m.name,
                        "batch_size": m.batch_size,
                        "style": m.style,
                        "ops": m.op_count,
                        "param_count": m.param_count,
                        "param_bytes": m.param_bytes,
                    }
                    for m in models
                ]
            }
        )
        return
    table = Table(title="model zoo (use as zoo:NAME)")
    for column in ("name", "batch", "style", "ops", "params", "param MiB", "TAG ops", "TAG MiB"):
        table.add_column(column, justify="left" if column in ("name", "style") else "right")
    for m in models:
        tag = m.tag_table3 or {}
        table.add_row(
            m.name,
            str(m.batch_size),
            m.style,
            f"{m.op_count:,}",
            f"{m.param_count / 1e6:,.1f}M",
            f"{m.param_bytes / 2**20:,.0f}",
            f"{tag['ops']:,}" if tag else "",
            f"{tag['param_size_mib']:,}" if tag else "",
        )
    console.print(table)


@app.command("generate")
def generate_command(
    name: Annotated[str, typer.Argument(help="Model name, or 'all'.")],
) -> None:
    """Rebuild a zoo graph with TensorFlow and write it into the package."""
    with user_errors():
        from tagplan.planner.zoo import generate  # imports TensorFlow

        names = list(generate.MODELS) if name == "all" else [name]
        if name != "all":
            generate.model_spec(name)  # a model the generator knows, committed or not yet
        for model_name in names:
            with console.status(f"generating {model_name}"):
                model = generate.generate(model_name)
            console.print(
                f"{model.name}: {model.op_count:,} ops, {model.param_bytes / 2**20:,.1f} MiB "
                f"of parameters -> {catalog.graph_path(model.name)}"
            )
