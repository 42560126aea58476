"""Graph simplification (TAG §4.1.1): drop dangling ops, ``Identity`` and ``NoOp``.

Dangling ops are those no training step needs: the ancestors (over data and control
edges) of the step's sinks are kept, where a sink is a node nothing consumes that depends
on the batch (the train op, the loss). Initializers, savers and summaries go. When the
loss is known, the step is what TensorFlow runs to fetch the loss and the train op: the
loss, every stateful op (a TF2 function runs them all) and every sink run for its effect
(the train op), with their ancestors. A value nobody reads (the gradient of a constant,
``x + 1.0`` differentiated for both inputs, when nothing waits for it) is pruned, as
TensorFlow prunes it. An
``Identity`` is bypassed (its readers read its input) and a ``NoOp`` is bypassed for
control edges (its successors wait on its predecessors), so ordering survives. Every
dropped name is recorded with the reason and, for identities, the node it folds into, so
the compiler can map back to the original graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tagplan.planner.graph.parsed import ParsedGraph

__all__ = ["Simplified", "simplify"]

_BYPASSED = frozenset({"Identity", "Snapshot"})


@dataclass(eq=False)
class Simplified:
    """Which nodes survive, their rewired edges, and where dropped names went."""

    kept: np.ndarray  # node indices of the parsed graph, topological order
    data_inputs: dict[int, list[tuple[int, int]]]  # rewired, parsed-graph indices
    control_inputs: dict[int, list[int]]
    aliases: dict[str, int]  # dropped identity name -> parsed index of the node it folds into
    dropped: dict[str, list[str]]  # reason -> names
    forward: dict[int, tuple[int, int]]  # bypassed identity -> the tensor it passes on

    def resolve(self, graph: ParsedGraph, name: str) -> int | None:
        """Parsed-graph index of the kept node that ``name`` is or folds into."""
        node = graph.index.get(name)
        if node is None:
            return None
        return self.aliases.get(name, node)

    def resolve_tensor(self, node: int, slot: int) -> tuple[int, int]:
        """The kept tensor that output ``slot`` of ``node`` is after bypassing identities."""
        return self.forward.get(node, (node, slot)) if slot == 0 else (node, slot)


def _keep_mask(
    graph: ParsedGraph, batch_inputs: list[int], loss: int | None, stateful: list[bool]
) -> np.ndarray:
    num = graph.num_nodes
    depends = np.zeros(num, dtype=bool)
    depends[batch_inputs] = True
    has_successor = np.zeros(num, dtype=bool)
    for node in graph.topo_order.tolist():
        preds = [p for p, _ in graph.data_inputs[node]] + graph.control_inputs[node]
        if preds:
            has_successor[preds] = True
            if not depends[node]:
                depends[node] = bool(depends[preds].any())
    keep = depends & ~has_successor
    if loss is not None:  # what runs: the loss, every stateful op, ops run for an effect
        sinks = keep
        effect = np.array([not dtypes for dtypes in graph.output_dtypes], dtype=bool)
        keep = depends & ((sinks & effect) | np.asarray(stateful, dtype=bool))
        keep[loss] = True
        # A value sink of the step goes, but not what it waits on: a TF2 function returns
        # its outputs after its updates (automatic control dependencies), among them ones
        # that read no batch, such as an optimizer's step counter.
        for sink in np.flatnonzero(sinks & ~keep).tolist():
            keep[graph.control_inputs[sink]] = True
    for node in graph.topo_order[::-1].tolist():
        if keep[node]:
            for producer, _ in graph.data_inputs[node]:
                keep[producer] = True
            for producer in graph.control_inputs[node]:
                keep[producer] = True
    return keep


def simplify(
    graph: ParsedGraph,
    *,
    batch_inputs: list[int],
    protected: set[int],
    loss: int | None = None,
    stateful: list[bool] | None = None,
) -> Simplified:
    """Drop dangling ops and bypass ``Identity``/``NoOp`` (except ``protected`` nodes).
    ``loss`` and ``stateful`` (per node) let value sinks other than the loss go."""
    keep = _keep_mask(graph, batch_inputs, loss, stateful or [True] * graph.num_nodes)
    dropped: dict[str, list[str]] = {"dangling": [], "identity": [], "noop": []}
    data_inputs: dict[int, list[tuple[int, int]]] = {}
    control_inputs: dict[int, list[int]] = {}
    # For each bypassed node, what a reader of its output 0 reads instead, and which
    # control predecessors it inherits.
    forward: dict[int, tuple[int, int]] = {}
    inherited: dict[int, list[int]] = {}
    aliases: dict[str, int] = {}
    kept: list[int] = []
    for node in graph.topo_order.tolist():
        if not keep[node]:
            dropped["dangling"].append(graph.names[node])
            continue
        data = [forward.get(p, (p, s)) if s == 0 else (p, s) for p, s in graph.data_inputs[node]]
        control: list[int] = []
        for producer, _ in graph.data_inputs[node]:
            control.extend(inherited.get(producer, ()))
        for producer in graph.control_inputs[node]:
            control.extend(inherited.get(producer, (producer,)))
        control = list(dict.fromkeys(c for c in control if c not in {p for p, _ in data}))
        op = graph.ops[node]
        bypass_identity = op in _BYPASSED and len(data) == 1 and node not in protected
        if bypass_identity:
            forward[node] = data[0]
            inherited[node] = control
            aliases[graph.names[node]] = data[0][0]
            dropped["identity"].append(graph.names[node])
            continue
        if op == "NoOp" and node not in protected:
            inherited[node] = list(dict.fromkeys(control + [p for p, _ in data]))
            dropped["noop"].append(graph.names[node])
            continue
        data_inputs[node] = data
        control_inputs[node] = control
        kept.append(node)
    return Simplified(
        kept=np.asarray(kept, dtype=np.int32),
        data_inputs=data_inputs,
        control_inputs=control_inputs,
        aliases=aliases,
        dropped=dropped,
        forward=forward,
    )
