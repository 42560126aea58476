"""Pipelined strategies: the schedules' phase orders, GPipe's bubble and 1F1B's bound on
micro-batches in flight, measured on the simulated step of a chain of equal stages, and
the strategies the planner refuses."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from tagplan.planner.compile.pipeline import (
    BACKWARD,
    FORWARD,
    forward_ops,
    micro_batched_ops,
    phase_barriers,
    stage_order,
)
from tagplan.planner.compile.placement import batch_slices, micro_batch_slices, place
from tagplan.planner.errors import InvalidInput
from tagplan.planner.evaluate import Evaluation, Evaluator
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.strategy import (
    GroupDecision,
    OpGroup,
    Option,
    Pipeline,
    Schedule,
    Strategy,
    layer_ops,
    resolve,
)
from tagplan.planner.topology import Cluster, load_cluster
from tests.planner.compile.test_graphdef import committed, two_by_two

AR = Option.REPLICATE_ALLREDUCE
STAGES = 4


@pytest.mark.parametrize("schedule", list(Schedule))
@pytest.mark.parametrize(("stages", "micro_batches"), [(1, 3), (2, 2), (4, 3), (4, 8), (3, 16)])
def test_every_stage_runs_each_phase_once_forward_before_backward(
    schedule, stages, micro_batches
) -> None:
    for stage in range(stages):
        order = stage_order(schedule, stage, stages, micro_batches)
        assert sorted(order) == sorted(
            (kind, j) for kind in (FORWARD, BACKWARD) for j in range(micro_batches)
        )
        forwards = [j for kind, j in order if kind == FORWARD]
        backwards = [j for kind, j in order if kind == BACKWARD]
        assert forwards == backwards == list(range(micro_batches))
        for j in range(micro_batches):
            assert order.index((FORWARD, j)) < order.index((BACKWARD, j))


@pytest.mark.parametrize(("stages", "micro_batches"), [(4, 8), (4, 3), (2, 5), (5, 5)])
def test_1f1b_keeps_at_most_p_minus_s_micro_batches_in_flight(stages, micro_batches) -> None:
    for stage in range(stages):
        in_flight = peak = 0
        for kind, _ in stage_order(Schedule.ONE_F_ONE_B, stage, stages, micro_batches):
            in_flight += 1 if kind == FORWARD else -1
            peak = max(peak, in_flight)
        assert peak == min(stages - stage, micro_batches)
        gpipe = stage_order(Schedule.GPIPE, stage, stages, micro_batches)
        assert gpipe[micro_batches - 1] == (FORWARD, micro_batches - 1)  # all m in flight


def test_micro_batches_cut_the_batch_equally_then_among_replicas() -> None:
    weights = np.tile([3.0, 1.0], 2) / 2  # two GPUs, shares 3:1, two micro-batches
    bounds = micro_batch_slices(weights, 10, 2)
    assert bounds.tolist() == [0, 4, 5, 9, 10]
    assert micro_batch_slices(np.ones(3), 7, 1).tolist() == batch_slices(np.ones(3), 7).tolist()


# a chain of equal stages -------------------------------------------------------------------


def _chain_graph(batch: int, width: int, layers_per_stage: int) -> GraphIR:
    """``STAGES`` name scopes ``stage_<s>`` of equal ReLU dense layers, trained by SGD."""
    import tensorflow as tf

    from tagplan.planner.graph.analyzer import analyze
    from tagplan.planner.graph.protos import GraphDef
    from tagplan.planner.zoo.models.common import Forward, build_tf1, mean_xent, placeholder
    from tagplan.planner.zoo.models.layers import dense

    def forward() -> Forward:
        features = placeholder("features", tf.float32, [batch, width])
        labels = placeholder("labels", tf.int32, [batch])
        init = tf.compat.v1.glorot_uniform_initializer()
        x = features
        for stage in range(STAGES):
            with tf.compat.v1.variable_scope(f"stage_{stage}"):
                for layer in range(layers_per_stage):
                    x = dense(x, width, f"layer_{layer}", initializer=init, activation="relu")
        return Forward([features, labels], mean_xent(x, labels), value_ranges={"labels": width})

    built = build_tf1(forward, optimizer=lambda: tf.compat.v1.train.GradientDescentOptimizer(0.1))
    graph_def = GraphDef.FromString(built.graph_def.SerializeToString())
    return analyze(graph_def, batch_inputs=["features", "labels"], loss=built.loss_node)


@cache
def _chain(batch: int, width: int) -> tuple[GraphIR, Cluster]:
    ir = _chain_graph(batch, width, layers_per_stage=3)
    machine = {"name": "m", "gpus": {"type": "V100-16GB", "count": STAGES}}
    cluster = load_cluster(
        {
            "machines": [{**machine, "intra_bandwidth_gbps": 10_000}],
            "network": {"bandwidth_gbps": 100, "latency_us": 0},
        }
    )
    return ir, cluster


def _one_stage_per_gpu(ir: GraphIR, micro_batches: int, schedule: Schedule) -> Strategy:
    def on_gpu(gpu: int) -> GroupDecision:
        only = {f"m/GPU:{d}": int(d == gpu) for d in range(STAGES)}
        return GroupDecision(device_groups=[0], option=AR, replicas=only)

    groups = [
        OpGroup(ops=[n for n in ir.op_names if f"stage_{s}/" in n], decision=on_gpu(s))
        for s in range(STAGES - 1)
    ]
    return Strategy(
        groups=groups,
        default=on_gpu(STAGES - 1),  # the last stage, the loss and the inputs
        pipeline=Pipeline(
            stages=[[s] for s in range(STAGES)], micro_batches=micro_batches, schedule=schedule
        ),
    )


def _evaluate(
    batch: int, width: int, micro_batches: int, schedule: Schedule
) -> tuple[Evaluation, GraphIR]:
    ir, cluster = _chain(batch, width)
    evaluator = Evaluator(ir, cluster, by_class=False)
    return evaluator.evaluate(_one_stage_per_gpu(ir, micro_batches, schedule)), ir


def _phase_tasks(evaluation: Evaluation, ir: GraphIR) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The compute tasks of micro-batched instances: task, micro-batch, forward or not."""
    placement = evaluation.compiled.placement
    op_of = np.repeat(np.arange(ir.num_ops), np.diff(placement.inst_ptr))
    instances = np.flatnonzero(micro_batched_ops(evaluation.resolved, placement)[op_of])
    micro_batches = evaluation.resolved.pipeline.micro_batches
    outer = batch_slices(np.ones(micro_batches), placement.batch_size)
    micro = np.searchsorted(outer, placement.inst_lo[instances], side="right") - 1
    forward = forward_ops(ir)[op_of[instances]]
    return evaluation.compiled.instance_task[instances], micro, forward


@pytest.mark.tf
@pytest.mark.parametrize("schedule", list(Schedule))
@pytest.mark.parametrize("micro_batches", [4, 8, 16])
def test_the_first_stage_idles_the_gpipe_bubble(schedule, micro_batches) -> None:
    """GPipe §2.3: with ``p`` equal stages the pipeline's span is ``(m + p - 1)`` stage
    times, so a stage idles ``(p - 1) / (m + p - 1)`` of it; 1F1B has the same bubble."""
    evaluation, ir = _evaluate(64, 2048, micro_batches, schedule)
    graph, result = evaluation.compiled.task_graph, evaluation.result
    tasks, _, _ = _phase_tasks(evaluation, ir)
    first_stage = tasks[graph.task_device[tasks] == 0]
    start, end = result.start_s[first_stage].min(), result.finish_s[first_stage].max()
    on_gpu = (graph.task_device == 0) & (result.start_s >= start) & (result.finish_s <= end)
    idle = 1 - graph.task_duration_s[on_gpu].sum() / (end - start)
    bubble = (STAGES - 1) / (micro_batches + STAGES - 1)
    assert idle == pytest.approx(bubble, abs=0.015)


@pytest.mark.tf
@pytest.mark.parametrize("micro_batches", [4, 8])
def test_gpipe_and_1f1b_take_the_same_step_and_1f1b_holds_fewer_micro_batches(
    micro_batches,
) -> None:
    """PipeDream-Flush: 1F1B keeps the bubble and holds at most ``min(p - s, m)``
    micro-batches' activations on stage ``s`` (GPipe all ``m``), so its peak memory is
    never above GPipe's, and below it on the stages holding at most half as many."""
    runs = {s: _evaluate(512, 256, micro_batches, s) for s in Schedule}
    (gpipe, ir), (one_f_one_b, _) = runs[Schedule.GPIPE], runs[Schedule.ONE_F_ONE_B]
    assert one_f_one_b.result.step_time_s == pytest.approx(gpipe.result.step_time_s, rel=0.01)
    for schedule, (evaluation, _) in runs.items():
        graph, result = evaluation.compiled.task_graph, evaluation.result
        tasks, micro, forward = _phase_tasks(evaluation, ir)
        for stage in range(STAGES):
            here = graph.task_device[tasks] == stage
            began = [
                result.start_s[tasks[here & forward & (micro == j)]].min()
                for j in range(micro_batches)
            ]
            ended = [
                result.finish_s[tasks[here & ~forward & (micro == j)]].max()
                for j in range(micro_batches)
            ]
            in_flight = max(
                sum(b <= began[j] < e for b, e in zip(began, ended, strict=True))
                for j in range(micro_batches)
            )
            expected = micro_batches if schedule == Schedule.GPIPE else STAGES - stage
            assert in_flight == min(expected, micro_batches)
    peak_gpipe = gpipe.result.peak_memory_bytes
    peak_1f1b = one_f_one_b.result.peak_memory_bytes
    assert (peak_1f1b <= peak_gpipe).all()
    halved = [s for s in range(STAGES) if 2 * (STAGES - s) <= micro_batches]
    assert halved and (peak_1f1b[halved] < peak_gpipe[halved]).all()


# refused -----------------------------------------------------------------------------------


def _two_stages(ir: GraphIR, **changes) -> Strategy:
    first = GroupDecision(device_groups=[1], option=AR, replicas={"m1/GPU:1": 0})
    pipeline = {"stages": [[0], [1]], "micro_batches": 2, **changes.pop("pipeline", {})}
    return Strategy(
        groups=[OpGroup(ops=layer_ops(ir, "dense_0"), decision=changes.pop("first", first))],
        default=changes.pop("rest", GroupDecision(device_groups=[0], option=AR)),
        pipeline=Pipeline(**pipeline),
    )


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"pipeline": {"stages": [[0], [2]]}}, "names op group 2"),
        ({"pipeline": {"stages": [[0], [0, 1]]}}, "is in stages 0 and 1"),
        ({"pipeline": {"stages": [[0], []]}}, "stage 1 has no op groups"),
        ({"pipeline": {"micro_batches": 33}}, "33 micro-batches exceed the batch of 32"),
        (
            {"first": GroupDecision(device_groups=[1], option=Option.MODEL_PARALLEL)},
            "op group 0 is model-parallel",
        ),
        (
            {"first": GroupDecision(device_groups=[0], option=AR, replicas={"m0/GPU:1": 0})},
            "stages 0 and 1 share m0/GPU:0",
        ),
        ({"pipeline": {"stages": [[1], [0]]}}, "the stages must follow the forward pass"),
    ],
)
def test_a_pipeline_that_cannot_run_is_refused_with_the_reason(changes, message) -> None:
    _, ir = committed("mlp")
    cluster = two_by_two()
    with pytest.raises(InvalidInput, match=message):
        resolved = resolve(_two_stages(ir, **changes), ir, cluster)
        phase_barriers(ir, resolved, place(ir, resolved))


def joined_stages(ir: GraphIR) -> Strategy:
    """Two stages with a model-parallel layer outside them, between them: it would run
    on the whole batch and join every micro-batch."""
    middle = GroupDecision(device_groups=[0], option=Option.MODEL_PARALLEL)
    strategy = _two_stages(ir)
    return strategy.model_copy(
        update={
            "groups": [*strategy.groups, OpGroup(ops=layer_ops(ir, "dense_1"), decision=middle)],
            "pipeline": Pipeline(stages=[[0], [2]], micro_batches=2),
        }
    )


def test_a_whole_batch_op_between_micro_batched_ops_is_refused() -> None:
    _, ir = committed("mlp")
    cluster = two_by_two()
    resolved = resolve(joined_stages(ir), ir, cluster)
    with pytest.raises(InvalidInput, match="runs on the whole batch between micro-batched"):
        phase_barriers(ir, resolved, place(ir, resolved))
