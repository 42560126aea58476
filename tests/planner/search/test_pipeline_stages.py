"""Where pipelined strategies cut a model and which GPUs each stage gets: the forward pass
goes stage by stage, cuts follow the shares they are given and the fewest crossing bytes
near them, stages take whole machines, and every candidate compiles and simulates."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.compile.pipeline import forward_ops, micro_batched_ops, phase_barriers
from tagplan.planner.compile.placement import place
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.errors import InvalidInput
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.search.baselines import BASELINES
from tagplan.planner.search.grouping import atoms_of, cluster_mean_op_time_s
from tagplan.planner.search.pipeline_stages import pipeline_baseline, stage_units
from tagplan.planner.search.stage_cuts import op_stages
from tagplan.planner.strategy import Schedule, resolve
from tagplan.planner.topology import Cluster, load_cluster
from tests.planner.compile.test_graphdef import committed, two_by_two
from tests.planner.layouts import layout_strategies
from tests.planner.zoo_graphs import zoo_ir


def _machines(count: int, gpus: int = 2) -> Cluster:
    machine = {"gpus": {"type": "T4", "count": gpus}, "intra_bandwidth_gbps": 100}
    return load_cluster(
        {
            "machines": [{"name": f"m{i}", **machine} for i in range(count)],
            "network": {"bandwidth_gbps": 10},
        }
    )


def _forward_edges_go_stage_by_stage(ir: GraphIR, op_stage: np.ndarray) -> bool:
    forward = forward_ops(ir)
    reader = np.repeat(np.arange(ir.num_ops), np.diff(ir.op_input_ptr))
    producer = ir.tensor_producer[ir.op_input_tensor]
    data = ir.tensor_batch_axis[ir.op_input_tensor] >= 0
    both = forward[reader] & forward[producer] & data
    return bool((op_stage[producer[both]] <= op_stage[reader[both]]).all())


@pytest.mark.parametrize("model", ["mlp", "small_cnn", "tiny_lstm", "vgg19", "transformer"])
def test_cuts_keep_the_forward_pass_in_stage_order_and_colocated_ops_together(model) -> None:
    ir = zoo_ir(model)
    op_time_s = np.ones(ir.num_ops)
    for shares in (np.ones(2), np.array([3.0, 1.0, 1.0]), np.ones(4)):
        for slack in (0.0, 0.3):
            op_stage = op_stages(ir, op_time_s, shares, slack=slack)
            assert set(op_stage.tolist()) <= set(range(len(shares)))
            assert _forward_edges_go_stage_by_stage(ir, op_stage)
            atoms = atoms_of(ir)
            for atom in np.unique(atoms):
                assert len(set(op_stage[atoms == atom].tolist())) == 1


def test_balanced_cuts_give_each_stage_its_share_of_the_forward_compute() -> None:
    ir = zoo_ir("vgg19")
    cluster = _machines(2)
    op_time_s = cluster_mean_op_time_s(ir, cluster, OpCostModel(ir, cluster))
    cut = micro_batched_like(ir)
    for shares in (np.ones(2), np.array([3.0, 1.0])):
        op_stage = op_stages(ir, op_time_s, shares)
        per_stage = np.bincount(op_stage[cut], weights=op_time_s[cut], minlength=2)
        largest_op = op_time_s[cut].max()
        expected = shares / shares.sum() * per_stage.sum()
        assert np.abs(per_stage - expected).max() <= largest_op


def micro_batched_like(ir: GraphIR) -> np.ndarray:
    """The ops a pipeline runs per micro-batch in the forward pass, as the cut sees them."""
    cluster = _machines(1)
    strategy = pipeline_baseline(ir, cluster, OpCostModel(ir, cluster))
    resolved = resolve(strategy, ir, cluster)
    return micro_batched_ops(resolved, place(ir, resolved)) & forward_ops(ir)


def test_a_cut_with_slack_moves_to_fewer_crossing_bytes() -> None:
    """VGG19's compute is in its convolutions, whose activations are large: balanced, the
    cut between two stages falls inside them; with slack it moves to where less crosses."""
    ir = zoo_ir("vgg19")
    cluster = _machines(2)
    op_time_s = cluster_mean_op_time_s(ir, cluster, OpCostModel(ir, cluster))

    def crossing(op_stage: np.ndarray) -> float:
        reader = np.repeat(np.arange(ir.num_ops), np.diff(ir.op_input_ptr))
        producer = ir.tensor_producer[ir.op_input_tensor]
        forward = forward_ops(ir)
        cross = forward[reader] & (op_stage[producer] < op_stage[reader])
        tensors = np.unique(
            ir.op_input_tensor[cross & (ir.tensor_batch_axis[ir.op_input_tensor] >= 0)]
        )
        return float(ir.tensor_bytes[tensors].sum())

    balanced = op_stages(ir, op_time_s, np.ones(2))
    moved = op_stages(ir, op_time_s, np.ones(2), slack=0.3)
    assert crossing(moved) < crossing(balanced)


def test_stages_take_machines_then_device_groups_then_gpus() -> None:
    assert [u.tolist() for u in stage_units(_machines(3))] == [[0, 1], [2, 3], [4, 5]]
    slots = [{"index": i, "type": "V100-16GB" if i < 2 else "T4"} for i in range(4)]
    one_machine = load_cluster(
        {"machines": [{"name": "m", "gpus": slots, "intra_bandwidth_gbps": 100}]}
    )
    assert len(stage_units(one_machine)) == one_machine.num_groups == 2
    assert [u.tolist() for u in stage_units(_machines(1, gpus=3))] == [[0], [1], [2]]


def test_the_pipeline_baseline_is_one_stage_per_machine_with_4p_micro_batches() -> None:
    _, ir = committed("mlp")
    cluster = two_by_two()
    strategy = BASELINES["pipeline"](ir, cluster, OpCostModel(ir, cluster))
    assert strategy.pipeline is not None
    assert strategy.pipeline.schedule == Schedule.ONE_F_ONE_B
    assert len(strategy.pipeline.stages) == 2
    assert strategy.pipeline.micro_batches == 8  # 4 x 2 stages, batch 32 over 2 GPUs each
    resolved = resolve(strategy, ir, cluster)
    assert sorted(resolved.group_stage.tolist()) == [0, 1]


def test_every_candidate_compiles_and_simulates_and_single_units_get_none() -> None:
    ir = zoo_ir("small_cnn")
    cluster = _machines(4)
    evaluator = Evaluator(ir, cluster)
    candidates = layout_strategies(ir, cluster, evaluator.costs)
    assert {len(c.pipeline.stages) for c in candidates} == {2, 4}
    for strategy in candidates:
        assert evaluator.evaluate(strategy).step_time_s > 0
    single = _machines(1, gpus=1)
    assert layout_strategies(ir, single, OpCostModel(ir, single)) == []


def test_a_cut_that_parts_a_batch_norm_from_its_gradient_is_refused() -> None:
    """A batch norm's gradient reads the statistics its forward op saved per replica;
    placing it with the earliest batch data it reads (a convolution's input, a stage
    earlier at the cut) would make it read their average over every micro-batch."""
    ir = zoo_ir("inception_v3")
    cluster = _machines(2)
    candidates = layout_strategies(ir, cluster, OpCostModel(ir, cluster))
    by_layer = [c for c in candidates if "-early" not in c.name]
    early = [c for c in candidates if "-early" in c.name]
    assert by_layer and early
    for strategy in by_layer:
        resolved = resolve(strategy, ir, cluster)
        assert phase_barriers(ir, resolved, place(ir, resolved))
    resolved = resolve(early[0], ir, cluster)
    with pytest.raises(InvalidInput, match="reads the per-replica statistics or shape of"):
        phase_barriers(ir, resolved, place(ir, resolved))


@pytest.mark.tf
def test_a_weight_two_stages_read_is_mirrored_on_both_and_the_step_verifies(tmp_path) -> None:
    """A kernel read by the first layer and the last (a tied weight) across two stages:
    it becomes a group of its own outside the stages, mirrored on both stages' GPUs, so
    no step sends the weight; TensorFlow runs the pipelined step as the original."""
    import tensorflow as tf

    from tagplan.planner.graph.analyzer import analyze
    from tagplan.planner.graph.protos import GraphDef
    from tagplan.planner.verify.check import verify
    from tagplan.planner.zoo.models.common import Forward, build_tf1, mean_xent, placeholder
    from tagplan.planner.zoo.models.layers import variable

    width, batch = 16, 8

    def forward() -> Forward:
        features = placeholder("features", tf.float32, [batch, width])
        labels = placeholder("labels", tf.int32, [batch])
        init = tf.compat.v1.glorot_uniform_initializer()
        tied = variable("tied", [width, width], init)
        x = tf.nn.relu(tf.matmul(features, tied))
        for layer in range(3):
            x = tf.nn.relu(tf.matmul(x, variable(f"middle_{layer}", [width, width], init)))
        logits = tf.matmul(x, tied)
        return Forward(
            [features, labels], mean_xent(logits, labels), value_ranges={"labels": width}
        )

    built = build_tf1(forward)
    path = tmp_path / "tied.pb"
    path.write_bytes(built.graph_def.SerializeToString())
    graph_def = GraphDef.FromString(path.read_bytes())
    ir = analyze(graph_def, batch_inputs=["features", "labels"], loss=built.loss_node)
    cluster = _machines(2)
    strategy = next(iter(layout_strategies(ir, cluster, OpCostModel(ir, cluster))))
    stages = {g for stage in strategy.pipeline.stages for g in stage}
    outside = [g for g in range(len(strategy.groups)) if g not in stages]
    assert len(stages) == 2 and len(outside) == 1
    apart = strategy.groups[outside[0]]
    assert "tied" in apart.ops and apart.decision.device_groups == [0, 1]
    evaluation = Evaluator(ir, cluster).evaluate(strategy)
    placement = evaluation.compiled.placement
    apply = int(ir.parameters.apply_op[ir.parameters.names.index("tied")])
    assert len(set(placement.devices(apply).tolist())) == 4  # a mirror on every GPU
    names = evaluation.compiled.task_graph.task_names
    sent = {n.split(" ")[1].split(":")[0] for n in names if n.startswith("send ")}
    assert not sent & set(apart.ops)  # the weight and its reads never travel
    report = verify(str(path), cluster, strategy.to_json())
    assert report.passed, report.summary()
