"""Fidelity: predicted vs published TensorFlow training throughput of four ImageNet CNNs.

Source of every measured figure: the TensorFlow performance guide "Benchmarks"
(the benchmarks page of tensorflow/docs_src/performance, test date May 2017): ``tf_cnn_benchmarks``
training on synthetic ImageNet data, FP32, plain SGD, CUDA 8 / cuDNN 5.1, Winograd
non-fused algorithms enabled (the script's default), cuDNN autotuning on (TensorFlow's
default). Rows:

* single GPU, NVIDIA DGX-1 (Tesla P100 SXM2), batch 64 ("Training synthetic data") and
  batch 32 ("Other results");
* single GPU, Google Compute Engine n1-standard-32-k80x8 (one GK210 of a Tesla K80), at
  the guide's batch sizes (64 for Inception-v3 and ResNet-50, 32 for ResNet-152, VGG16);
* scaling on the DGX-1: images/s on 2, 4 and 8 P100 over images/s on one, batch 64 per
  GPU, predicted with the ``dp-nccl`` baseline (one packed NCCL AllReduce after the
  backward pass).

The guide kept the variables of Inception-v3 and both ResNets on the host CPU
(``variable_update=parameter_server``, ``local_parameter_device=cpu``), also on one GPU.
The single-GPU P100 rows of those models are also predicted in that configuration: the
DGX-1's two host CPUs as one more device (datasheet figures), linked to the GPU by PCIe
3.0 x16, every variable's parameter server on it (its SGD update runs there, the GPU pulls
the parameters and pushes the gradients each step).

The training graphs are built here from ``tf_keras.applications`` (``weights=None``,
nothing downloaded) with the zoo's recipe and SGD, as the guide trained: forward,
backward, one ``ResourceApplyGradientDescent`` per parameter. Predictions use the
analytic cost model (no profile) and the simulator, as ``tagplan simulate`` does.

No constant of the cost model was fitted on these rows: the efficiencies are the
calibration of ``bench/calibrate_cost.py`` (CPU profiles; V100/A100 ResNet-50), the GPU
figures are datasheet peaks, and the convolution-algorithm rule
(``tagplan/planner/cost/conv_algo.py``) has only the tile sizes of cuDNN's algorithms.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bench.report import write_section
from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.load import loads_graph_def
from tagplan.planner.search.baselines import BASELINES, ps_variables
from tagplan.planner.strategy import GroupDecision, OpGroup, Option, Strategy
from tagplan.planner.topology import Cluster, load_cluster

SOURCE = (
    "TensorFlow performance guide, Benchmarks (the benchmarks page of "
    "tensorflow/docs_src/performance, May 2017), tf_cnn_benchmarks, synthetic data"
)
SGD_LEARNING_RATE = 0.1


@dataclass(frozen=True)
class Model:
    """A ``tf_keras.applications`` network and its input size."""

    app: str
    image_size: int


MODELS = {
    "InceptionV3": Model("InceptionV3", 299),
    "ResNet-50": Model("ResNet50", 224),
    "ResNet-152": Model("ResNet152", 224),
    "VGG16": Model("VGG16", 224),
}

# (model, GPU type, batch per GPU, published images/s, where in the source)
SINGLE = [
    ("InceptionV3", "P100-SXM2", 64, 142.0, "DGX-1, batch 64"),
    ("ResNet-50", "P100-SXM2", 64, 219.0, "DGX-1, batch 64"),
    ("ResNet-152", "P100-SXM2", 64, 91.8, "DGX-1, batch 64"),
    ("VGG16", "P100-SXM2", 64, 154.0, "DGX-1, batch 64"),
    ("InceptionV3", "P100-SXM2", 32, 128.0, "DGX-1, other results, batch 32"),
    ("ResNet-50", "P100-SXM2", 32, 195.0, "DGX-1, other results, batch 32"),
    ("ResNet-152", "P100-SXM2", 32, 82.7, "DGX-1, other results, batch 32"),
    ("VGG16", "P100-SXM2", 32, 144.0, "DGX-1, other results, batch 32"),
    ("InceptionV3", "K80", 64, 30.5, "GCE K80, batch 64"),
    ("ResNet-50", "K80", 64, 51.9, "GCE K80, batch 64"),
    ("ResNet-152", "K80", 32, 20.0, "GCE K80, batch 32"),
    ("VGG16", "K80", 32, 35.4, "GCE K80, batch 32"),
]

# Published images/s on 1, 2, 4, 8 P100 of the DGX-1 (batch 64 per GPU) and the
# variable_update the guide used for the model.
SCALING = {
    "InceptionV3": ((142.0, 284.0, 569.0, 1131.0), "parameter_server, cpu"),
    "ResNet-50": ((219.0, 422.0, 852.0, 1734.0), "parameter_server, cpu"),
    "ResNet-152": ((91.8, 181.0, 356.0, 716.0), "parameter_server, cpu"),
    "VGG16": ((154.0, 295.0, 584.0, 1081.0), "replicated, NCCL"),
}
SCALING_GPUS = (1, 2, 4, 8)
SCALING_BATCH = 64

# The DGX-1's P100s talk over NVLink 1.0: 4 links of 20 GB/s per direction per GPU,
# 640 Gbit/s aggregate (the convention of the named clusters' NVLink machines).
DGX1_NVLINK_GBPS = 640.0

# The DGX-1's host (NVIDIA DGX-1 system datasheet, 2016; Intel Xeon E5-2698 v4 product
# brief): two 20-core Xeon E5-2698 v4 at 2.2 GHz, 32 FP32 FLOP per cycle and core (two
# AVX2 FMA units), four DDR4-2400 channels of 19.2 GB/s each per socket, 512 GB of memory.
DGX1_HOST = {
    "name": "DGX1-host-CPUs",
    "fp32_tflops": 2 * 20 * 2.2e9 * 32 / 1e12,
    "memory_bandwidth_gb_per_s": 2 * 4 * 19.2,
    "memory_gib": 512,
    "winograd": False,
}
# PCIe 3.0 x16 between the host and a GPU: 16 lanes x 8 GT/s, 128b/130b encoding.
PCIE3_X16_GBPS = 16 * 8 * 128 / 130
PARAMETER_SERVER_CPU = {"InceptionV3", "ResNet-50", "ResNet-152"}


def build_graph(model: Model, batch: int) -> tuple[bytes, list[str]]:
    """The SGD training graph of ``model`` (serialized GraphDef) and its batch inputs."""
    import tensorflow as tf

    from tagplan.planner.zoo.models.applications import image_classifier
    from tagplan.planner.zoo.models.common import build_tf1

    graph = build_tf1(
        lambda: image_classifier(model.app, batch, model.image_size),
        optimizer=lambda: tf.compat.v1.train.GradientDescentOptimizer(SGD_LEARNING_RATE),
    )
    return graph.graph_def.SerializeToString(), [i["name"] for i in graph.inputs]


def dgx1(gpus: int) -> dict:
    return {
        "machines": [
            {
                "name": "dgx1",
                "gpus": {"type": "P100-SXM2", "count": gpus},
                "intra_bandwidth_gbps": DGX1_NVLINK_GBPS,
            }
        ]
    }


def single_gpu(gpu: str) -> dict:
    return {
        "machines": [
            {"name": "host", "gpus": {"type": gpu, "count": 1}, "intra_bandwidth_gbps": 96}
        ]
    }


def host_parameter_server(gpu: str) -> dict:
    """One GPU and the DGX-1's host CPUs as a device of their own, linked by PCIe."""
    return {
        "gpu_types": [DGX1_HOST],
        "machines": [
            single_gpu(gpu)["machines"][0],
            {
                "name": "cpus",
                "gpus": {"type": DGX1_HOST["name"], "count": 1},
                "intra_bandwidth_gbps": PCIE3_X16_GBPS,
            },
        ],
        "network": {"bandwidth_gbps": PCIE3_X16_GBPS},
    }


def variables_on_host(ir: GraphIR, cluster: Cluster, costs: OpCostModel) -> Strategy:
    """The model on the GPU, every variable's parameter server (and its update) on the
    host, as ``variable_update=parameter_server, local_parameter_device=cpu`` runs it
    (a strategy builder of the baselines' signature; the costs do not matter here)."""
    gpu_group = int(cluster.group_of_device[0])
    on_host = GroupDecision(
        device_groups=[gpu_group],
        option=Option.REPLICATE_PS,
        ps_device=str(cluster.device_names[1]),
    )
    groups = [
        OpGroup(ops=[ir.op_names[o] for o in sorted(ops)], decision=on_host)
        for _, ops in ps_variables(ir)
    ]
    default = GroupDecision(device_groups=[gpu_group], option=Option.REPLICATE_ALLREDUCE)
    return Strategy(name="parameter-server-cpu", groups=groups, default=default)


def simulated_step_s(
    ir: GraphIR,
    cluster_spec: dict,
    build: Callable[[GraphIR, Cluster, OpCostModel], Strategy],
) -> float:
    """The simulated step of the strategy ``build`` makes for ``ir`` on the cluster."""
    cluster = load_cluster(cluster_spec)
    evaluator = Evaluator(ir, cluster)
    return evaluator.evaluate(build(ir, cluster, evaluator.costs)).step_time_s


def ratio_cell(ratio: float, bar: float) -> str:
    mark = "" if abs(ratio - 1) <= bar else " ✗"
    return f"{ratio:.2f}{mark}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    args = parser.parse_args()
    started = time.perf_counter()
    graphs = {name: build_graph(MODELS[name], SCALING_BATCH) for name in args.models}
    irs: dict[tuple[str, int], GraphIR] = {}

    def ir_at(name: str, batch: int) -> GraphIR:
        if (name, batch) not in irs:
            data, inputs = graphs[name]
            irs[name, batch] = analyze(
                loads_graph_def(data), batch_size=batch, batch_inputs=inputs, loss="loss"
            )
        return irs[name, batch]

    lines = [
        "Single GPU, training images/s (predicted: `single` baseline, simulated step):",
        "",
        "| model | GPU | batch | predicted | published | predicted / published | published in "
        "| predicted, variables on the host CPUs | its ratio |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
    ]
    single_rates: dict[tuple[str, str, int], float] = {}
    for name, gpu, batch, published, where in SINGLE:
        if name not in graphs:
            continue
        step = simulated_step_s(ir_at(name, batch), single_gpu(gpu), BASELINES["single"])
        rate = batch / step
        single_rates[name, gpu, batch] = rate
        host = "– | –"
        if name in PARAMETER_SERVER_CPU and gpu == "P100-SXM2":
            on_host = batch / simulated_step_s(
                ir_at(name, batch), host_parameter_server(gpu), variables_on_host
            )
            host = f"{on_host:,.1f} | {ratio_cell(on_host / published, 0.15)}"
        lines.append(
            f"| {name} | {gpu} | {batch} | {rate:,.1f} | {published:,.1f} | "
            f"{ratio_cell(rate / published, 0.15)} | {where} | {host} |"
        )
    lines += [
        "",
        "Per-step cost split from the two batch sizes on the P100 (step = fixed + batch x "
        "per image; the published split uses the batch-64 and batch-32 figures):",
        "",
        "| model | predicted ms/image | published ms/image | predicted fixed ms "
        "| published fixed ms |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    published_rate = {(n, g, b): p for n, g, b, p, _ in SINGLE}
    for name in graphs:
        split = []
        for rates in (single_rates, published_rate):
            t64, t32 = 64 / rates[name, "P100-SXM2", 64], 32 / rates[name, "P100-SXM2", 32]
            per_image = (t64 - t32) / 32
            split.append((per_image * 1e3, (t32 - 32 * per_image) * 1e3))
        lines.append(
            f"| {name} | {split[0][0]:.2f} | {split[1][0]:.2f} | {split[0][1]:.0f} | "
            f"{split[1][1]:.0f} |"
        )
    lines += [
        "",
        f"Scaling on one DGX-1 (P100-SXM2, NVLink {DGX1_NVLINK_GBPS:.0f} Gbit/s per GPU), "
        f"batch {SCALING_BATCH} per GPU: speedup = images/s on N GPUs / images/s on one "
        "(predicted: `dp-nccl` baseline):",
        "",
        "| model | GPUs | predicted speedup | published speedup | predicted / published | "
        "published variable_update |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for name in graphs:
        rates, update = SCALING[name]
        one = None
        for gpus, published in zip(SCALING_GPUS, rates, strict=True):
            ir = ir_at(name, SCALING_BATCH * gpus)
            strategy = BASELINES["single" if gpus == 1 else "dp-nccl"]
            rate = SCALING_BATCH * gpus / simulated_step_s(ir, dgx1(gpus), strategy)
            if one is None:
                one = rate
                continue
            speedup, published_speedup = rate / one, published / rates[0]
            lines.append(
                f"| {name} | {gpus} | {speedup:.2f} | {published_speedup:.2f} | "
                f"{ratio_cell(speedup / published_speedup, 0.10)} | {update} |"
            )
    lines += [
        "",
        f"Source of every published figure: {SOURCE}; FP32, SGD, CUDA 8 / cuDNN 5.1. "
        "✗ marks a row outside its bar (single GPU: ±15% of the published images/s; "
        "scaling: ±10% of the published speedup). No constant of the cost model was fitted "
        "on any row of this table.",
        "",
        "Reading the split: where the per-image costs agree and the step does not, the gap "
        "is a per-step cost outside the simulated GPU step. The guide ran Inception-v3 and "
        "both ResNets with their variables on the host CPU (`parameter_server, cpu`) even on "
        "one GPU: every step copies the parameters to the GPU and the gradients back over "
        f"PCIe and applies SGD on the CPU. The last two columns simulate that configuration "
        f"(the DGX-1's two Xeon E5-2698 v4 as one device of {DGX1_HOST['fp32_tflops']:.2f} "
        f"TFLOP/s and {DGX1_HOST['memory_bandwidth_gb_per_s']:.1f} GB/s, PCIe 3.0 x16 at "
        f"{PCIE3_X16_GBPS:.0f} Gbit/s). The K80 rows test the same efficiencies on a Kepler "
        "GPU at its boost-clock datasheet peak.",
    ]
    body = "\n".join(lines)
    print(body)
    print(f"({time.perf_counter() - started:.0f} s)")
    write_section(
        "fidelity",
        "Fidelity against published training throughput",
        "python -m bench.fidelity",
        body,
    )


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
