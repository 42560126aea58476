"""The task-graph compiler against hand-counted task graphs and closed-form times."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.compile.task_compiler import TaskCompiler, compile_tasks
from tagplan.planner.cost.comm import CommModel
from tagplan.planner.cost.comm_profile import CommProfile, P2PModels
from tagplan.planner.cost.fit import Segment, SegmentedLinear
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.sim.simulate import simulate
from tagplan.planner.sim.taskgraph import COLLECTIVE, COMPUTE, TRANSFER
from tagplan.planner.strategy import (
    Collective,
    GradientSync,
    GroupDecision,
    Mode,
    OpGroup,
    Option,
    Strategy,
    resolve,
)
from tagplan.planner.topology import load_cluster
from tests.planner.graph.builders import (
    const,
    dense_graph,
    document,
    graph_def,
    op,
    placeholder,
    scalar,
    sgd,
    variable,
)

BATCH, FEATURES, UNITS = 8, 4, 3


@pytest.fixture(scope="module")
def cluster():
    """Two machines with two T4s each: 100 Gbps inside, 10 Gbps between."""
    return load_cluster(
        {
            "machines": [
                {"name": "a", "gpus": {"type": "T4", "count": 2}, "intra_bandwidth_gbps": 100},
                {"name": "b", "gpus": {"type": "T4", "count": 2}, "intra_bandwidth_gbps": 100},
            ],
            "network": {"bandwidth_gbps": 10, "latency_us": 10},
        }
    )


@pytest.fixture(scope="module")
def ir():
    return analyze(graph_def(dense_graph(batch=BATCH, features=FEATURES, units=UNITS)))


def compiled(ir, cluster, decision: GroupDecision):
    resolved = resolve(Strategy(default=decision), ir, cluster)
    costs = OpCostModel(ir, cluster)
    result = compile_tasks(ir, cluster, resolved, costs=costs)
    result.task_graph.validate()
    return result, costs


def test_single_gpu_step_is_the_sum_of_op_times(ir, cluster) -> None:
    decision = GroupDecision(
        device_groups=[0], option=Option.REPLICATE_ALLREDUCE, replicas={"a/GPU:1": 0}
    )
    tasks, costs = compiled(ir, cluster, decision)
    graph = tasks.task_graph
    assert (graph.task_kind == COMPUTE).all() and (graph.task_device == 0).all()
    assert graph.num_tasks == ir.num_ops
    expected = costs.op_times(costs.type_of("T4"), BATCH).total_s
    assert simulate(graph).step_time_s == pytest.approx(expected)


def test_data_parallel_splits_the_batch_and_allreduces_the_gradient(ir, cluster) -> None:
    decision = GroupDecision(device_groups=[0], option=Option.REPLICATE_ALLREDUCE)
    tasks, _ = compiled(ir, cluster, decision)
    graph, placement = tasks.task_graph, tasks.placement
    y = ir.op_names.index("y")
    assert placement.op_mode[y] == Mode.SPLIT
    assert [placement.local_batch(i) for i in placement.instances(y)] == [4, 4]
    collectives = np.flatnonzero(graph.task_kind == COLLECTIVE)
    assert len(collectives) == 1
    gradient_bytes = FEATURES * UNITS * 4
    assert graph.task_bytes[collectives[0]] == gradient_bytes
    # ring AllReduce over 2 GPUs of one machine: 2(k-1)/k * S/B + 2(k-1) * alpha
    bandwidth, latency = 100e9 / 8, cluster.latency_s[0, 1]
    expected = 2 * (1 / 2) * gradient_bytes / bandwidth + 2 * latency
    assert graph.task_duration_s[collectives[0]] == pytest.approx(expected)
    # the parameter is mirrored: its bytes are resident on both GPUs
    assert graph.persistent_bytes[:2].tolist() == [gradient_bytes, gradient_bytes]


def test_parameter_server_pushes_partial_gradients_and_sums_them(ir, cluster) -> None:
    decision = GroupDecision(device_groups=[0, 1], option=Option.REPLICATE_PS, ps_device="b/GPU:0")
    tasks, _ = compiled(ir, cluster, decision)
    graph = tasks.task_graph
    assert not (graph.task_kind == COLLECTIVE).any()
    pushes = [
        i
        for i in np.flatnonzero(graph.task_kind == TRANSFER)
        if graph.task_names[i].startswith("send dw:0")
    ]
    assert len(pushes) == 3  # three workers that are not the server
    assert all(graph.task_bytes[i] == FEATURES * UNITS * 4 for i in pushes)
    apply = tasks.instance_task[tasks.placement.instances(ir.op_names.index("update_w"))]
    assert graph.task_device[apply].tolist() == [2]  # b/GPU:0
    assert graph.persistent_bytes.tolist() == [0, 0, FEATURES * UNITS * 4, 0]


def test_duplicate_runs_everything_everywhere_without_sync(ir, cluster) -> None:
    decision = GroupDecision(device_groups=[0, 1], option=Option.DUPLICATE)
    tasks, _ = compiled(ir, cluster, decision)
    graph = tasks.task_graph
    assert not (graph.task_kind == COLLECTIVE).any()
    assert not (graph.task_kind == TRANSFER).any()
    assert graph.num_tasks == 4 * ir.num_ops


def test_model_parallel_places_each_op_once_and_moves_cut_tensors(ir, cluster) -> None:
    names = list(cluster.device_names)
    placement = {"y": names[3], "dy": names[3], "loss": names[3], "dw": names[0]}
    decision = GroupDecision(
        device_groups=[0, 1], option=Option.MODEL_PARALLEL, placement=placement
    )
    tasks, _ = compiled(ir, cluster, decision)
    graph = tasks.task_graph
    assert all(len(tasks.placement.instances(op)) == 1 for op in range(ir.num_ops))
    transfers = [graph.task_names[i] for i in np.flatnonzero(graph.task_kind == TRANSFER)]
    # x and w's value go to y's GPU on the other machine; dy comes back to dw
    assert any(name.startswith("send x:0") for name in transfers)
    assert any(name.startswith("send dy:0") for name in transfers)
    x_send = next(
        i
        for i in np.flatnonzero(graph.task_kind == TRANSFER)
        if graph.task_names[i].startswith("send x:0")
    )
    expected = CommModel(cluster).p2p_time_s(0, 3, BATCH * FEATURES * 4)
    assert graph.task_duration_s[x_send] == pytest.approx(float(expected))
    assert len(graph.link_index[graph.link_ptr[x_send] : graph.link_ptr[x_send + 1]]) == 4


def test_uneven_replicas_follow_the_batch_weights(ir, cluster) -> None:
    decision = GroupDecision(
        device_groups=[0, 1],
        option=Option.REPLICATE_ALLREDUCE,
        replicas={"a/GPU:0": 2, "b/GPU:1": 0},
        batch_weights={"a/GPU:0": 2.0},
    )
    tasks, _ = compiled(ir, cluster, decision)
    y = ir.op_names.index("y")
    placement = tasks.placement
    assert placement.devices(y).tolist() == [0, 0, 1, 2]
    assert sum(placement.local_batch(i) for i in placement.instances(y)) == BATCH
    assert [placement.local_batch(i) for i in placement.instances(y)] == [2, 2, 2, 2]


def test_pushes_to_a_parameter_server_contend_for_its_network_link(ir) -> None:
    """Three workers on one machine push to a PS on another: the pushes share the
    machine's uplink and the PS machine's downlink, each at a third of it, so together
    they take latency + 3 S / B (the contention term of the PS closed form: the bytes add
    up, one latency is paid as they pipeline)."""
    cluster = load_cluster(
        {
            "machines": [
                {"name": "a", "gpus": {"type": "T4", "count": 3}, "intra_bandwidth_gbps": 100},
                {"name": "b", "gpus": {"type": "T4", "count": 1}, "intra_bandwidth_gbps": 100},
            ],
            "network": {"bandwidth_gbps": 10, "latency_us": 10},
        }
    )
    decision = GroupDecision(device_groups=[0, 1], option=Option.REPLICATE_PS, ps_device="b/GPU:0")
    tasks, _ = compiled(ir, cluster, decision)
    graph = tasks.task_graph
    result = simulate(graph)
    pushes = [
        i
        for i in np.flatnonzero(graph.task_kind == TRANSFER)
        if graph.task_names[i].startswith("send dw:0")
    ]
    assert len(pushes) == 3
    nbytes = FEATURES * UNITS * 4
    latency_s = float(cluster.latency_s[0, 3])
    bytes_s = float(CommModel(cluster).p2p_time_s(0, 3, nbytes)) - latency_s
    starts, finishes = result.start_s[pushes], result.finish_s[pushes]
    np.testing.assert_array_equal(starts, starts[0])  # they start together
    np.testing.assert_allclose(finishes - starts, latency_s + 3 * bytes_s, rtol=1e-9)
    uplink = graph.link_names.index("a/uplink")
    assert result.link_busy_s[uplink] == pytest.approx(3 * bytes_s)


def test_a_compiler_reused_across_strategies_gives_what_a_fresh_one_gives(ir, cluster) -> None:
    """TaskCompiler remembers communication times and op outputs between strategies:
    compiling several in a row must give the graphs each gives on its own."""
    decisions = [
        GroupDecision(device_groups=[0, 1], option=Option.REPLICATE_PS, ps_device="b/GPU:0"),
        GroupDecision(device_groups=[0], option=Option.REPLICATE_ALLREDUCE),
        GroupDecision(device_groups=[0, 1], option=Option.DUPLICATE),
        GroupDecision(device_groups=[0, 1], option=Option.REPLICATE_ALLREDUCE),
    ]
    costs = OpCostModel(ir, cluster)
    reused = TaskCompiler(ir, cluster, costs=costs)
    for decision in decisions:
        resolved = resolve(Strategy(default=decision), ir, cluster)
        mine = reused.compile(resolved).task_graph
        fresh = compile_tasks(ir, cluster, resolved, costs=costs).task_graph
        for name in ("task_kind", "task_duration_s", "succ_ptr", "succ_index", "consumer_task"):
            assert np.array_equal(getattr(mine, name), getattr(fresh, name))
        assert mine.task_names == fresh.task_names


def test_remembered_outputs_follow_the_mode_and_the_class_sizes(ir, cluster) -> None:
    """The outputs an op's placement publishes are remembered by its rows, its mode and
    the class sizes: the same rows split or not, or shared by a class of two, publish
    other copies."""
    compiler = TaskCompiler(ir, cluster, costs=OpCostModel(ir, cluster))
    y, dw = ir.op_names.index("y"), ir.op_names.index("dw")
    rows = ((0, 0, BATCH),)
    alone, per_gpu = [1, 1, 1, 1], None
    pair = [2, 1, 1, 1]
    pair_key = np.array(pair, dtype=np.int32).tobytes()
    # a whole batch on one GPU: a slice of every row is the whole tensor
    assert compiler.outputs(y, rows, True, alone, per_gpu).kinds == ((0,),)
    halves = compiler.outputs(y, ((0, 0, BATCH),), True, pair, pair_key)
    assert halves.kinds == ((1,),)  # each of the pair holds half the rows
    assert halves.nbytes == (BATCH // 2 * UNITS * 4,)
    assert compiler.outputs(y, rows, True, alone, per_gpu).nbytes == (BATCH * UNITS * 4,)
    assert compiler.outputs(dw, rows, True, alone, per_gpu).kinds == ((2,),)  # partial sums
    assert compiler.outputs(dw, rows, False, alone, per_gpu).kinds == ((0,),)  # the gradient


def test_ops_whose_outputs_publish_alike_share_what_is_remembered(ir, cluster) -> None:
    """Remembered by what publishing reads of an op's outputs (kind, bytes, batch): ``dy``
    (OnesLike of ``y``) publishes what ``y`` does at the same rows, and is given it; ``x``
    (a batch of another width) and ``dw`` (partial sums) are not."""
    compiler = TaskCompiler(ir, cluster, costs=OpCostModel(ir, cluster))
    x, y, dy, dw = (ir.op_names.index(name) for name in ("x", "y", "dy", "dw"))
    rows, alone = ((0, 0, BATCH // 2), (2, BATCH // 2, BATCH)), [1, 1, 1, 1]
    published = compiler.outputs(y, rows, True, alone, None)
    assert compiler.outputs(dy, rows, True, alone, None) is published
    for other in (x, dw):
        assert compiler.outputs(other, rows, True, alone, None) != published
    assert compiler.outputs(x, rows, True, alone, None).nbytes == (BATCH // 2 * FEATURES * 4,) * 2


def two_heads_graph() -> dict:
    """loss = sum(x @ w) + sum(x @ v), SGD on both: two gradients, ``dw`` of
    ``FEATURES * UNITS`` floats and ``dv`` of ``FEATURES * 2 * UNITS``."""
    head = {"w": UNITS, "v": 2 * UNITS}
    nodes = [placeholder("x", [BATCH, FEATURES]), const("axes", [0, 1]), scalar("lr", 0.1)]
    for name, units in head.items():
        nodes += [
            *variable(name, [FEATURES, units]),
            op(f"{name}_out", "MatMul", ["x", f"{name}/read"], [BATCH, units]),
            op(f"{name}_sum", "Sum", [f"{name}_out", "axes"], [], Tidx={"type": "int32"}),
            op(f"d{name}_out", "OnesLike", [f"{name}_out"], [BATCH, units]),
            op(f"d{name}", "MatMul", ["x", f"d{name}_out"], [FEATURES, units], transpose_a=True),
            sgd(f"update_{name}", name, f"d{name}"),
        ]
    nodes.append(op("loss", "AddV2", ["w_sum", "v_sum"], []))
    return document(nodes)


class TestBucketsAcrossGroups:
    """Two op groups, one per head, each with bucketed gradient sync."""

    W_BYTES, V_BYTES = FEATURES * UNITS * 4, FEATURES * 2 * UNITS * 4

    @pytest.fixture(scope="class")
    @classmethod
    def ir(cls):
        return analyze(graph_def(two_heads_graph()))

    def compile(self, ir, cluster, *, w_groups=(0,), bucket_bytes=64 * 2**20):
        def bucketed(device_groups) -> GroupDecision:
            return GroupDecision(
                device_groups=list(device_groups),
                option=Option.REPLICATE_ALLREDUCE,
                collective=Collective.RING,
                gradient_sync=GradientSync.BUCKETED,
                bucket_bytes=bucket_bytes,
            )

        w_ops = [n for n in ir.op_names if n.startswith(("w", "dw", "update_w"))]
        strategy = Strategy(
            groups=[OpGroup(ops=w_ops, decision=bucketed(w_groups))], default=bucketed([0])
        )
        resolved = resolve(strategy, ir, cluster)
        assert len(set(resolved.op_group.tolist())) == 2
        costs = OpCostModel(ir, cluster)
        graph = compile_tasks(ir, cluster, resolved, costs=costs).task_graph
        graph.validate()
        # the gradients' AllReduces (the loss halves are summed by AllReduces too)
        collectives = np.array(
            [
                i
                for i in np.flatnonzero(graph.task_kind == COLLECTIVE)
                if graph.task_names[i].startswith(("allreduce dw:", "allreduce dv:"))
            ]
        )
        buckets = [i for i, n in enumerate(graph.task_names) if n.startswith("bucket of")]
        return graph, collectives, buckets

    def test_two_groups_over_the_same_gpus_share_one_fused_allreduce(self, ir, cluster) -> None:
        graph, collectives, buckets = self.compile(ir, cluster)
        assert len(collectives) == 2 and sorted(graph.task_bytes[collectives]) == [
            self.W_BYTES,
            self.V_BYTES,
        ]
        assert [graph.task_names[b] for b in buckets] == ["bucket of 2"]
        # one ring AllReduce of the summed bytes over a's two GPUs, shared by bytes:
        # 2(k-1)/k * S/B + 2(k-1) * alpha with k = 2
        total = self.W_BYTES + self.V_BYTES
        bandwidth, latency = 100e9 / 8, cluster.latency_s[0, 1]
        fused = 2 * (1 / 2) * total / bandwidth + 2 * latency
        assert fused == pytest.approx(float(CommModel(cluster).allreduce_time_s([0, 1], total)))
        durations = graph.task_duration_s[collectives]
        assert durations.sum() == pytest.approx(fused)
        assert durations == pytest.approx(fused * graph.task_bytes[collectives] / total)
        # both wait for the one barrier, which waits for both gradients; on the same links
        # they run back to back: the bucket takes the fused time from its last gradient
        barrier = buckets[0]
        successors = graph.succ_index[graph.succ_ptr[barrier] : graph.succ_ptr[barrier + 1]]
        assert sorted(successors.tolist()) == sorted(collectives.tolist())
        gradients = [
            graph.task_names.index(f"{g}/replica_{k}") for g in ("dw", "dv") for k in (0, 1)
        ]
        result = simulate(graph)
        starts, finishes = result.start_s[collectives], result.finish_s[collectives]
        assert starts.min() == result.finish_s[barrier] == result.finish_s[gradients].max()
        assert finishes.max() - starts.min() == pytest.approx(fused)

    def test_groups_over_different_gpus_do_not_share_a_bucket(self, ir, cluster) -> None:
        graph, collectives, buckets = self.compile(ir, cluster, w_groups=(1,))
        assert [graph.task_names[b] for b in buckets] == ["bucket of 1", "bucket of 1"]
        comm, members = CommModel(cluster), set()
        for task in collectives.tolist():  # each AllReduce takes its own unfused time
            links = graph.link_index[graph.link_ptr[task] : graph.link_ptr[task + 1]]
            gpus = tuple(int(x) for x in links if x < cluster.num_devices)
            alone = comm.allreduce_time_s(gpus, int(graph.task_bytes[task]), algorithm="ring")
            assert graph.task_duration_s[task] == pytest.approx(float(alone))
            members.add(gpus)
        assert members == {(0, 1), (2, 3)}

    def test_the_byte_cap_splits_buckets(self, ir, cluster) -> None:
        graph, collectives, buckets = self.compile(ir, cluster, bucket_bytes=self.W_BYTES)
        assert [graph.task_names[b] for b in buckets] == ["bucket of 1", "bucket of 1"]
        comm = CommModel(cluster)
        for task in collectives.tolist():
            alone = comm.allreduce_time_s([0, 1], int(graph.task_bytes[task]), algorithm="ring")
            assert graph.task_duration_s[task] == pytest.approx(float(alone))


def test_a_control_dependency_between_replicated_ops_waits_on_one_barrier(cluster) -> None:
    """``dv_out`` runs after ``dw`` (a control input): with both on four GPUs, the four
    instances of ``dv_out`` wait for one zero-time barrier that waits for the four of
    ``dw`` (8 edges, not 16), and none starts before the last ``dw`` finishes."""
    document = two_heads_graph()
    for node in document["nodes"]:
        if node["name"] == "dv_out":
            node["inputs"].append("^dw")
    ir = analyze(graph_def(document))
    decision = GroupDecision(device_groups=[0, 1], option=Option.REPLICATE_ALLREDUCE)
    tasks, _ = compiled(ir, cluster, decision)
    graph = tasks.task_graph
    names = list(graph.task_names)
    barrier = names.index("dv_out/control_barrier")
    dw = [i for i, n in enumerate(names) if n.startswith("dw/replica_")]
    dv_out = [i for i, n in enumerate(names) if n.startswith("dv_out/replica_")]
    assert len(dw) == len(dv_out) == 4
    successors = graph.succ_index[graph.succ_ptr[barrier] : graph.succ_ptr[barrier + 1]]
    assert sorted(successors.tolist()) == dv_out
    for task in dw:
        assert barrier in graph.succ_index[graph.succ_ptr[task] : graph.succ_ptr[task + 1]]
        assert not set(dv_out) & set(
            graph.succ_index[graph.succ_ptr[task] : graph.succ_ptr[task + 1]].tolist()
        )
    assert graph.task_duration_s[barrier] == 0.0 and graph.task_device[barrier] == -1
    schedule = simulate(graph)
    assert schedule.start_s[dv_out].min() >= schedule.finish_s[dw].max()


@pytest.mark.parametrize("profiled", [False, True])
def test_transfer_seconds_are_the_comm_models_to_the_last_bit(ir, cluster, profiled) -> None:
    """The compiler prices a transfer on a path of the closed form itself: the same
    seconds as :meth:`CommModel.p2p_time_s`, bit for bit, for every pair and size; a path
    the profile's model prices (inside a machine, here) keeps the profile's seconds."""
    flat = SegmentedLinear(segments=(Segment(intercept_s=0.5, slope_s_per_byte=0.0),))
    profile = CommProfile(device_kind="T4", p2p=P2PModels(intra=flat)) if profiled else None
    comm = CommModel(cluster, profile)
    compiler = TaskCompiler(ir, cluster, costs=OpCostModel(ir, cluster), comm=comm)
    for src in range(cluster.num_devices):
        for dst in range(cluster.num_devices):
            for nbytes in (0, 1, 4097, 3 * 10**6 + 7, 2**40 + 3):
                seconds = compiler.p2p_seconds(src, dst, nbytes)
                assert seconds == comm.p2p_time_s(src, dst, nbytes)
                same_machine = cluster.device_machine[src] == cluster.device_machine[dst]
                if profiled and same_machine and src != dst and nbytes:
                    assert seconds == 0.5
