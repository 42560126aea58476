"""Embedding tables updated sparsely count as parameters: graphs built here with
TensorFlow (TF1 optimizers and Keras 3 optimizers in a TF2 function), each analyzed and
its trainable bytes compared with TensorFlow's own count of its trainable variables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.protos import GraphDef
from tests.planner.graph.test_zoo_analysis import analyzed

pytestmark = pytest.mark.tf

ROWS, WIDTH, CLASSES, BATCH, IDS = 5000, 32, 4, 8, 6
TABLE_BYTES = ROWS * WIDTH * 4
DENSE_BYTES = WIDTH * CLASSES * 4


def _model(tf: Any, table: Any, kernel: Any, ids: Any, labels: Any) -> Any:
    """Mean of the ids' embeddings, a dense layer, softmax cross-entropy."""
    pooled = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1)
    logits = tf.matmul(pooled, kernel)
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_mean(xent)


def tf1_graph(optimizer: str) -> tuple[GraphDef, int]:
    """A TF1 graph (resource variables, ``optimizer.minimize``) and TensorFlow's count of
    its trainable bytes."""
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        ids = v1.placeholder(tf.int32, [BATCH, IDS], name="ids")
        labels = v1.placeholder(tf.int32, [BATCH], name="labels")
        table = v1.get_variable("table", [ROWS, WIDTH], use_resource=True)
        kernel = v1.get_variable("kernel", [WIDTH, CLASSES], use_resource=True)
        loss = tf.identity(_model(tf, table, kernel, ids, labels), name="loss")
        chosen = {
            "adam": v1.train.AdamOptimizer(0.01),
            "adagrad": v1.train.AdagradOptimizer(0.1),
            "sgd": v1.train.GradientDescentOptimizer(0.1),
        }[optimizer]
        chosen.minimize(loss)
        v1.global_variables_initializer()  # "init", which verification runs first
        trainable = sum(v.shape.num_elements() * 4 for v in v1.trainable_variables())
    return GraphDef.FromString(graph.as_graph_def(add_shapes=True).SerializeToString()), trainable


def tf2_graph(optimizer: str) -> tuple[GraphDef, int]:
    """A TF2 concrete function (GradientTape + a Keras 3 optimizer, the table's gradient
    an ``IndexedSlices``) and TensorFlow's count of its trainable bytes."""
    import keras
    import tensorflow as tf

    table = tf.Variable(tf.random.normal([ROWS, WIDTH], seed=1), name="table")
    kernel = tf.Variable(tf.random.normal([WIDTH, CLASSES], seed=2), name="kernel")
    params = [table, kernel]
    chosen = {"adam": keras.optimizers.Adam(0.01), "adagrad": keras.optimizers.Adagrad(0.1)}[
        optimizer
    ]
    chosen.build(params)

    @tf.function
    def step(ids: Any, labels: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = _model(tf, table, kernel, ids, labels)
        chosen.apply_gradients(zip(tape.gradient(loss, params), params, strict=True))
        return tf.identity(loss, name="loss")

    concrete = step.get_concrete_function(
        tf.TensorSpec([BATCH, IDS], tf.int32, name="ids"),
        tf.TensorSpec([BATCH], tf.int32, name="labels"),
    )
    data = concrete.graph.as_graph_def(add_shapes=True).SerializeToString()
    return GraphDef.FromString(data), sum(int(tf.size(p)) * 4 for p in params)


BUILDERS: dict[str, Callable[[str], tuple[GraphDef, int]]] = {"tf1": tf1_graph, "tf2": tf2_graph}


@pytest.mark.parametrize(
    ("style", "optimizer", "sparse"),
    [
        ("tf1", "adam", True),  # scatters into m and v, assigns the whole table
        ("tf1", "adagrad", False),  # one fused ResourceSparseApplyAdagrad: a dense rule
        ("tf1", "sgd", True),  # scatters into the table
        ("tf2", "adam", True),  # densifies the gradient once per slot
        ("tf2", "adagrad", True),  # scatters into table and accumulator
    ],
)
def test_every_trainable_variable_is_counted(style: str, optimizer: str, sparse: bool) -> None:
    graph_def, trainable_bytes = BUILDERS[style](optimizer)
    summary = analyze(graph_def, loss="loss").summary()
    assert trainable_bytes == TABLE_BYTES + DENSE_BYTES
    assert abs(summary["trainable_bytes"] - trainable_bytes) <= 0.01 * trainable_bytes
    assert summary["trainable_variables"] == 2
    assert summary["sparse_parameters"] == int(sparse)
    if sparse:
        assert summary["sparse_param_bytes"] == TABLE_BYTES
        assert summary["param_bytes"] == DENSE_BYTES
        slots = {"adam": 2, "adagrad": 1, "sgd": 0}[optimizer]
        assert summary["sparse_slot_bytes"] == slots * TABLE_BYTES


def test_a_sparse_table_keeps_its_updates_and_slots() -> None:
    graph_def, _ = tf1_graph("adam")
    ir = analyze(graph_def, loss="loss")
    tables = ir.sparse_parameters
    assert tables.names == ("table",)
    slots = {ir.op_names[o] for o in tables.slot_op}
    assert slots == {"table/Adam", "table/Adam_1"}
    updates = [ir.op_types[o] for o in tables.update_op]
    assert updates.count("ResourceScatterAdd") == 2  # into m and into v
    assert "AssignSubVariableOp" in updates  # the table itself
    assert ir.variable_bytes[tables.variable_op[0]] == TABLE_BYTES


def test_batch_norm_statistics_are_not_sparse_parameters() -> None:
    """Running averages are written from the batch but never read by the loss."""
    ir = analyzed("resnet101")
    assert ir.batch_statistics.sum() > 0
    assert len(ir.sparse_parameters) == 0


def test_a_data_parallel_plan_of_a_sparse_table_trains_as_one_gpu(tmp_path: Any) -> None:
    """The table's scatters take every replica's rows: TensorFlow runs the compiled plan
    and the single-device graph to the same values."""
    from tagplan.planner.strategy import GroupDecision, Option, Strategy
    from tagplan.planner.topology import load_cluster
    from tagplan.planner.verify.check import verify

    graph_def, _ = tf1_graph("adam")
    path = tmp_path / "embedding.pb"
    path.write_bytes(graph_def.SerializeToString())
    gpus = {"type": "T4", "count": 1}
    cluster = load_cluster(
        {
            "machines": [
                {"name": n, "gpus": gpus, "intra_bandwidth_gbps": 100} for n in ("a", "b")
            ],
            "network": {"bandwidth_gbps": 10},
        }
    )
    everywhere = GroupDecision(device_groups=[0, 1], option=Option.REPLICATE_ALLREDUCE)
    report = verify(str(path), cluster, Strategy(default=everywhere))
    assert report.passed, report.summary()
