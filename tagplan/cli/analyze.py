"""``tagplan analyze``: the analyzer's view of a training graph (TAG §4.1.1)."""

from __future__ import annotations

from collections import Counter
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
from tagplan.planner.cost.work import graph_work


def analyze_command(
    graph: GraphArgument,
    batch_size: BatchSizeOption = None,
    loss: LossOption = None,
    batch_input: BatchInputOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Import and analyze a training graph: ops, tensors, parameters, split categories."""
    with user_errors():
        source, ir = analyze_source(graph, batch_size, loss=loss, batch_inputs=batch_input)
    summary = ir.summary()
    summary["source"] = source.label
    formulas = zip(ir.op_types, graph_work(ir).formula, strict=True)
    without = Counter(op_type for op_type, formula in formulas if formula == "fallback")
    summary["no_cost_formula"] = dict(sorted(without.items()))
    if as_json:
        print_json(summary)
        return
    table = Table(title=f"{source.label} at batch size {ir.batch_size}", show_header=False)
    table.add_column(style="bold")
    table.add_column(justify="right")
    table.add_row("ops (after simplification)", f"{ir.num_ops:,}")
    table.add_row("tensors", f"{ir.num_tensors:,}")
    table.add_row("parameters / gradients", f"{len(ir.parameters):,}")
    table.add_row("parameter size", f"{ir.param_bytes / 2**20:,.1f} MiB")
    table.add_row("optimizer slots", f"{summary['optimizer_slot_bytes'] / 2**20:,.1f} MiB")
    if len(ir.sparse_parameters):
        table.add_row(
            "sparse parameters (embedding tables)",
            f"{len(ir.sparse_parameters):,}, {summary['sparse_param_bytes'] / 2**20:,.1f} MiB "
            f"+ slots {summary['sparse_slot_bytes'] / 2**20:,.1f} MiB",
        )
        table.add_row("trainable variables", f"{summary['trainable_variables']:,}")
    table.add_row("batch-carrying tensors", f"{summary['batch_tensor_bytes'] / 2**20:,.1f} MiB")
    for label, count in summary["split_categories"].items():
        table.add_row(f"ops {label}", f"{count:,}")
    dropped = ", ".join(f"{n} {reason}" for reason, n in summary["dropped"].items())
    table.add_row("dropped", dropped)
    table.add_row("loss", str(summary["loss"]))
    table.add_row("batch inputs", ", ".join(summary["batch_inputs"]))
    table.add_row("fingerprint", ir.fingerprint[:16])
    console.print(table)
    top = Counter(ir.op_types).most_common(8)
    console.print("most frequent op types: " + ", ".join(f"{t} {n}" for t, n in top))
    if summary["no_cost_formula"]:
        listed = ", ".join(f"{t} {n}" for t, n in summary["no_cost_formula"].items())
        console.print(
            f"[yellow]op types without a cost formula (estimated from the bytes they move):[/] "
            f"{listed}"
        )
    if summary["unsized_sparse_parameters"]:
        console.print(
            "[yellow]sparse parameters whose size the graph does not give (only gathered and "
            f"scattered, no optimizer slot):[/] {', '.join(summary['unsized_sparse_parameters'])}"
        )
    if ir.unknown_op_types:
        console.print(
            f"[yellow]op types TensorFlow does not know (category none):[/] "
            f"{', '.join(ir.unknown_op_types)}"
        )
