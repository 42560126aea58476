"""The GraphDef compiler on the zoo's tiny models: names, devices, variables, feeds, and
agreement with the task graph instance for instance and auxiliary op for auxiliary op."""

from __future__ import annotations

import json
from collections import Counter
from functools import cache

import numpy as np
import pytest

from tagplan.planner.compile.graphdef import compile_graphdef, worker_device
from tagplan.planner.compile.task_compiler import compile_tasks
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.constants import tensor_ints
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.search.sfb import solve_sfb
from tagplan.planner.sim.taskgraph import COLLECTIVE
from tagplan.planner.strategy import (
    GradientSync,
    GroupDecision,
    Mode,
    OpGroup,
    Option,
    Pipeline,
    Schedule,
    Strategy,
    layer_ops,
    resolve,
)
from tagplan.planner.topology import Cluster, load_cluster

AR, PS = Option.REPLICATE_ALLREDUCE, Option.REPLICATE_PS
# per model: the prefix of the layer that strategies place apart from the rest
LAYERS = {"mlp": "dense_2", "small_cnn": "logits"}
FIRST_LAYERS = {"dense_2": "dense_0", "logits": "conv_0"}  # a pipeline's first stage
STRATEGIES = (
    "dp-nccl",
    "dp-ps",
    "replicas",
    "weights",
    "partial",
    "partial-ps",
    "model-parallel",
    "duplicate",
    "hub",
    "bucketed",
    "bucketed-apart",
    "pipeline",
    "pipeline-1f1b",
    "pipeline-baseline",
)


def two_by_two() -> Cluster:
    """Two machines with two T4s each: 100 Gbps inside, 10 Gbps between."""
    machine = {"gpus": {"type": "T4", "count": 2}, "intra_bandwidth_gbps": 100}
    return load_cluster(
        {
            "machines": [{"name": "m0", **machine}, {"name": "m1", **machine}],
            "network": {"bandwidth_gbps": 10, "latency_us": 10},
        }
    )


def strategy(name: str, ir: GraphIR, cluster: Cluster, layer: str) -> Strategy:
    """Strategies that exercise every option on a 2 x 2 cluster (device groups 0 and 1)."""
    everywhere = GroupDecision(device_groups=[0, 1], option=AR)
    apart = layer_ops(ir, layer)
    if name in ("dp-nccl", "dp-ps"):
        costs = OpCostModel(ir, cluster)
        return baseline_strategy(name, ir, cluster, costs)
    if name == "replicas":  # two replicas on one GPU, none on another
        return Strategy(
            name=name,
            default=everywhere.model_copy(update={"replicas": {"m0/GPU:0": 2, "m1/GPU:1": 0}}),
        )
    if name == "weights":  # DP-NCCL-P: unequal shares, rows 2, 1, 1, 0
        return Strategy(
            name=name, default=everywhere.model_copy(update={"batch_weights": {"m0/GPU:0": 3.0}})
        )
    if name == "partial":  # a layer replicated on machine 0 only, the rest on all GPUs
        decision = GroupDecision(device_groups=[0], option=AR)
        return Strategy(
            name=name, groups=[OpGroup(ops=apart, decision=decision)], default=everywhere
        )
    if name == "partial-ps":  # a layer on machine 1 with a PS, the rest on machine 0
        decision = GroupDecision(device_groups=[1], option=PS, ps_device="m1/GPU:1")
        return Strategy(
            name=name,
            groups=[OpGroup(ops=apart, decision=decision)],
            default=GroupDecision(device_groups=[0], option=AR),
        )
    if name == "model-parallel":
        return Strategy(
            name=name, default=GroupDecision(device_groups=[0, 1], option=Option.MODEL_PARALLEL)
        )
    if name == "duplicate":  # a layer computed whole on every GPU, the rest data-parallel
        decision = GroupDecision(device_groups=[0, 1], option=Option.DUPLICATE)
        return Strategy(
            name=name, groups=[OpGroup(ops=apart, decision=decision)], default=everywhere
        )
    if name == "hub":  # a layer on one GPU, whose output a hub splits for the replicas after it
        alone = GroupDecision(device_groups=[1], option=AR, replicas={"m1/GPU:0": 0})
        return Strategy(name=name, groups=[OpGroup(ops=apart, decision=alone)], default=everywhere)
    if name == "sfb":  # weight gradients by sufficient-factor broadcast where it pays
        free = np.zeros(ir.num_ops)  # compute is free: only bytes decide (TAG §4.2.3)
        replicas = cluster.num_devices
        decisions = [
            solve_sfb(ir, row, replicas=replicas, op_time_s=free, bandwidth_bytes_per_s=1.25e9)
            for row in range(len(ir.parameters))
        ]
        sfb = {d.parameter: list(d.duplicate_ops) for d in decisions if d.duplicate_ops}
        return Strategy(name=name, default=everywhere, sfb=sfb)
    if name in ("bucketed", "bucketed-apart"):  # two bucketed groups: same GPUs, or not
        fused = everywhere.model_copy(update={"gradient_sync": GradientSync.BUCKETED})
        layer = fused.model_copy(update={"device_groups": [0]}) if name.endswith("apart") else fused
        return Strategy(name=name, groups=[OpGroup(ops=apart, decision=layer)], default=fused)
    if name == "pipeline-baseline":  # a stage per machine, as a user configures one
        return baseline_strategy("pipeline", ir, cluster, OpCostModel(ir, cluster))
    if name.startswith("pipeline"):  # the first layer on one GPU, the rest on machine 0
        first = GroupDecision(device_groups=[1], option=AR, replicas={"m1/GPU:1": 0})
        schedule = Schedule.ONE_F_ONE_B if name.endswith("1f1b") else Schedule.GPIPE
        return Strategy(
            name=name,
            groups=[OpGroup(ops=layer_ops(ir, FIRST_LAYERS[layer]), decision=first)],
            default=GroupDecision(device_groups=[0], option=AR),
            pipeline=Pipeline(stages=[[0], [1]], micro_batches=2, schedule=schedule),
        )
    raise ValueError(name)


@cache
def committed(model: str) -> tuple[object, GraphIR]:
    """A committed zoo graph (at its zoo batch) and its IR."""
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    return source.graph_def, ir


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return two_by_two()


def compiled(model: str, name: str, cluster: Cluster):
    graph_def, ir = committed(model)
    resolved = resolve(strategy(name, ir, cluster, LAYERS[model]), ir, cluster)
    return ir, resolved, compile_graphdef(graph_def, ir, cluster, resolved)


def nodes(distributed) -> dict[str, object]:
    return {n.name: n for n in distributed.graph_def.node}


def bucket_barriers(distributed) -> dict[str, int]:
    """Each bucket barrier, in graph order, and how many AllReduces wait on it."""
    by_name = nodes(distributed)
    released = Counter(
        waits[1:]
        for kind, names in distributed.auxiliary
        if kind == "allreduce"
        for waits in by_name[names[0]].input
        if waits.startswith("^gradient_sync/") and waits.endswith("_bucket")
    )
    barriers = [n.name for n in distributed.graph_def.node if n.name.endswith("_bucket")]
    assert set(barriers) == set(released)
    return {name: released[name] for name in barriers}


def batch_rows(node) -> int:
    return node.attr["_output_shapes"].list.shape[0].dim[0].size


@pytest.mark.parametrize("model", sorted(LAYERS))
@pytest.mark.parametrize("name", STRATEGIES)
def test_instances_and_auxiliary_ops_agree_with_the_task_graph(model, name, cluster) -> None:
    ir, resolved, distributed = compiled(model, name, cluster)
    costs = OpCostModel(ir, cluster)
    tasks = compile_tasks(ir, cluster, resolved, costs=costs)
    graph, placement = tasks.task_graph, distributed.placement
    by_name = nodes(distributed)
    for op in range(ir.num_ops):
        for k, inst in enumerate(placement.instances(op)):
            task = int(tasks.instance_task[inst])
            device = int(placement.inst_device[inst])
            assert graph.task_names[task] == f"{ir.op_names[op]}/replica_{k}"
            assert int(graph.task_device[task]) == device
            assert tasks.placement.inst_lo[inst] == placement.inst_lo[inst]
            assert tasks.placement.inst_hi[inst] == placement.inst_hi[inst]
            node = by_name[distributed.instance_node[inst]]
            assert node.device == worker_device(cluster, device)
            expected = ir.op_names[op] if len(placement.instances(op)) == 1 else None
            assert distributed.instance_node[inst] == (expected or f"{ir.op_names[op]}/replica_{k}")
    kinds = Counter(n.split(" ")[0] for n in graph.task_names)
    expected = {k: kinds[k] for k in ("split", "concat", "addn")}
    expected["allreduce"] = int((graph.task_kind == COLLECTIVE).sum())
    assert distributed.auxiliary_counts() == expected
    # the same gradient buckets, in the same order (one shared rule)
    fused = [int(n.rsplit(" ", 1)[1]) for n in graph.task_names if n.startswith("bucket of ")]
    assert list(bucket_barriers(distributed).values()) == fused
    ops = {"split": {"Slice", "SplitV", "Placeholder"}, "concat": {"ConcatV2"}, "addn": {"AddN"}}
    ops["allreduce"] = {"NcclAllReduce", "CollectiveReduceV2"}
    for kind, names in distributed.auxiliary:
        assert {by_name[n].op for n in names} <= ops[kind]
    # a split instance's outputs carry its rows
    for op in np.flatnonzero(placement.op_mode == Mode.SPLIT).tolist()[:20]:
        tensor = int(ir.outputs(op)[0])
        if ir.tensor_batch_axis[tensor] != 0 or ir.tensor_shapes[tensor][0] != ir.batch_size:
            continue
        for inst in placement.instances(op):
            node = by_name[distributed.instance_node[inst]]
            assert batch_rows(node) == placement.local_batch(inst)


def test_replicas_are_named_placed_and_hold_their_own_variables(cluster) -> None:
    ir, _, distributed = compiled("mlp", "dp-nccl", cluster)
    by_name = nodes(distributed)
    matmuls = [by_name[f"dense_0/MatMul/replica_{k}"] for k in range(4)]
    assert [n.device for n in matmuls] == [worker_device(cluster, d) for d in range(4)]
    assert worker_device(cluster, 2) == "/job:worker/replica:0/task:1/device:GPU:0"
    assert by_name["Mean"].device == worker_device(cluster, 0)  # one instance: original name
    replicas = distributed.device_map["variables"]["dense_0/kernel"]
    assert replicas == [f"dense_0/kernel/replica_{k}" for k in range(4)]
    shared = {by_name[n].attr["shared_name"].s for n in replicas}
    assert len(shared) == 4
    assert set(distributed.device_map["variables"]) == {
        ir.op_names[op] for op in range(ir.num_ops) if ir.op_types[op] == "VarHandleOp"
    }
    assert not any("_class" in n.attr for n in distributed.graph_def.node)


def test_parameter_server_holds_the_only_copy_and_adds_the_pushed_gradients(cluster) -> None:
    ir, resolved, distributed = compiled("mlp", "dp-ps", cluster)
    by_name = nodes(distributed)
    for row, name in enumerate(ir.parameters.names):
        (variable,) = distributed.device_map["variables"][name]
        group = int(resolved.op_group[int(ir.parameters.variable_op[row])])
        ps = worker_device(cluster, int(resolved.group_ps_device[group]))
        assert variable == name and by_name[variable].device == ps
        apply = by_name[ir.op_names[int(ir.parameters.apply_op[row])]]
        gradient = by_name[[i for i in apply.input if not i.startswith("^")][-1]]
        assert gradient.op == "AddN" and gradient.device == ps and len(gradient.input) == 4


def test_allreduce_is_nccl_inside_a_machine_and_a_collective_across(cluster) -> None:
    ir, _, partial = compiled("mlp", "partial", cluster)
    by_name = nodes(partial)
    for kind, names in partial.auxiliary:
        if kind != "allreduce":
            continue
        members = [by_name[n] for n in names]
        machines = {n.device.split("/device")[0] for n in members}
        if len(machines) == 1:
            assert {n.op for n in members} == {"NcclAllReduce"}
            assert len({n.attr["shared_name"].s for n in members}) == 1
            assert {n.attr["num_devices"].i for n in members} == {len(members)}
        else:
            assert {n.op for n in members} == {"CollectiveReduceV2"}
    ops = Counter(n.op for n in partial.graph_def.node)
    assert ops["NcclAllReduce"] == 2 * 2  # the layer's kernel and bias on machine 0's 2 GPUs
    assert ops["CollectiveReduceV2"] == 4 * 4  # the other 4 gradients on all 4 GPUs

    ir, _, dp = compiled("mlp", "dp-nccl", cluster)
    by_name = nodes(dp)
    instance_keys = set()
    collectives = [names for kind, names in dp.auxiliary if kind == "allreduce"]
    for names in collectives:
        keys = [
            [tensor_ints(by_name[i].attr["value"].tensor)[0] for i in by_name[n].input[1:4]]
            for n in names
        ]
        assert all(k == keys[0] for k in keys) and keys[0][:2] == [4, 1]  # size, group key
        instance_keys.add(keys[0][2])
    assert len(instance_keys) == len(collectives) == len(ir.parameters)


def test_after_backward_sync_is_a_barrier_behind_every_gradient(cluster) -> None:
    ir, _, distributed = compiled("mlp", "dp-nccl", cluster)
    by_name = nodes(distributed)
    barriers = [n for n in distributed.graph_def.node if n.name.startswith("gradient_sync/")]
    assert len(barriers) == 1 and barriers[0].op == "NoOp"
    gradients = {ir.op_names[int(ir.tensor_producer[t])] for t in ir.parameters.gradient_tensor}
    waits = {i.lstrip("^").rsplit("/replica_", 1)[0] for i in barriers[0].input}
    assert waits == gradients
    for kind, names in distributed.auxiliary:
        if kind == "allreduce":
            assert all(f"^{barriers[0].name}" in by_name[n].input for n in names)


def gradient_ops(ir: GraphIR) -> set[str]:
    return {ir.op_names[int(ir.tensor_producer[t])] for t in ir.parameters.gradient_tensor}


def test_bucketed_groups_on_the_same_gpus_share_one_barrier(cluster) -> None:
    ir, resolved, distributed = compiled("mlp", "bucketed", cluster)
    assert resolved.num_groups == 2
    by_name = nodes(distributed)
    (barrier,) = bucket_barriers(distributed)
    assert barrier == "gradient_sync/groups_2_bucket"
    waits = {i.lstrip("^").rsplit("/replica_", 1)[0] for i in by_name[barrier].input}
    assert waits == gradient_ops(ir)  # both groups' gradients
    collectives = [names for kind, names in distributed.auxiliary if kind == "allreduce"]
    assert len(collectives) == len(ir.parameters)
    assert all(f"^{barrier}" in by_name[n].input for names in collectives for n in names)


def test_bucketed_groups_on_different_gpus_get_a_bucket_each(cluster) -> None:
    ir, _, distributed = compiled("mlp", "bucketed-apart", cluster)
    by_name = nodes(distributed)
    barriers = bucket_barriers(distributed)
    assert barriers == {"gradient_sync/group_0_bucket": 2, "gradient_sync/group_1_bucket": 4}
    layer = {n for n in gradient_ops(ir) if n.startswith("gradients/dense_2/")}
    for barrier, expected in (("group_0", layer), ("group_1", gradient_ops(ir) - layer)):
        node = by_name[f"gradient_sync/{barrier}_bucket"]
        assert {i.lstrip("^").rsplit("/replica_", 1)[0] for i in node.input} == expected


def test_the_byte_cap_splits_buckets_in_both_back_ends(cluster) -> None:
    """Buckets closed at 100 kB, filled in backward order across the two groups: dense_2's
    gradients (bias, kernel) with dense_1's (bias, then its 128 KiB kernel closes the
    bucket), then dense_0's."""
    graph_def, ir = committed("mlp")
    fused = strategy("bucketed", ir, cluster, LAYERS["mlp"])
    capped = fused.model_copy(
        update={
            "groups": [
                g.model_copy(
                    update={"decision": g.decision.model_copy(update={"bucket_bytes": 10**5})}
                )
                for g in fused.groups
            ],
            "default": fused.default.model_copy(update={"bucket_bytes": 10**5}),
        }
    )
    resolved = resolve(capped, ir, cluster)
    distributed = compile_graphdef(graph_def, ir, cluster, resolved)
    costs = OpCostModel(ir, cluster)
    graph = compile_tasks(ir, cluster, resolved, costs=costs).task_graph
    tasks = [int(n.rsplit(" ", 1)[1]) for n in graph.task_names if n.startswith("bucket of ")]
    barriers = bucket_barriers(distributed)
    assert list(barriers.values()) == tasks == [4, 2]
    by_name = nodes(distributed)
    first = by_name[next(iter(barriers))]
    assert {i.lstrip("^").rsplit("/replica_", 1)[0] for i in first.input} == {
        "gradients/dense_2/MatMul_grad/MatMul_1",
        "gradients/dense_2/BiasAdd_grad/BiasAddGrad",
        "gradients/dense_1/MatMul_grad/MatMul_1",
        "gradients/dense_1/BiasAdd_grad/BiasAddGrad",
    }


def test_each_replica_placeholder_takes_its_own_rows(cluster) -> None:
    _, _, distributed = compiled("mlp", "dp-nccl", cluster)
    by_name = nodes(distributed)
    features = distributed.device_map["inputs"]["features"]
    assert [(lo, hi) for _, lo, hi in features] == [(0, 8), (8, 16), (16, 24), (24, 32)]
    for name, _, _ in features:
        node = by_name[name]
        assert [d.size for d in node.attr["shape"].shape.dim] == [8, 784]
        assert batch_rows(node) == 8
    assert not any(n.op == "Slice" and "features" in n.name for n in by_name.values())

    # two replicas on one GPU (half its share each) read two slices: it is fed the whole batch
    _, _, two = compiled("mlp", "replicas", cluster)
    rows = {name: (lo, hi) for name, lo, hi in two.device_map["inputs"]["features"]}
    assert rows == {
        "features/replica_0": (0, 32),
        "features/replica_1": (10, 21),
        "features/replica_2": (21, 32),
    }
    slices = [
        n for n in two.graph_def.node if n.op == "Slice" and n.input[0] == "features/replica_0"
    ]
    assert len(slices) == 2


def test_split_shape_constants_hold_the_local_shape(cluster) -> None:
    _, _, distributed = compiled("small_cnn", "dp-nccl", cluster)
    by_name = nodes(distributed)
    for k in range(4):
        reshape = by_name[f"gradients/Reshape_grad/Reshape/replica_{k}"]
        shape = by_name[reshape.input[1]]
        assert shape.op == "Const" and shape.device == reshape.device
        assert tensor_ints(shape.attr["value"].tensor) == [4, 8, 8, 32]  # batch 16 over 4


def test_model_parallel_spreads_ops_over_both_machines(cluster) -> None:
    _, _, distributed = compiled("mlp", "model-parallel", cluster)
    devices = set(distributed.placement.inst_device.tolist())
    assert len(devices) >= 3 and set(cluster.device_machine[list(devices)].tolist()) == {0, 1}
    assert distributed.auxiliary == ()
    assert [n.name for n in distributed.graph_def.node if "replica_" in n.name] == []


def test_train_op_waits_for_every_update_and_the_map_is_json(cluster) -> None:
    ir, _, distributed = compiled("mlp", "dp-nccl", cluster)
    by_name = nodes(distributed)
    device_map = json.loads(json.dumps(distributed.device_map))
    train = by_name[device_map["train_op"]]
    assert train.op == "NoOp"
    waits = {i.lstrip("^") for i in train.input}
    updates = [
        o for o in range(ir.num_ops) if ir.op_types[o] in ("ResourceApplyAdam", "AssignVariableOp")
    ]
    placement = distributed.placement
    assert {distributed.instance_node[i] for o in updates for i in placement.instances(o)} <= waits
    assert device_map["loss"] == "Mean"
    assert device_map["tasks"] == {
        "0": {"machine": "m0", "gpus": [0, 1]},
        "1": {"machine": "m1", "gpus": [0, 1]},
    }


def test_the_ir_must_be_at_the_graphs_batch(cluster) -> None:
    graph_def, ir = committed("mlp")
    other = analyze(graph_def, batch_size=8, batch_inputs=["features", "labels"], loss="loss")
    resolved = resolve(strategy("dp-nccl", other, cluster, "dense_2"), other, cluster)
    with pytest.raises(InvalidInput, match="built for batch 32"):
        compile_graphdef(graph_def, other, cluster, resolved)
    assert ir.batch_size == 32


def test_computed_shape_arguments_are_made_local(cluster) -> None:
    """BERT's gather gradients reshape by shapes built from constants, one of them through
    ``GatherV2`` / ``StridedSlice`` / ``Tile``: a constant or a ``SelectV2`` gives the rows."""
    graph_def, ir = committed("bert_small")
    resolved = resolve(strategy("dp-nccl", ir, cluster, ""), ir, cluster)
    by_name = nodes(compile_graphdef(graph_def, ir, cluster, resolved))
    rows = ir.batch_size // 4

    def argument(node: str, position: int):
        return by_name[by_name[node].input[position]]

    folded = argument("gradients/bert/embeddings/Gather_grad/Reshape_1/replica_1", 1)
    assert folded.op == "Const" and tensor_ints(folded.attr["value"].tensor) == [rows * 128]
    sliced = argument("gradients/bert/pooler/strided_slice_grad/StridedSliceGrad/replica_1", 0)
    assert tensor_ints(sliced.attr["value"].tensor) == [rows, 128, 512]
    computed = argument("gradients/cls/predictions/GatherV2_grad/Reshape_1/replica_1", 1)
    assert computed.op == "SelectV2"
    equal, local, original = (by_name[i] for i in computed.input)
    assert equal.op == "Equal" and original.name.endswith("concat_3/replica_1")
    assert tensor_ints(by_name[equal.input[1]].attr["value"].tensor)[0] == ir.batch_size
    assert tensor_ints(local.attr["value"].tensor)[0] == rows
