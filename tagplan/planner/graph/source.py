"""Where a graph comes from: a file path, or ``zoo:NAME`` for a committed zoo model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tagplan.planner.graph.load import load_graph_def, loads_graph_def

__all__ = ["ZOO_PREFIX", "GraphSource", "load_graph_source"]

ZOO_PREFIX = "zoo:"


@dataclass(frozen=True)
class GraphSource:
    """A parsed graph plus what its origin knows about it (zoo models name their inputs)."""

    label: str
    graph_def: Any
    batch_inputs: list[str] | None = None
    loss: str | None = None


def load_graph_source(spec: str) -> GraphSource:
    """Load ``zoo:NAME`` from the model zoo, anything else as a graph file path."""
    if spec.startswith(ZOO_PREFIX):
        from tagplan.planner.zoo import catalog

        model = catalog.get_model(spec[len(ZOO_PREFIX) :])
        return GraphSource(
            label=spec,
            graph_def=loads_graph_def(catalog.read_graph_bytes(model.name)),
            batch_inputs=[entry["name"] for entry in model.inputs],
            loss=model.loss_node,
        )
    return GraphSource(label=spec, graph_def=load_graph_def(spec))
