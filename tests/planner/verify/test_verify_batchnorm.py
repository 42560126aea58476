"""Verification of the zoo models with batch normalization (docs/design.md §5): ResNet-101 and
Inception-v3 on small images under data parallelism (equal and unequal shares), partial
replication and model parallelism over three GPUs on two machines, with per-replica
batch statistics in the reference; and the float64 batch-norm lowering against
TensorFlow's fused kernels."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tagplan.planner.compile.graphdef import compile_graphdef
from tagplan.planner.graph.protos import GraphDef
from tagplan.planner.strategy import GroupDecision, OpGroup, Option, Strategy, resolve
from tagplan.planner.topology import load_cluster
from tagplan.planner.verify.batchnorm import lower_batch_norms
from tagplan.planner.verify.check import VerifyReport, to_float64
from tests.planner.compile.test_graphdef import committed, layer_ops
from tests.planner.verify.own_process import verify_many_apart

pytestmark = pytest.mark.tf

# two GPUs on one machine, one on another: NCCL inside machine a, collectives across
THREE_GPUS = {
    "machines": [
        {"name": "a", "gpus": {"type": "T4", "count": 2}, "intra_bandwidth_gbps": 100},
        {"name": "b", "gpus": {"type": "T4", "count": 1}, "intra_bandwidth_gbps": 100},
    ],
    "network": {"bandwidth_gbps": 10},
}
BATCH = 4
# the smallest images whose last feature maps are 2 x 2: every replica normalizes at
# least four values per channel in every layer
IMAGE_SIZE = {"resnet101": 64, "inception_v3": 107}
AR = Option.REPLICATE_ALLREDUCE
DP_NCCL = Strategy(name="dp-nccl", default=GroupDecision(device_groups=[0, 1], option=AR))
# DP-NCCL-P: machine b's GPU takes half the batch (rows 1, 1, 2 against 2, 1, 1)
DP_NCCL_P = Strategy(
    name="dp-nccl-p",
    default=GroupDecision(device_groups=[0, 1], option=AR, batch_weights={"b/GPU:0": 2.0}),
)
MODEL_PARALLEL = Strategy(
    name="model-parallel",
    default=GroupDecision(device_groups=[0, 1], option=Option.MODEL_PARALLEL),
)


def _partial() -> Strategy:
    """Inception-v3's stem layer (convolution, batch norm, activation, their gradients
    and updates) replicated on machine a only, the rest on all three GPUs."""
    _, ir = committed("inception_v3")
    stem = [n for p in ("conv2d", "batch_normalization", "activation") for n in layer_ops(ir, p)]
    return Strategy(
        name="partial",
        groups=[OpGroup(ops=stem, decision=GroupDecision(device_groups=[0], option=AR))],
        default=GroupDecision(device_groups=[0, 1], option=AR),
    )


def _wrong_statistics(model: str, cluster):
    """DP-NCCL with replica 1 of the last batch norm's gradient reading replica 0's
    statistics."""
    from tagplan.planner.graph.analyzer import analyze
    from tagplan.planner.zoo import generate

    built = generate.build(model, batch_size=BATCH, image_size=IMAGE_SIZE[model])
    graph_def = GraphDef.FromString(built.graph_def.SerializeToString())
    names = [spec["name"] for spec in built.inputs]
    ir = analyze(graph_def, batch_size=BATCH, batch_inputs=names, loss=built.loss_node)
    compiled = compile_graphdef(graph_def, ir, cluster, resolve(DP_NCCL, ir, cluster))
    broken = GraphDef()
    broken.CopyFrom(compiled.graph_def)
    gradient = next(
        n for n in broken.node if n.op == "FusedBatchNormGradV3" and n.name.endswith("/replica_1")
    )
    for i in range(3, 6):
        gradient.input[i] = gradient.input[i].replace("/replica_1:", "/replica_0:")
    return dataclasses.replace(compiled, graph_def_bytes=broken.SerializeToString())


def _verified(model: str, plans: dict) -> dict[str, VerifyReport]:
    cluster = load_cluster(THREE_GPUS)
    reports = verify_many_apart(
        f"zoo:{model}",
        cluster,
        list(plans.values()),
        batch_size=BATCH,
        image_size=IMAGE_SIZE[model],
    )
    return dict(zip(plans, reports, strict=True))


@pytest.fixture(scope="module")
def resnet() -> dict[str, VerifyReport]:
    plans = {"dp-nccl": DP_NCCL, "dp-nccl-p": DP_NCCL_P, "model-parallel": MODEL_PARALLEL}
    return _verified("resnet101", plans)


@pytest.fixture(scope="module")
def inception() -> dict[str, VerifyReport]:
    cluster = load_cluster(THREE_GPUS)
    plans = {
        "dp-nccl": DP_NCCL,
        "partial": _partial(),
        "model-parallel": MODEL_PARALLEL,
        "wrong-statistics": _wrong_statistics("inception_v3", cluster),
    }
    return _verified("inception_v3", plans)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dp-nccl", "dp-nccl-p", "model-parallel"])
def test_resnet101_verifies(resnet, name) -> None:
    report = resnet[name]
    assert report.passed, report.summary()
    assert report.loss_rel_error < 1e-12
    split = name != "model-parallel"  # model parallelism normalizes the whole batch
    assert report.per_replica_batch_norms == (104 if split else 0)
    replicas = {v.name: v.replicas for v in report.variables}
    assert replicas["conv1_bn/moving_mean"] == (3 if split else 1)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dp-nccl", "partial", "model-parallel"])
def test_inception_v3_verifies(inception, name) -> None:
    report = inception[name]
    assert report.passed, report.summary()
    assert report.loss_rel_error < 1e-12
    assert report.per_replica_batch_norms == (0 if name == "model-parallel" else 94)


@pytest.mark.slow
def test_a_batch_norm_gradient_with_another_replicas_statistics_fails(inception) -> None:
    report = inception["wrong-statistics"]
    assert not report.passed
    assert report.loss_rel_error < 1e-12  # the forward pass is intact
    assert report.per_replica_batch_norms == 94
    assert "max relative error" in "\n".join(report.problems)


def _fused_graph(tf, training: bool, factor: float):
    """x -> FusedBatchNormV3 -> FusedBatchNormGradV3 in float32, fed by placeholders.

    In inference mode the gradient reads the population mean and variance, as
    TensorFlow's own gradient of the op does: the forward kernel leaves its reserve
    spaces unwritten there."""
    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [3, 4, 5, 2], name="x")
        dy = tf.compat.v1.placeholder(tf.float32, [3, 4, 5, 2], name="dy")
        stats = [tf.compat.v1.placeholder(tf.float32, [2], name=n) for n in "sorv"]
        out = tf.raw_ops.FusedBatchNormV3(
            x=x,
            scale=stats[0],
            offset=stats[1],
            mean=stats[2],
            variance=stats[3],
            epsilon=1e-3,
            exponential_avg_factor=factor,
            is_training=training,
            name="norm",
        )
        tf.raw_ops.FusedBatchNormGradV3(
            y_backprop=dy,
            x=x,
            scale=stats[0],
            reserve_space_1=out[3] if training else stats[2],
            reserve_space_2=out[4] if training else stats[3],
            reserve_space_3=out[5],
            epsilon=1e-3,
            is_training=training,
            name="norm_grad",
        )
    return GraphDef.FromString(graph.as_graph_def().SerializeToString())


@pytest.mark.parametrize(("training", "factor"), [(True, 1.0), (True, 0.3), (False, 1.0)])
def test_the_float64_lowering_computes_what_the_fused_kernels_compute(training, factor) -> None:
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(0)
    feed = {
        "x": rng.standard_normal((3, 4, 5, 2)) * 2 + 1,
        "dy": rng.standard_normal((3, 4, 5, 2)),
        "s": rng.random(2) + 0.5,
        "o": rng.standard_normal(2),
        "r": rng.standard_normal(2),
        "v": rng.random(2) + 0.5,
    }
    # the reserve spaces (outputs 3 and 4) are defined only in training
    defined = 5 if training else 3
    fetches = [f"norm:{i}" for i in range(defined)] + [f"norm_grad:{i}" for i in range(3)]
    original = _fused_graph(tf, training, factor)
    lowered = to_float64(original)
    assert not any(n.op.startswith("FusedBatchNorm") for n in lowered.node)
    assert lower_batch_norms(original) is original  # float32 kernels exist: kept
    results = []
    for graph_def, dtype in ((original, np.float32), (lowered, np.float64)):
        with tf.Graph().as_default() as graph:
            tf.compat.v1.import_graph_def(
                tf.compat.v1.GraphDef.FromString(graph_def.SerializeToString()), name=""
            )
            with tf.compat.v1.Session(graph=graph) as session:
                fed = {f"{k}:0": v.astype(dtype) for k, v in feed.items()}
                results.append(session.run(fetches, fed))
    for fused, exact in zip(*results, strict=True):
        np.testing.assert_allclose(exact, fused, rtol=2e-5, atol=2e-5)
