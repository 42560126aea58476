"""The state ops of a compiled graph, run in one process on virtual CPU devices: ``init``
gives every replica the value the original ``init`` gives; a checkpoint of the original
graph restores into every replica and the plan's checkpoint restores into the original
graph with ``tf.compat.v1.train.Saver``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tagplan.planner.compile.state import graph_digest
from tagplan.planner.topology import Cluster
from tagplan.planner.verify.lowering import lower_for_cpu
from tagplan.planner.verify.reference import (
    assigner,
    load_tensorflow,
    open_session,
    reader,
)
from tests.planner.compile.test_graphdef import committed, compiled, two_by_two

pytestmark = pytest.mark.tf

CASES = [("mlp", "weights"), ("small_cnn", "partial-ps"), ("mlp", "model-parallel")]


def _import(tf: Any, graph_def: Any) -> Any:
    with tf.Graph().as_default() as graph:
        tf.compat.v1.import_graph_def(
            tf.compat.v1.GraphDef.FromString(graph_def.SerializeToString()), name=""
        )
    return graph


def _saver(tf: Any, graph: Any, reads: dict[str, Any]) -> Any:
    """A Saver of the original graph's variables by their names, given their reads (what
    the Saver accepts for a resource variable imported from a GraphDef)."""
    with graph.as_default():
        return tf.compat.v1.train.Saver(reads)


def save_original(tf: Any, model: str, values: dict[str, np.ndarray], prefix: Path) -> None:
    """A checkpoint of the original graph of zoo ``model`` holding ``values``, written by
    ``tf.compat.v1.train.Saver``."""
    graph = _import(tf, committed(model)[0])
    reads = {n: reader(tf, graph, n) for n in values}
    assigns = {n: assigner(tf, graph, n) for n in values}
    saver = _saver(tf, graph, reads)
    with open_session(tf, graph, 1) as session:
        session.run(
            [op for _, op in assigns.values()], {assigns[n][0]: v for n, v in values.items()}
        )
        saver.save(session, str(prefix), write_meta_graph=False)


def restore_original(tf: Any, model: str, names: list[str], prefix: Path) -> dict[str, np.ndarray]:
    """The values of variables ``names`` after the original graph of zoo ``model``
    restores checkpoint ``prefix`` with ``tf.compat.v1.train.Saver``."""
    graph = _import(tf, committed(model)[0])
    reads = {n: reader(tf, graph, n) for n in names}
    saver = _saver(tf, graph, reads)
    with open_session(tf, graph, 1) as session:
        saver.restore(session, str(prefix))
        return session.run(reads)


def _original_values(tf: Any, model: str, names: list[str]) -> dict[str, np.ndarray]:
    graph = _import(tf, committed(model)[0])
    reads = {n: reader(tf, graph, n) for n in names}
    with open_session(tf, graph, 1) as session:
        session.run("init")
        return session.run(reads)


def _compiled_session(tf: Any, distributed: Any, cluster: Cluster) -> tuple[Any, Any]:
    graph = _import(tf, lower_for_cpu(distributed.graph_def, cluster))
    return graph, open_session(tf, graph, cluster.num_devices)


def _replica_values(tf: Any, graph: Any, session: Any, variables: dict) -> dict[str, list]:
    reads = {n: [reader(tf, graph, r) for r in replicas] for n, replicas in variables.items()}
    return session.run(reads)


@pytest.mark.parametrize(("model", "strategy"), CASES)
def test_init_gives_every_replica_the_original_initial_value(model: str, strategy: str) -> None:
    tf, cluster = load_tensorflow(), two_by_two()
    _, _, distributed = compiled(model, strategy, cluster)
    device_map = distributed.device_map
    variables = device_map["variables"]
    assert device_map["init"] == "init" and device_map["uninitialized"] == []
    assert device_map["graph_sha256"] == graph_digest(distributed.graph_def)
    expected = _original_values(tf, model, list(variables))
    graph, session = _compiled_session(tf, distributed, cluster)
    with session:
        session.run(device_map["init"])
        found = _replica_values(tf, graph, session, variables)
    for name, replicas in found.items():
        for value in replicas:
            np.testing.assert_array_equal(value, expected[name], err_msg=name)


@pytest.mark.parametrize(("model", "strategy"), CASES)
def test_checkpoints_go_from_the_original_graph_to_the_plan_and_back(
    model: str, strategy: str, tmp_path: Path
) -> None:
    tf, cluster = load_tensorflow(), two_by_two()
    _, _, distributed = compiled(model, strategy, cluster)
    device_map = distributed.device_map
    variables, checkpoint = device_map["variables"], device_map["checkpoint"]
    names = sorted(variables)
    rng = np.random.default_rng(0)
    values = {  # trained-looking values
        n: v + rng.standard_normal(v.shape).astype(v.dtype)
        for n, v in _original_values(tf, model, names).items()
    }
    save_original(tf, model, values, tmp_path / "original")
    graph, session = _compiled_session(tf, distributed, cluster)
    prefix = f"{checkpoint['filename']}:0"
    with session:
        session.run(checkpoint["restore"], {prefix: str(tmp_path / "original")})
        for name, replicas in _replica_values(tf, graph, session, variables).items():
            for value in replicas:
                np.testing.assert_array_equal(value, values[name], err_msg=name)
        written = session.run(f"{checkpoint['save']}:0", {prefix: str(tmp_path / "plan")})
    assert written == str(tmp_path / "plan").encode()
    assert sorted(n for n, _ in tf.train.list_variables(str(tmp_path / "plan"))) == names
    for name, value in restore_original(tf, model, names, tmp_path / "plan").items():
        np.testing.assert_array_equal(value, values[name], err_msg=name)
