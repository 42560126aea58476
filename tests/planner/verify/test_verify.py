"""Compiled graphs run in TensorFlow and compute what the single-device step computes; a
compiled graph with a deliberate mistake does not."""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter

import numpy as np
import pytest

from tagplan.planner.compile.graphdef import compile_graphdef
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.protos import GraphDef
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.strategy import resolve
from tagplan.planner.topology import load_cluster
from tagplan.planner.verify.check import VerifyReport, lower_for_cpu, verify, verify_many
from tests.planner.compile.test_graphdef import (
    LAYERS,
    STRATEGIES,
    committed,
    strategy,
    two_by_two,
)

BATCH = 4


def _batch_four(model: str):
    """The zoo model rebuilt at the verifying batch, as :func:`verify` builds it."""
    from tagplan.planner.graph.analyzer import analyze
    from tagplan.planner.zoo import generate

    built = generate.build(model, batch_size=BATCH)
    graph_def = GraphDef.FromString(built.graph_def.SerializeToString())
    names = [spec["name"] for spec in built.inputs]
    return graph_def, analyze(graph_def, batch_size=BATCH, batch_inputs=names, loss=built.loss_node)


def _dropped_addn_input(graph_def, ir, cluster):
    """DP-PS with one replica's gradient left out of a parameter server's sum."""
    resolved = resolve(strategy("dp-ps", ir, cluster, "dense_2"), ir, cluster)
    compiled = compile_graphdef(graph_def, ir, cluster, resolved)
    broken = GraphDef()
    broken.CopyFrom(compiled.graph_def)
    addn = next(n for n in broken.node if n.op == "AddN")
    del addn.input[0]
    addn.attr["N"].i -= 1
    return dataclasses.replace(compiled, graph_def_bytes=broken.SerializeToString())


def _wrong_rows(graph_def, ir, cluster):
    """DP-NCCL with replica 1 fed the rows of replica 0."""
    resolved = resolve(strategy("dp-nccl", ir, cluster, "dense_2"), ir, cluster)
    compiled = compile_graphdef(graph_def, ir, cluster, resolved)
    device_map = copy.deepcopy(compiled.device_map)
    for pieces in device_map["inputs"].values():
        pieces[1][1:] = pieces[0][1:]
    return dataclasses.replace(compiled, device_map=device_map)


@pytest.fixture(scope="module")
def reports() -> dict[tuple[str, str], VerifyReport]:
    """Every strategy on both models, plus two broken compiles of the MLP, verified with
    one original run per model."""
    cluster = two_by_two()
    found = {}
    for model, layer in LAYERS.items():
        graph_def, ir = _batch_four(model)
        plans: list = [strategy(name, ir, cluster, layer) for name in STRATEGIES]
        names = list(STRATEGIES)
        if model == "mlp":
            plans += [
                _dropped_addn_input(graph_def, ir, cluster),
                _wrong_rows(graph_def, ir, cluster),
            ]
            names += ["dropped-addn-input", "wrong-rows"]
        results = verify_many(f"zoo:{model}", cluster, plans, batch_size=BATCH)
        found.update({(model, name): r for name, r in zip(names, results, strict=True)})
    return found


@pytest.mark.tf
@pytest.mark.parametrize("model", sorted(LAYERS))
@pytest.mark.parametrize("name", STRATEGIES)
def test_every_strategy_computes_the_single_device_step(reports, model, name) -> None:
    report = reports[(model, name)]
    assert report.passed, report.summary()
    assert report.batch_size == BATCH and report.rtol == 1e-4
    assert report.loss_rel_error < 1e-4
    assert len(report.variables) == 20  # 6 parameters, 12 Adam slots, 2 Adam powers
    assert all(v.max_rel_error < 1e-4 and v.replicas >= 1 for v in report.variables)


@pytest.mark.tf
def test_the_strategies_exercise_every_auxiliary_op(reports) -> None:
    total = Counter()
    for (model, _), report in reports.items():
        if model == "small_cnn":
            total.update(report.auxiliary)
    assert all(total[kind] > 0 for kind in ("split", "concat", "addn", "allreduce"))
    mirrored = {v.name: v.replicas for v in reports[("mlp", "dp-nccl")].variables}
    assert mirrored["dense_0/kernel"] == 4
    assert {v.replicas for v in reports[("mlp", "dp-ps")].variables} == {1}


@pytest.mark.tf
def test_a_gradient_left_out_of_a_sum_fails(reports) -> None:
    report = reports[("mlp", "dropped-addn-input")]
    assert not report.passed
    assert report.loss_rel_error < 1e-4  # the forward pass is intact
    assert any(not v.passed for v in report.variables)
    assert "max relative error" in "\n".join(report.problems)


@pytest.mark.tf
def test_a_replica_fed_the_wrong_rows_fails(reports) -> None:
    report = reports[("mlp", "wrong-rows")]
    assert not report.passed
    assert report.loss_rel_error > 1e-4
    assert report.summary().startswith("FAIL zoo:mlp")


@pytest.mark.tf
def test_bad_requests_are_refused() -> None:
    cluster = two_by_two()
    _, ir = committed("mlp")
    dp = strategy("dp-nccl", ir, cluster, "dense_2")
    with pytest.raises(InvalidInput, match="unknown zoo model"):
        verify("zoo:no_such_model", cluster, dp)
    with pytest.raises(InvalidInput, match="precision"):
        verify("zoo:mlp", cluster, dp, precision="float16")


def test_collectives_are_lowered_to_a_sum_and_copies_on_cpu_devices() -> None:
    cluster = two_by_two()
    graph_def, ir = committed("mlp")
    for name, collective in (("partial", "NcclAllReduce"), ("dp-nccl", "CollectiveReduceV2")):
        resolved = resolve(strategy(name, ir, cluster, "dense_2"), ir, cluster)
        compiled = compile_graphdef(graph_def, ir, cluster, resolved)
        lowered = {n.name: n for n in lower_for_cpu(compiled.graph_def, cluster).node}
        assert not any(n.op in ("NcclAllReduce", "CollectiveReduceV2") for n in lowered.values())
        assert {n.device for n in lowered.values()} == {
            f"/job:localhost/replica:0/task:0/device:CPU:{d}" for d in range(4)
        }
        original = {n.name: n for n in compiled.graph_def.node}
        for kind, members in compiled.auxiliary:
            if kind != "allreduce" or original[members[0]].op != collective:
                continue
            first = lowered[members[0]]
            assert first.op == "AddN" and first.attr["N"].i == len(members)
            assert [i for i in first.input if not i.startswith("^")] == [
                original[m].input[0] for m in members
            ]
            for member in members[1:]:
                assert lowered[member].op == "Identity" and lowered[member].input[0] == members[0]


def test_double_precision_widens_types_and_constants() -> None:
    from tagplan.planner.verify.check import to_float64

    graph_def, _ = committed("mlp")
    widened = {n.name: n for n in to_float64(graph_def).node}
    assert widened["dense_0/kernel"].attr["dtype"].type == 2  # DT_DOUBLE
    assert widened["dense_0/MatMul"].attr["T"].type == 2
    assert widened["labels"].attr["dtype"].type == 3  # integers stay
    rate = widened["train_op/learning_rate"].attr["value"].tensor
    assert rate.dtype == 2 and np.frombuffer(rate.tensor_content, np.float64)[0] == np.float32(1e-3)
    assert {n.name for n in graph_def.node} == set(widened)


@pytest.mark.tf
def test_a_graph_file_is_verified_at_its_own_batch(tmp_path) -> None:
    from tagplan.planner.zoo import read_graph_bytes

    path = tmp_path / "mlp.pb"
    path.write_bytes(read_graph_bytes("mlp"))
    cluster = two_by_two()
    _, ir = committed("mlp")
    report = verify(str(path), cluster, strategy("dp-nccl", ir, cluster, "dense_2").to_json())
    assert report.passed, report.summary()
    assert report.batch_size == 32 and report.strategy == "dp-nccl"


@pytest.mark.tf
def test_a_verification_leaves_no_values_on_disk(tmp_path, monkeypatch) -> None:
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cluster = two_by_two()
    _, ir = _batch_four("mlp")
    report = verify("zoo:mlp", cluster, strategy("dp-nccl", ir, cluster, "dense_2"), batch_size=4)
    assert report.passed, report.summary()
    assert list(tmp_path.iterdir()) == []


def test_the_memory_estimate_counts_every_copy_and_every_gradient_instance() -> None:
    """DP-NCCL on 2 x 2 GPUs: four copies of every variable, four instances of every
    gradient (computed, then summed), the largest variable's four copies and its expected
    value read back; float64 doubles them; 1 GiB for the process."""
    from tagplan.planner.verify.memory import GIB, verification_bytes

    cluster = two_by_two()
    graph_def, ir = _batch_four("mlp")
    plan = resolve(strategy("dp-nccl", ir, cluster, "dense_2"), ir, cluster)
    compiled = compile_graphdef(graph_def, ir, cluster, plan)
    variables = int(ir.variable_bytes.sum())
    gradients = int(ir.parameters.gradient_bytes.sum())
    expected = 4 * variables + 2 * 4 * gradients + 5 * int(ir.variable_bytes.max())
    assert verification_bytes(ir, compiled, double=False) == expected + GIB
    assert verification_bytes(ir, compiled, double=True) == 2 * expected + GIB


@pytest.mark.tf
def test_a_pipeline_over_seven_machines_reads_each_replicas_own_shapes() -> None:
    """The pipeline baseline of the small CNN on ``testbed``: seven single-micro-batch
    stages of different widths, where the gradient of the first convolution reads the
    shape of its input's slice; taken in another stage it would be another replica's."""
    cluster = load_cluster("testbed")
    _, ir = _batch_four("small_cnn")
    strategy = baseline_strategy("pipeline", ir, cluster, OpCostModel(ir, cluster))
    assert strategy.pipeline is not None and len(strategy.pipeline.stages) == 7
    (report,) = verify_many("zoo:small_cnn", cluster, [strategy], batch_size=BATCH)
    assert report.passed, report.summary()
