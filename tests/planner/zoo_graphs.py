"""Committed zoo graphs, analyzed once per test session."""

from __future__ import annotations

from functools import cache

from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.source import GraphSource, load_graph_source


@cache
def zoo_source(name: str) -> GraphSource:
    return load_graph_source(f"zoo:{name}")


@cache
def zoo_ir(name: str, batch_size: int | None = None) -> GraphIR:
    """``zoo:name`` analyzed at ``batch_size`` (default: the graph's own)."""
    source = zoo_source(name)
    return analyze(
        source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss, batch_size=batch_size
    )
