"""Small hand-built training graphs in the JSON form, with known answers."""

from __future__ import annotations

from typing import Any

from tagplan.planner.graph.neutral_json import graph_def_from_json

F32 = {"type": "float32"}


def node(
    name: str,
    op: str,
    inputs: list[str] | None = None,
    outputs: list[tuple[str, list[int]]] | None = None,
    **attrs: Any,
) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "op": op, "inputs": inputs or [], "attrs": attrs}
    if outputs is not None:
        entry["outputs"] = [{"dtype": dtype, "shape": shape} for dtype, shape in outputs]
    return entry


def const(name: str, values: list[int] | list[float], dtype: str = "int32") -> dict[str, Any]:
    shape = [len(values)]
    tensor = {"dtype": dtype, "shape": shape, "values": values}
    return node(
        name, "Const", outputs=[(dtype, shape)], dtype={"type": dtype}, value={"tensor": tensor}
    )


def scalar(name: str, value: float) -> dict[str, Any]:
    tensor = {"dtype": "float32", "shape": [], "values": [value]}
    return node(name, "Const", outputs=[("float32", [])], dtype=F32, value={"tensor": tensor})


def placeholder(name: str, shape: list[int], dtype: str = "float32") -> dict[str, Any]:
    return node(
        name, "Placeholder", outputs=[(dtype, shape)], dtype={"type": dtype}, shape={"shape": shape}
    )


def variable(name: str, shape: list[int]) -> list[dict[str, Any]]:
    """A resource variable and its read ``NAME/read``."""
    return [
        node(name, "VarHandleOp", outputs=[("resource", [])], dtype=F32, shape={"shape": shape}),
        node(f"{name}/read", "ReadVariableOp", [name], [("float32", shape)], dtype=F32),
    ]


def op(name: str, op_type: str, inputs: list[str], shape: list[int], **attrs: Any) -> dict:
    """A float32 op with one output."""
    return node(name, op_type, inputs, [("float32", shape)], T=F32, **attrs)


def sgd(name: str, var: str, grad: str) -> dict[str, Any]:
    return node(name, "ResourceApplyGradientDescent", [var, "lr", grad], outputs=[], T=F32)


def document(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {"format": "tagplan.graph", "version": 1, "nodes": nodes}


def dense_graph(batch: int = 8, features: int = 4, units: int = 3) -> dict[str, Any]:
    """loss = sum(x @ w); SGD with dw = x^T @ ones (a MatMul contracting the batch)."""
    return document(
        [
            placeholder("x", [batch, features]),
            *variable("w", [features, units]),
            op("y", "MatMul", ["x", "w/read"], [batch, units]),
            const("axes", [0, 1]),
            op("loss", "Sum", ["y", "axes"], [], Tidx={"type": "int32"}),
            op("dy", "OnesLike", ["y"], [batch, units]),
            op("dw", "MatMul", ["x", "dy"], [features, units], transpose_a=True),
            scalar("lr", 0.1),
            sgd("update_w", "w", "dw"),
        ]
    )


def graph_def(doc: dict[str, Any]) -> Any:
    return graph_def_from_json(doc)
