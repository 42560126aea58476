"""Op memory and the single-device peak, against hand-counted schedules."""

from __future__ import annotations

from tagplan.planner.cost.memory import op_memory, single_device_peak_bytes
from tagplan.planner.graph.analyzer import analyze
from tests.planner.graph.builders import (
    const,
    document,
    graph_def,
    op,
    placeholder,
    scalar,
    sgd,
    variable,
)

B = 10  # batch


def chain_graph() -> dict:
    """x[B,4] -> relu -> relu -> sum loss; w[4] scaled into the chain, SGD on w."""
    return document(
        [
            placeholder("x", [B, 4]),
            *variable("w", [4]),
            op("a", "Mul", ["x", "w/read"], [B, 4]),
            op("b", "Relu", ["a"], [B, 4]),
            op("c", "Relu", ["b"], [B, 4]),
            const("axes", [0]),
            op("dw", "Sum", ["c", "axes"], [4], Tidx={"type": "int32"}),
            op("r", "Reshape", ["dw", "shape"], [4], Tshape={"type": "int32"}),
            const("shape", [4]),
            scalar("lr", 0.1),
            sgd("update", "w", "r"),
        ]
    )


def test_outputs_workspace_and_persistent_bytes() -> None:
    ir = analyze(graph_def(chain_graph()))
    memory = op_memory(ir)
    name = ir.op_names.index
    assert memory.output_bytes[name("a")] == B * 4 * 4
    assert memory.output_bytes[name("w/read")] == 0  # a read aliases the variable
    assert memory.output_bytes[name("r")] == 0  # a reshape aliases its input
    assert memory.persistent_bytes[name("w")] == 16
    assert memory.workspace_bytes.sum() == 0


def test_peak_of_a_chain_counts_two_live_activations() -> None:
    """Topological order x, w, ..., a, b, c: when c runs, b is live (c consumes it)
    and x was freed after a; a was freed after b. Peak = x + a while a runs (x's last
    consumer is a) = 2 activations of B*4 floats, plus the 16-byte parameter and the
    three 4-byte constants (axes, shape, lr) produced before it and consumed after."""
    ir = analyze(graph_def(chain_graph()))
    activation = B * 4 * 4
    assert single_device_peak_bytes(ir) == 16 + 2 * activation + 3 * 4
