"""``tagplan compile`` and ``tagplan verify``: the distributed GraphDef of a strategy, and
its proof by execution (docs/design.md §5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

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
from tagplan.cli.simulate import load_strategy_argument
from tagplan.planner.compile.graphdef import compile_graphdef
from tagplan.planner.errors import InvalidInput
from tagplan.planner.evaluate import Evaluator, resolve_planned
from tagplan.planner.graph.source import ZOO_PREFIX
from tagplan.planner.topology import load_cluster

DEFAULT_VERIFY_BATCH = 4
"""The small batch a zoo model is rebuilt at to verify."""

ClusterOption = Annotated[str, typer.Option("--cluster", "-c", help="Cluster file or name.")]
StrategyOption = Annotated[
    str, typer.Option("--strategy", "-s", help="A baseline name or a strategy JSON file.")
]


def _captured_names(graph: str) -> dict[str, str]:
    """The variable behind each captured placeholder of a zoo TF2 model (its manifest's
    ``captured_variables``), for the device map; a graph file names none."""
    if not graph.startswith(ZOO_PREFIX):
        return {}
    from tagplan.planner.zoo import catalog

    model = catalog.get_model(graph[len(ZOO_PREFIX) :])
    return {c["placeholder"]: c["variable"] for c in model.captured_variables}


def compile_command(
    graph: GraphArgument,
    cluster: ClusterOption,
    strategy: StrategyOption,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write into.")],
    batch_size: BatchSizeOption = None,
    loss: LossOption = None,
    batch_input: BatchInputOption = None,
) -> None:
    """Write the placed distributed GraphDef (distributed.pb) and its device map."""
    with user_errors():
        source, ir = analyze_source(graph, batch_size, loss=loss, batch_inputs=batch_input)
        evaluator = Evaluator(ir, load_cluster(cluster))
        chosen = load_strategy_argument(strategy, evaluator)
        resolved = resolve_planned(chosen, ir, evaluator.cluster, work=evaluator.costs.work)
        names = _captured_names(graph)
        compiled = compile_graphdef(source.graph_def, ir, evaluator.cluster, resolved, names)
    out.mkdir(parents=True, exist_ok=True)
    (out / "distributed.pb").write_bytes(compiled.graph_def_bytes)
    (out / "device_map.json").write_text(json.dumps(compiled.device_map, indent=2))
    (out / "strategy.json").write_text(chosen.to_json())
    counts = ", ".join(f"{n} {kind}" for kind, n in compiled.auxiliary_counts().items() if n)
    console.print(
        f"{len(compiled.graph_def.node):,} nodes ({counts or 'no auxiliary ops'}) -> "
        f"{out / 'distributed.pb'}, {out / 'device_map.json'}"
    )


def verify_command(
    graph: GraphArgument,
    cluster: ClusterOption,
    strategy: StrategyOption,
    batch_size: Annotated[
        int | None,
        typer.Option(
            "--batch-size",
            "-b",
            min=1,
            help="Small batch to run both graphs at (zoo models; default 4). A graph file "
            "runs at the batch it was built for.",
        ),
    ] = None,
    rtol: Annotated[float, typer.Option(help="Relative tolerance.")] = 1e-4,
    precision: Annotated[
        str, typer.Option(help="float64 (default: rounding-order free) or float32.")
    ] = "float64",
    atol: Annotated[float, typer.Option(help="Absolute tolerance (raise it for float32).")] = 1e-12,
    image_size: Annotated[
        int | None,
        typer.Option(help="Rebuild a zoo image classifier on images this many pixels wide."),
    ] = None,
    max_memory_gib: Annotated[
        float | None,
        typer.Option(help="Refuse a step estimated to need more (default: what is available)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    loss: LossOption = None,
) -> None:
    """Run the original and the compiled graph for one step in TensorFlow on virtual CPU
    devices (one per GPU) and compare the loss and every updated variable."""
    with user_errors():
        from tagplan.planner.verify.check import verify

        zoo = graph.startswith(ZOO_PREFIX)
        batch = (batch_size or DEFAULT_VERIFY_BATCH) if zoo else None
        source, ir = analyze_source(graph, batch, loss=loss)
        if not zoo and batch_size not in (None, ir.graph_batch_size):
            raise InvalidInput(
                f"{source.label} was built for batch {ir.graph_batch_size} and runs at it: its "
                f"batch-dependent constants cannot be rebuilt at {batch_size} (omit --batch-size)"
            )
        evaluator = Evaluator(ir, load_cluster(cluster))
        chosen = load_strategy_argument(strategy, evaluator)
        report = verify(
            graph,
            evaluator.cluster,
            chosen,
            batch_size=ir.batch_size,
            rtol=rtol,
            atol=atol,
            precision=precision,
            image_size=image_size,
            memory_limit_bytes=None if max_memory_gib is None else int(max_memory_gib * (1 << 30)),
            loss=loss,
        )
    if as_json:
        print_json(report.to_dict())
    else:
        console.print(report.summary(), highlight=False, markup=False)
    if not report.passed:
        raise typer.Exit(1)
