"""Static shapes from TensorFlow's own shape inference, for graphs without ``_output_shapes``.

TensorFlow is imported only here and only when a graph needs it: a graph exported with
``as_graph_def(add_shapes=True)`` (or the JSON form with ``outputs``) never loads it.
"""

from __future__ import annotations

from typing import Any

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.parsed import Shape
from tagplan.planner.tensorflow_import import import_tensorflow

__all__ = ["infer_shapes"]


_NO_TENSORFLOW = (
    "graph lacks static shapes (_output_shapes) and TensorFlow is not installed to infer "
    "them; export with as_graph_def(add_shapes=True) or install tagplan[tf]"
)


def infer_shapes(graph_def: Any, batch_dims: dict[str, int]) -> dict[str, list[Shape]]:
    """Output shapes of every node, with dimension 0 of each ``batch_dims`` input fixed.

    ``graph_def`` is this package's ``GraphDef``; it is handed to TensorFlow as bytes.
    """
    tf = import_tensorflow(_NO_TENSORFLOW)
    tf_graph_def = tf.compat.v1.GraphDef.FromString(graph_def.SerializeToString())
    for node in tf_graph_def.node:
        if node.name in batch_dims and "shape" in node.attr:
            shape = node.attr["shape"].shape
            if not shape.unknown_rank and shape.dim:
                shape.dim[0].size = batch_dims[node.name]
    graph = tf.Graph()
    try:
        with graph.as_default():
            tf.compat.v1.import_graph_def(tf_graph_def, name="")
    except (ValueError, TypeError, tf.errors.OpError) as exc:
        raise InvalidInput(f"TensorFlow cannot infer the graph's shapes: {exc}") from exc
    shapes: dict[str, list[Shape]] = {}
    for operation in graph.get_operations():
        found: list[Shape] = []
        for output in operation.outputs:
            dims = output.shape.as_list() if output.shape.rank is not None else None
            found.append(None if dims is None else tuple(-1 if d is None else d for d in dims))
        shapes[operation.name] = found
    return shapes
