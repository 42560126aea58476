"""Compiling by symmetry class gives the per-GPU simulation: the same step, the same peak
memory on every GPU, the same OOM, for every kind of strategy on clusters of several
shapes; classes and the quotient placement by hand."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.compile import task_compiler
from tagplan.planner.compile.placement import place
from tagplan.planner.compile.symmetry import (
    Asymmetric,
    classes_holding_rows_as_whole,
    classes_reading_across_layouts,
    refined_for_reads,
    symmetry_classes,
)
from tagplan.planner.compile.task_compiler import TaskCompiler, _TaskGraphCompilation
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.actions import ActionSpace
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.search.grouping import cluster_mean_op_time_s, group_ops
from tagplan.planner.search.mcts import StrategySearch
from tagplan.planner.search.sfb import apply_sfb
from tagplan.planner.strategy import GroupDecision, OpGroup, Option, Strategy, resolve
from tagplan.planner.topology import load_cluster
from tests.planner.clusters import gpus

MIXED = {  # two GPU types, machines of 4 and 3, one machine with two device groups
    "machines": [
        {"name": "a", "gpus": {"type": "V100-32GB", "count": 4}, "intra_bandwidth_gbps": 300},
        {
            "name": "b",
            "gpus": [{"index": i, "type": "T4" if i < 3 else "P100"} for i in range(5)],
            "intra_bandwidth_gbps": 100,
        },
        {"name": "c", "gpus": {"type": "T4", "count": 3}, "intra_bandwidth_gbps": 50},
    ],
    "network": {"bandwidth_gbps": 10},
}
CLUSTERS = {
    "mixed": lambda: load_cluster(MIXED),
    "scale:32": lambda: load_cluster("scale:32"),
    "random:4": lambda: load_cluster("random:4"),
    "slow 3x4": lambda: gpus("T4", 3, 4, network_gbps=1),
}
BASELINES = ["single", "dp-nccl", "dp-nccl-p", "dp-ps", "horovod", "m-topo"]


def _zoo(model: str):
    source = load_graph_source(f"zoo:{model}")
    return analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)


def _same(evaluator: Evaluator, strategy: Strategy) -> bool:
    """Assert the two compiles agree; return whether the strategy compiled by class."""
    reference = evaluator.evaluate(strategy, by_class=False)
    by_class = evaluator.evaluate(strategy, by_class=True)
    assert reference.compiled.symmetry is None
    assert by_class.step_time_s == pytest.approx(reference.step_time_s, rel=1e-9, abs=1e-15)
    np.testing.assert_array_equal(
        by_class.result.peak_memory_bytes, reference.result.peak_memory_bytes
    )
    assert by_class.result.oom == reference.result.oom
    np.testing.assert_array_equal(by_class.result.overflow_bytes, reference.result.overflow_bytes)
    for name in ("device_busy_s", "group_makespan_s", "group_idle_before_transfer_s"):
        np.testing.assert_allclose(
            getattr(by_class.result, name), getattr(reference.result, name), rtol=1e-9, atol=1e-15
        )
    return by_class.compiled.symmetry is not None


def _strategies(evaluator: Evaluator) -> list[Strategy]:
    """The baselines, every option over spread action sets, random mixes, two with SFB."""
    ir, cluster, costs = evaluator.ir, evaluator.cluster, evaluator.costs
    strategies = [baseline_strategy(name, ir, cluster, costs) for name in BASELINES]
    space = ActionSpace(ir, cluster, costs)
    grouping = group_ops(ir, cluster_mean_op_time_s(ir, cluster, costs), max_groups=6)
    search = StrategySearch(evaluator, grouping, space, reference_step_s=1.0)
    n = grouping.num_groups
    every_option = {a.option: a for a in reversed(space.actions)}  # the first of each
    step = max(1, len(space.actions) // 10)
    for index in sorted(
        {*range(0, len(space.actions), step), *map(space.actions.index, every_option.values())}
    ):
        strategies.append(search.strategy_of((index,) * n))
    rng = np.random.default_rng(5)
    for _ in range(6):
        strategies.append(
            search.strategy_of(tuple(rng.integers(len(space.actions), size=n).tolist()))
        )
    return strategies + [apply_sfb(s, ir, cluster, costs)[0] for s in strategies[1:3]]


@pytest.mark.parametrize("model", ["mlp", "small_cnn"])
@pytest.mark.parametrize("cluster_name", list(CLUSTERS))
def test_every_kind_of_strategy_simulates_alike(
    model: str, cluster_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By class wherever there are classes, however many instances they leave out (the
    planner's share is a choice of cost, not of result)."""
    monkeypatch.setattr(task_compiler, "_CLASSES_WORTH_SHARE", 1.0)
    evaluator = Evaluator(_zoo(model), CLUSTERS[cluster_name]())
    by_class = [_same(evaluator, strategy) for strategy in _strategies(evaluator)]
    # data parallelism over device groups of several GPUs is what classes are for
    assert by_class[BASELINES.index("dp-nccl")] and by_class[BASELINES.index("horovod")]


@pytest.mark.parametrize(
    ("model", "cluster_name"),
    [("small_cnn", "mixed"), ("small_cnn", "random:4"), ("tiny_wide_deep", "mixed")],
)
def test_a_compiler_remembers_nothing_that_changes_a_graph(model: str, cluster_name: str) -> None:
    """What a compiler keeps between compiles (the outputs of ops placed alike, fragments
    and crossings) gives each strategy, by class and per GPU, the task graph a new compiler
    gives it."""
    evaluator = Evaluator(_zoo(model), CLUSTERS[cluster_name]())
    resolved = [
        resolve(strategy, evaluator.ir, evaluator.cluster) for strategy in _strategies(evaluator)
    ]
    for by_class in (True, False):
        for strategy in resolved:
            kept = evaluator.compiler.compile(strategy, by_class=by_class).task_graph
            new = TaskCompiler(evaluator.ir, evaluator.cluster, costs=evaluator.costs)
            fresh = new.compile(strategy, by_class=by_class).task_graph
            for name, value in vars(fresh).items():
                if isinstance(value, np.ndarray):
                    np.testing.assert_array_equal(getattr(kept, name), value, err_msg=name)
            assert kept.task_names == fresh.task_names


def test_resnet_data_parallel_on_64_gpus_alike_with_a_seventh_of_the_tasks() -> None:
    ir = _zoo("resnet101")
    cluster = load_cluster("scale:64")
    evaluator = Evaluator(ir, cluster)
    strategy = baseline_strategy("dp-nccl", ir, cluster, evaluator.costs)
    assert _same(evaluator, strategy)
    per_gpu = evaluator.evaluate(strategy, by_class=False).compiled.task_graph.num_tasks
    by_class = evaluator.evaluate(strategy).compiled.task_graph.num_tasks
    assert by_class * 6 < per_gpu


def test_classes_and_quotient_placement_by_hand() -> None:
    """Data parallelism on two machines of four GPUs, batch 64: GPU 0 also runs the ops
    that need the whole batch, so the classes are {0}, {1, 2, 3}, {4, 5, 6, 7}; a split
    op's quotient instances cover rows [0, 8), [8, 32), [32, 64)."""
    ir = _zoo("mlp")
    cluster = gpus("T4", 2, 4)
    decision = GroupDecision(device_groups=[0, 1], option=Option.REPLICATE_ALLREDUCE)
    resolved = resolve(Strategy(default=decision), ir, cluster)
    placement = place(ir, resolved)
    symmetry = symmetry_classes(placement, cluster)
    assert symmetry is not None
    assert symmetry.representative.tolist() == [0, 1, 1, 1, 4, 4, 4, 4]
    assert symmetry.members[[0, 1, 4]].tolist() == [1, 3, 4]
    assert symmetry.expand((1, 4)) == (1, 2, 3, 4, 5, 6, 7)
    split_op = int(np.flatnonzero(placement.op_mode == 0)[0])
    quotient = symmetry.placement
    rows = [
        (int(quotient.inst_device[i]), int(quotient.inst_lo[i]), int(quotient.inst_hi[i]))
        for i in quotient.instances(split_op)
    ]
    batch = ir.batch_size
    assert rows == [(0, 0, batch // 8), (1, batch // 8, batch // 2), (4, batch // 2, batch)]


@pytest.mark.parametrize(
    ("moved", "stops"),
    [(None, None), ("second machine", "another layout"), ("one GPU", None)],
)
def test_reads_across_layouts_foretells_the_compile_stopping(
    moved: str | None, stops: str | None
) -> None:
    """Data parallelism on two machines of four GPUs, and one layer's matmul ``moved``:
    data-parallel on the second machine alone, so it reads rows of the first layer's
    output that no class holds as they are: the check on the quotient placement says so
    before compiling, and the compile by class, tried anyway, stops there; refined for
    that read, every class is a single GPU, so the strategy compiles per GPU. Or
    model-parallel on one GPU, so the data-parallel op after it reads its rows of a whole
    tensor that only that GPU holds: one split there cuts every member's rows, the
    strategy compiles by class and simulates as it does per GPU."""
    ir = _zoo("mlp")
    cluster = gpus("T4", 2, 4)
    everywhere = GroupDecision(device_groups=[0, 1], option=Option.REPLICATE_ALLREDUCE)
    decision = {
        "second machine": GroupDecision(device_groups=[1], option=Option.REPLICATE_ALLREDUCE),
        "one GPU": GroupDecision(device_groups=[0], option=Option.MODEL_PARALLEL),
    }
    groups = [OpGroup(ops=["dense_1/MatMul"], decision=decision[moved])] if moved else []
    resolved = resolve(Strategy(default=everywhere, groups=groups), ir, cluster)
    symmetry = symmetry_classes(place(ir, resolved), cluster)
    assert symmetry is not None
    compiler = TaskCompiler(ir, cluster, costs=OpCostModel(ir, cluster))
    across = bool(
        classes_reading_across_layouts(symmetry, compiler.slice_producer, compiler.slice_reader)
    )
    assert across == (stops is not None)
    compilation = _TaskGraphCompilation(compiler, resolved, symmetry.placement, symmetry)
    if stops:
        with pytest.raises(Asymmetric, match=stops):
            compilation.compile()
    else:
        assert compilation.compile().symmetry is symmetry
    assert (compiler.compile(resolved, by_class=True).symmetry is None) == across
    assert _same(Evaluator(ir, cluster), Strategy(default=everywhere, groups=groups)) != across


def test_classes_no_read_across_layouts_touches_compile_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Data parallelism on four machines of four GPUs (two rows each), and one layer's
    matmul on the first two machines, weighted 1:3: the first machine's GPUs read the rows
    they hold, the second's read rows of every GPU of machines 2-4. Those three classes
    become single GPUs; the first machine keeps its class of three, and the strategy
    compiled so simulates as it does per GPU. The quotient keeps most instances, which
    the planner compiles per GPU: here it compiles by class whatever share it keeps."""
    ir = _zoo("mlp")
    cluster = gpus("T4", 4, 4)
    everywhere = GroupDecision(device_groups=[0, 1, 2, 3], option=Option.REPLICATE_ALLREDUCE)
    weights = {name: 1.0 if name.startswith("m0/") else 3.0 for name in cluster.device_names[:8]}
    moved = GroupDecision(
        device_groups=[0, 1], option=Option.REPLICATE_ALLREDUCE, batch_weights=weights
    )
    strategy = Strategy(
        default=everywhere, groups=[OpGroup(ops=["dense_1/MatMul"], decision=moved)]
    )
    placement = place(ir, resolve(strategy, ir, cluster))
    symmetry = symmetry_classes(placement, cluster)
    assert symmetry is not None
    assert symmetry.representative.tolist() == [0, 1, 1, 1, 4, 4, 4, 4, 8, 8, 8, 8] + [12] * 4
    evaluator = Evaluator(ir, cluster)
    compiler = evaluator.compiler
    producer, reader, access = compiler.slice_producer, compiler.slice_reader, compiler.batch_access
    assert classes_reading_across_layouts(symmetry, producer, reader) == {4, 8, 12}
    every = placement.num_instances
    refined = refined_for_reads(symmetry, placement, producer, reader, access, most_instances=every)
    assert refined is not None
    assert refined.representative.tolist() == [0, 1, 1, 1, *range(4, 16)]
    kept = refined.placement.num_instances
    assert symmetry.placement.num_instances < kept < every
    assert (
        refined_for_reads(symmetry, placement, producer, reader, access, most_instances=kept - 1)
        is None
    )
    assert evaluator.evaluate(strategy).compiled.symmetry is None
    monkeypatch.setattr(task_compiler, "_CLASSES_WORTH_SHARE", 1.0)
    evaluator = Evaluator(ir, cluster)
    assert _same(evaluator, strategy)
    compiled = evaluator.evaluate(strategy).compiled
    assert compiled.symmetry.representative.tolist() == refined.representative.tolist()


def test_a_placement_without_classes_has_none() -> None:
    ir = _zoo("mlp")
    cluster = gpus("T4", 4, 1)  # one GPU per device group
    resolved = resolve(
        Strategy(default=GroupDecision(device_groups=[0, 1, 2, 3], option=Option.REPLICATE_PS)),
        ir,
        cluster,
    )
    assert symmetry_classes(place(ir, resolved), cluster) is None


def test_resnet_with_one_op_group_off_a_device_group_compiles_by_refined_classes() -> None:
    """ResNet-101 on 64 GPUs (eight device groups), data-parallel over every device group
    but one op group over all but the sixth, as the search's neighbours of data
    parallelism are: that op group's rows cross the others' on most machines, the
    classes those reads touch become single GPUs, the rest still compile once, and the
    step, memory and OOM are the per-GPU simulation's."""
    ir = _zoo("resnet101")
    cluster = load_cluster("scale:64")
    evaluator = Evaluator(ir, cluster)
    space = ActionSpace(ir, cluster, evaluator.costs)
    every = tuple(range(cluster.num_groups))
    action = {a.device_groups: a for a in space.actions if a.option == Option.REPLICATE_ALLREDUCE}
    moved = [op for op in ir.op_names if op.startswith("conv4_block11_")]
    strategy = Strategy(
        default=space.decision(action[every]),
        groups=[OpGroup(ops=moved, decision=space.decision(action[every[:5] + every[6:]]))],
    )
    placement = place(ir, resolve(strategy, ir, cluster))
    symmetry = symmetry_classes(placement, cluster)
    assert symmetry is not None
    compiler = evaluator.compiler
    assert classes_reading_across_layouts(symmetry, compiler.slice_producer, compiler.slice_reader)
    assert _same(evaluator, strategy)
    classes = evaluator.evaluate(strategy).compiled.symmetry
    assert classes.members.max() > 1
    unrefined, refined = (len(np.unique(s.representative)) for s in (symmetry, classes))
    assert unrefined < refined < cluster.num_devices


def _mixed_strategy(evaluator: Evaluator, key: tuple[int, ...]) -> Strategy:
    """The strategy a search over six op groups reaches at ``key``."""
    ir, cluster, costs = evaluator.ir, evaluator.cluster, evaluator.costs
    space = ActionSpace(ir, cluster, costs)
    grouping = group_ops(ir, cluster_mean_op_time_s(ir, cluster, costs), max_groups=6)
    return StrategySearch(evaluator, grouping, space, reference_step_s=1.0).strategy_of(key)


def test_a_class_holding_rows_as_whole_is_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small CNN on three machines of four T4s, its six op groups mixed so that the
    loss's gradient is tiled whole on the third machine's GPUs and read there by rows by
    a layer data-parallel over that machine alone: that class's instance covers the whole
    batch, where per GPU each member cuts its four rows out of its whole copy. The class
    is split (compiled as one, the cuts went missing), the other machines' classes stay,
    and the simulation is the per-GPU one."""
    monkeypatch.setattr(task_compiler, "_CLASSES_WORTH_SHARE", 1.0)
    evaluator = Evaluator(_zoo("small_cnn"), CLUSTERS["slow 3x4"]())
    strategy = _mixed_strategy(evaluator, (22, 19, 23, 1, 13, 0))
    placement = place(evaluator.ir, resolve(strategy, evaluator.ir, evaluator.cluster))
    symmetry = symmetry_classes(placement, evaluator.cluster)
    assert symmetry is not None
    assert classes_holding_rows_as_whole(symmetry, *evaluator.compiler.batch_access)
    assert _same(evaluator, strategy)
    assert evaluator.evaluate(strategy).compiled.symmetry.members.max() > 1


def test_a_class_a_rule_singles_out_is_split_and_compiled_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where a rule singles out a member of a class (a class gathering a split tensor, a
    whole copy fetched from one member), the compile splits that class into single GPUs
    and tries again instead of compiling every GPU: on the strategies of every kind,
    some compile by class after such a refusal, all as they do per GPU."""
    monkeypatch.setattr(task_compiler, "_CLASSES_WORTH_SHARE", 1.0)
    refused: list[tuple[int, ...]] = []
    compile_by_class = _TaskGraphCompilation.compile

    def noting(self: _TaskGraphCompilation):
        try:
            return compile_by_class(self)
        except Asymmetric as refusal:
            refused.append(refusal.devices)
            raise

    monkeypatch.setattr(_TaskGraphCompilation, "compile", noting)
    evaluator = Evaluator(_zoo("small_cnn"), CLUSTERS["slow 3x4"]())
    after_refusal = 0
    for strategy in _strategies(evaluator):
        refused.clear()
        by_class = _same(evaluator, strategy)
        after_refusal += by_class and bool(refused)
    assert after_refusal > 0


@pytest.mark.parametrize(
    ("model", "cluster_name", "key", "classes_left"),
    [
        ("small_cnn", "slow 3x4", (22, 19, 23, 1, 13, 0), True),
        ("small_cnn", "mixed", (21, 50, 19, 48, 26, 17), True),
        ("mlp", "scale:32", (19, 15, 31, 20, 14, 39), True),
        ("mlp", "slow 3x4", (26, 8, 8, 2, 21, 4), False),
        ("small_cnn", "random:4", (18, 14, 47, 52, 4, 3), True),
        ("tiny_wide_deep", "random:4", (41, 2, 48, 43, 10, 36), True),
    ],
)
def test_mixes_that_once_simulated_otherwise_by_class(
    model: str,
    cluster_name: str,
    key: tuple[int, ...],
    classes_left: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mixed strategies of six op groups that compiled by class but simulated otherwise
    than per GPU: a class's piece taken for a whole copy (the members' cuts missing), a
    step 0.8% short (the fourth), a replica's shape fetched from every member of a class
    where per GPU a reader fetches one replica's (16 bytes more on two GPUs), a class's
    piece read as it is by one GPU where per GPU it gathers the members' pieces (the
    concatenation missing). They simulate as per GPU, by the classes the rules leave (the
    fourth: none)."""
    monkeypatch.setattr(task_compiler, "_CLASSES_WORTH_SHARE", 1.0)
    evaluator = Evaluator(_zoo(model), CLUSTERS[cluster_name]())
    assert _same(evaluator, _mixed_strategy(evaluator, key)) == classes_left
