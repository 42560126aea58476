"""Model zoo: committed single-device training graphs (forward + backward + Adam).

The six benchmark models of TAG Table 3 (VGG19, ResNet101, InceptionV3,
Transformer, BERT-Small, BERT-Large) at the paper's batch sizes, plus tiny
models for tests. Graphs are gzip-compressed binary GraphDefs under
``graphs/``; ``manifest.json`` describes each one. This package reads them
without TensorFlow; ``tagplan.planner.zoo.generate`` (which needs TensorFlow)
rebuilds them.
"""

from tagplan.planner.zoo.catalog import (
    CapturedVariable,
    InputSpec,
    TagReference,
    ZooModel,
    get_model,
    graph_path,
    list_models,
    read_graph_bytes,
)

__all__ = [
    "CapturedVariable",
    "InputSpec",
    "TagReference",
    "ZooModel",
    "get_model",
    "graph_path",
    "list_models",
    "read_graph_bytes",
]
