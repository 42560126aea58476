"""The profiler: argument checks, trace parsing, fused-kernel attribution, real runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tagplan.planner.cost.profile import dumps_profile, load_profile
from tagplan.planner.cost.profiler import (
    NodeTime,
    _session_config,
    attribute_to_ops,
    measure_device_peaks,
    node_times_from_step_stats,
    profile_graph,
)
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.analyzer import analyze, graph_fingerprint
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.zoo import read_graph_bytes
from tests.planner.graph import builders as b

# ----------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gpu_type": "", "batch_sizes": [8]}, "gpu_type must be a non-empty name"),
        ({"gpu_type": "CPU", "batch_sizes": []}, "at least one batch size"),
        ({"gpu_type": "CPU", "batch_sizes": [8, 0]}, r"positive integers, got \[0\]"),
        ({"gpu_type": "CPU", "batch_sizes": [8, 8]}, "duplicate batch sizes"),
        ({"gpu_type": "CPU", "batch_sizes": [8], "runs": 0}, "runs must be at least 1"),
        ({"gpu_type": "CPU", "batch_sizes": [8], "warmup": -1}, "warmup must not be negative"),
    ],
)
def test_refuses_bad_options(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        profile_graph("zoo:mlp", **options)


def test_refuses_unknown_zoo_model() -> None:
    with pytest.raises(InvalidInput, match="unknown zoo model 'nope'"):
        profile_graph("zoo:nope", gpu_type="CPU", batch_sizes=[8])


def test_refuses_a_zoo_model_that_cannot_run_alone() -> None:
    with pytest.raises(InvalidInput, match="'mlp_tf2' captures its variables"):
        profile_graph("zoo:mlp_tf2", gpu_type="CPU", batch_sizes=[8])


def _committed_mlp_file(tmp_path: Path) -> Path:
    """The committed MLP as a graph file: its placeholders fix the batch size at 32."""
    path = tmp_path / "mlp.pb"
    path.write_bytes(read_graph_bytes("mlp"))
    return path


def test_fixed_batch_file_refuses_other_batch_sizes(tmp_path: Path) -> None:
    path = _committed_mlp_file(tmp_path)
    with pytest.raises(InvalidInput, match=r"fixed batch size of 32 .* at batch size 16"):
        profile_graph(str(path), gpu_type="CPU", batch_sizes=[32, 16])


def test_file_needs_its_train_node(tmp_path: Path) -> None:
    path = _committed_mlp_file(tmp_path)
    with pytest.raises(InvalidInput, match="train node 'step' is not in graph"):
        profile_graph(str(path), gpu_type="CPU", batch_sizes=[32], train_node="step")


# ------------------------------------------------------------------- fused-kernel attribution


def _conv_graph() -> Any:
    """x -> Pad -> Conv2D (VALID) -> BiasAdd -> Relu -> Identity -> loss = Sum; SGD on bias."""
    conv = {"strides": [1, 1, 1, 1], "padding": "VALID"}
    return b.graph_def(
        b.document(
            [
                b.placeholder("x", [8, 6, 6, 3]),
                b.node("paddings", "Const", outputs=[("int32", [4, 2])], dtype={"type": "int32"}),
                b.op("pad", "Pad", ["x", "paddings"], [8, 8, 8, 3]),
                *b.variable("w", [3, 3, 3, 4]),
                b.op("conv", "Conv2D", ["pad", "w/read"], [8, 6, 6, 4], **conv),
                *b.variable("bias", [4]),
                b.op("biased", "BiasAdd", ["conv", "bias/read"], [8, 6, 6, 4]),
                b.op("relu", "Relu", ["biased"], [8, 6, 6, 4]),
                b.op("relu_id", "Identity", ["relu"], [8, 6, 6, 4]),
                b.const("axes", [0, 1, 2, 3]),
                b.op("loss", "Sum", ["relu_id", "axes"], [], Tidx={"type": "int32"}),
                b.op("dbias", "BiasAddGrad", ["relu"], [4]),
                b.scalar("lr", 0.1),
                b.sgd("update_bias", "bias", "dbias"),
            ]
        )
    )


class TestAttribution:
    def times(self, nodes: dict[str, NodeTime]) -> dict[str, float]:
        ir = analyze(_conv_graph())
        return {ir.op_names[op]: seconds for op, seconds in attribute_to_ops(ir, nodes).items()}

    def test_plain_kernels_keep_their_times(self) -> None:
        times = self.times(
            {
                "pad": NodeTime(1e-4, "Pad"),
                "conv": NodeTime(5e-3, "_MklNativeConv2D"),
                "biased": NodeTime(2e-4, "BiasAdd"),
                "relu": NodeTime(3e-4, "_MklRelu"),
                "relu_id": NodeTime(1.0, "Identity"),  # dropped by the analyzer: skipped
                "_SOURCE": NodeTime(1.0, "NoOp"),  # unknown: skipped
                "_arg_x_0_0": NodeTime(1.0, "_Arg"),
            }
        )
        assert times["pad"] == 1e-4
        assert times["conv"] == 5e-3
        assert times["biased"] == 2e-4
        assert times["relu"] == 3e-4
        assert "relu_id" not in times

    def test_conv_with_bias_goes_to_the_convolution(self) -> None:
        times = self.times(
            {
                "pad": NodeTime(1e-4, "Pad"),
                "biased": NodeTime(6e-3, "_MklNativeConv2DWithBias"),  # conv absorbed
                "relu": NodeTime(3e-4, "Relu"),
            }
        )
        assert times == {"pad": 1e-4, "conv": 6e-3, "biased": 0.0, "relu": 3e-4}

    def test_pad_with_conv_goes_to_the_convolution(self) -> None:
        times = self.times(
            {
                "conv": NodeTime(5e-3, "_MklNativePadWithConv2D"),  # pad absorbed
                "biased": NodeTime(2e-4, "BiasAdd"),
                "relu": NodeTime(3e-4, "Relu"),
            }
        )
        assert times == {"pad": 0.0, "conv": 5e-3, "biased": 2e-4, "relu": 3e-4}

    def test_traced_producers_are_not_absorbed(self) -> None:
        times = self.times(
            {
                "conv": NodeTime(5e-3, "Conv2D"),
                "biased": NodeTime(6e-3, "_MklNativeConv2DWithBias"),
            }
        )
        assert times["conv"] == 5e-3
        assert times["biased"] == 6e-3


# -------------------------------------------------------------------------- trace parsing


@pytest.mark.tf
def test_node_times_from_step_stats() -> None:
    step_stats_pb2 = pytest.importorskip("tensorflow.core.framework.step_stats_pb2")
    stats = step_stats_pb2.StepStats()
    cpu = stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:CPU:0")
    cpu.node_stats.add(
        node_name="a", op_start_rel_nanos=100, op_end_rel_nanos=2100, timeline_label="a = MatMul(x)"
    )
    cpu.node_stats.add(
        node_name="b",
        op_start_rel_micros=1,
        op_end_rel_micros=5,
        timeline_label="[mklcpu 0.1MB 0.1MB] b = _MklNativeConv2DWithBias(x, w, c)",
    )
    cpu.node_stats.add(node_name="c", all_end_rel_micros=7)
    gpu = stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:GPU:0")
    gpu.node_stats.add(
        node_name="g", op_start_rel_nanos=0, op_end_rel_nanos=900, timeline_label="g = Conv2D(a)"
    )
    gpu.node_stats.add(
        node_name="r", op_start_rel_nanos=0, op_end_rel_nanos=400, timeline_label="r = Shape(a)"
    )
    stream = stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:GPU:0/stream:all")
    stream.node_stats.add(node_name="g:Conv2D", all_end_rel_nanos=3000)
    stream.node_stats.add(node_name="g:Conv2D", all_end_rel_nanos=2000)
    single = stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:GPU:0/stream:7")
    single.node_stats.add(node_name="g:Conv2D", all_end_rel_nanos=3000)
    copies = stats.dev_stats.add(device="/job:localhost/replica:0/task:0/device:GPU:0/memcpy")
    copies.node_stats.add(node_name="m", all_end_rel_nanos=8000)

    nodes = node_times_from_step_stats(stats)
    assert nodes == {
        "a": NodeTime(pytest.approx(2e-6), "MatMul"),
        "b": NodeTime(pytest.approx(4e-6), "_MklNativeConv2DWithBias"),
        "c": NodeTime(pytest.approx(7e-6), ""),
        "g": NodeTime(pytest.approx(5e-6), "Conv2D"),  # kernels on stream:all, not the launch
        "r": NodeTime(pytest.approx(4e-7), "Shape"),
    }


# ----------------------------------------------------------------------------- real runs

WORKING_OPS = (
    "MatMul",
    "BiasAdd",
    "Relu",
    "SparseSoftmaxCrossEntropyWithLogits",
    "BiasAddGrad",
    "ReluGrad",
    "ResourceApplyAdam",
    "Mean",
)


@pytest.mark.tf
def test_profile_zoo_mlp() -> None:
    profile = profile_graph("zoo:mlp", gpu_type="CPU", batch_sizes=[16, 8], runs=3)
    assert profile.batch_sizes == [8, 16]
    assert profile.device.gpu_type == "CPU"
    assert profile.source.graph == "zoo:mlp"
    source = load_graph_source("zoo:mlp")
    assert profile.source.fingerprint == graph_fingerprint(source.graph_def)
    assert all(profile.step_time_s[batch] > 0 for batch in (8, 16))

    by_type: dict[str, list[Any]] = {}
    for op in profile.ops:
        by_type.setdefault(op.op_type, []).append(op)
    for op_type in WORKING_OPS:
        assert op_type in by_type, op_type
        for op in by_type[op_type]:
            assert set(op.times_s) == {8, 16}, op.cost_key
            assert all(t > 0 for t in op.times_s.values()), op.cost_key
    assert "Identity" not in by_type and "NoOp" not in by_type

    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    assert {op.cost_key for op in profile.ops} <= set(ir.cost_keys)
    assert len(by_type["MatMul"]) == 9  # three layers: forward, input and weight gradients
    assert sum(op.count for op in by_type["ResourceApplyAdam"]) == 6
    assert "MatMul|float32[B,784];float32[784,256]" in by_type["MatMul"][0].cost_key

    assert load_profile(dumps_profile(profile).encode()) == profile


@pytest.mark.tf
def test_fixed_batch_file_runs_at_its_own_size(tmp_path: Path) -> None:
    path = _committed_mlp_file(tmp_path)
    profile = profile_graph(str(path), gpu_type="CPU", batch_sizes=[32], runs=1, warmup=0)
    assert profile.source.graph == "mlp.pb"
    assert profile.batch_sizes == [32]
    assert any(op.op_type == "ResourceApplyAdam" for op in profile.ops)


def _free_batch_graph(path: Path) -> None:
    """A softmax regression whose placeholders leave the batch dimension free (-1)."""
    tf = pytest.importorskip("tensorflow")
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [None], name="y")
        w = tf.compat.v1.get_variable("w", [4, 3], use_resource=True)
        logits = tf.matmul(x, w)
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        loss = tf.identity(tf.reduce_mean(xent), name="loss")
        tf.compat.v1.train.AdamOptimizer(1e-3).minimize(loss, name="train_op")
        tf.compat.v1.global_variables_initializer()
    path.write_bytes(graph.as_graph_def(add_shapes=True).SerializeToString())


@pytest.mark.tf
def test_graph_file_with_free_batch_dimension(tmp_path: Path) -> None:
    path = tmp_path / "softmax.pb"
    _free_batch_graph(path)
    profile = profile_graph(str(path), gpu_type="cpu", batch_sizes=[2, 4], runs=1, warmup=0)
    matmuls = [op for op in profile.ops if op.op_type == "MatMul"]
    assert matmuls and all(set(op.times_s) == {2, 4} for op in matmuls)
    assert any("float32[B,4];float32[4,3]" in op.cost_key for op in matmuls)
    assert set(profile.step_time_s) == {2, 4}


@pytest.mark.tf
def test_session_runs_one_op_at_a_time_on_its_own_pool() -> None:
    tf = pytest.importorskip("tensorflow")
    config = _session_config(tf)
    assert config.inter_op_parallelism_threads == 1
    assert config.use_per_session_threads
    assert config.graph_options.rewrite_options.disable_meta_optimizer


@pytest.mark.tf
def test_refuses_a_missing_device() -> None:
    with pytest.raises(InvalidInput, match="device '/GPU:7' is not available"):
        profile_graph("zoo:mlp", device="/GPU:7", gpu_type="CPU", batch_sizes=[8])


@pytest.mark.tf
def test_measure_device_peaks() -> None:
    peaks = measure_device_peaks(matmul_sizes=(64, 128), elementwise_bytes=1 << 20, runs=2)
    assert peaks.fp32_flops > 0
    assert peaks.memory_bandwidth_bytes_per_s > 0
    assert peaks.matmul_size in (64, 128)
    with pytest.raises(InvalidInput, match="matmul sizes must be positive"):
        measure_device_peaks(matmul_sizes=(0,))
