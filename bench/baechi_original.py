"""Baechi's placers against Baechi's own code: the same graph, op times, memory and transfer
times handed to the original m-TOPO, m-ETF and m-SCT and to ours, both placements simulated
by our simulator.

The original code is read from a git repository of Baechi (``--baechi-repo``, default the
``BAECHI_REPO`` environment variable); its ``placer`` and ``utils`` folders are extracted to a
temporary folder at run time and imported with TensorFlow-only modules stubbed out (placement
needs none of them). It needs ``networkx`` and ``cvxopt``; m-SCT's LP runs on cvxopt's own
solver (the original asks for MOSEK). Without a repository the script says so and exits 0.

Export (Baechi's op-graph format, ``placer_lib.PlacementGraphGenerator``): one node per op
with its time on the first GPU in microseconds (at least our placers' minimum, as Baechi's
profiles give every op at least one), its outputs' bytes, workspace as temporary memory and
its variables as persistent memory; its co-placement unit as the colocation group; one edge
per pair of communicating ops carrying each tensor with its transfer time (latency + bytes /
bandwidth between two GPUs; a control dependency carries a 4-byte message, as in Baechi).
Times stay fractional: Baechi's profiles are whole microseconds, but rounding shifts which
of two near-simultaneous events comes first, and list scheduling is sensitive to that. The
devices are the cluster's GPUs with the memory our placers may use. The placers run as
Baechi's placer library calls them: with colocation, m-SCT at threshold 0.1.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import io
import logging
import os
import subprocess
import sys
import tarfile
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import write_section
from tagplan.planner.cost.memory import op_memory
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.search.baechi import (
    CONTROL_MESSAGE_BYTES,
    MIN_OP_TIME_S,
    ProfiledView,
    m_etf,
    m_sct,
    m_topo,
    placement_strategy,
)
from tagplan.planner.search.grouping import atoms_of
from tagplan.planner.strategy import Strategy, resolve
from tagplan.planner.topology import Cluster, load_cluster
from tagplan.planner.topology.named import named_cluster_spec

SCT_THRESHOLD = 0.1  # Baechi's placer library default (§4.3)


def four_gpus(gpu_type: str) -> dict[str, Any]:
    """One machine with four equal GPUs at 100 Gbps between any two."""
    return {
        "machines": [
            {"name": "m0", "gpus": {"type": gpu_type, "count": 4}, "intra_bandwidth_gbps": 100}
        ],
        "network": {"bandwidth_gbps": 100},
    }


CASES = [
    ("inception_v3", "4 x V100-32GB", four_gpus("V100-32GB")),
    ("transformer", "4 x V100-32GB", four_gpus("V100-32GB")),
    ("bert_large", "4 x GTX-1080Ti", four_gpus("GTX-1080Ti")),
    ("bert_large", "cloud", named_cluster_spec("cloud").model_dump(exclude_none=True)),
]
OURS: dict[str, Callable[..., Strategy]] = {"m-topo": m_topo, "m-etf": m_etf, "m-sct": m_sct}


def load_original(repo: Path, folder: Path) -> dict[str, Callable[..., Any]]:
    """Baechi's m_topo, m_etf and m_sct, imported from ``repo``'s HEAD."""
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "HEAD", "placer", "utils"],
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    for name in ("matplotlib", "matplotlib.pyplot", "tensorflow", "tensorflow.core"):
        sys.modules.setdefault(name, types.ModuleType(name))
    framework = types.ModuleType("tensorflow.core.framework")
    framework.attr_value_pb2 = types.ModuleType("attr_value_pb2")  # type: ignore[attr-defined]
    sys.modules.setdefault("tensorflow.core.framework", framework)
    sys.path.insert(0, str(folder))
    import cvxopt.solvers

    solve_lp = cvxopt.solvers.lp
    cvxopt.solvers.lp = lambda *args, solver=None, **kwargs: solve_lp(*args, **kwargs)
    cvxopt.solvers.options["show_progress"] = False
    placers = {
        "m-topo": lambda g, d: importlib.import_module("placer.m_topo").m_topo(
            g, d, colocation=True
        ),
        "m-etf": lambda g, d: importlib.import_module("placer.m_etf").m_etf(g, d, colocation=True),
        "m-sct": lambda g, d: importlib.import_module("placer.m_sct").m_sct(
            g, d, threshold=SCT_THRESHOLD, colocation=True
        ),
    }
    logging.disable(logging.INFO)
    return placers


def export(ir: GraphIR, cluster: Cluster, view: ProfiledView) -> tuple[Any, Any]:
    """``ir`` on ``cluster`` as Baechi's (op graph, device graph), with the figures our
    placers see (``view``); times in microseconds, at least :data:`MIN_OP_TIME_S` per op
    as our placers take them (Baechi's profiles give every op at least 1)."""
    import networkx as nx

    memory = op_memory(ir)
    units = atoms_of(ir)
    op_us = 1e6 * np.maximum(view.op_time_s, MIN_OP_TIME_S)
    ops = nx.DiGraph()
    for op in range(ir.num_ops):
        ops.add_node(
            op,
            id=op,
            name=ir.op_names[op],
            weight=float(op_us[op]),
            temporary_memory=int(memory.workspace_bytes[op]),
            persistent_memory=int(memory.persistent_bytes[op]),
            output_memory=[int(memory.tensor_bytes[t]) for t in ir.outputs(op)],
            colocation_group=str(units[op]),
        )
    for op in range(ir.num_ops):
        reads = [(int(ir.tensor_producer[t]), f"t{t}", ir.tensor_bytes[t]) for t in ir.inputs(op)]
        reads += [(int(p), f"^{p}", CONTROL_MESSAGE_BYTES) for p in ir.control_preds(op)]
        for producer, name, nbytes in reads:
            if producer == op:
                continue
            if not ops.has_edge(producer, op):
                ops.add_edge(producer, op, id=ops.number_of_edges(), weight=0.0, tensor=[])
            edge = ops[producer][op]
            if all(tensor["name"] != name for tensor in edge["tensor"]):
                weight = float(1e6 * view.transfer_s(1, nbytes))
                edge["tensor"].append({"name": name, "weight": weight, "num_bytes": int(nbytes)})
                edge["weight"] += weight
    importlib.import_module("placer.placer_utils").assign_topo_order(ops)
    devices = nx.Graph()
    for d, capacity in enumerate(view.capacity_bytes.tolist()):
        devices.add_node(d, id=d, name=str(cluster.device_names[d]), size=0, memory_limit=capacity)
    return ops, devices


def compare(
    model: str, cluster_spec: dict[str, Any], placers: dict[str, Callable[..., Any]]
) -> list[list[str]]:
    """One row per placer: original and our step time, same-device share, wall times."""
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    cluster = load_cluster(cluster_spec)
    evaluator = Evaluator(ir, cluster)
    op_graph, device_graph = export(ir, cluster, ProfiledView.of(ir, cluster, evaluator.costs))
    rows = []
    for name, ours in OURS.items():
        start = time.perf_counter()
        placed = placers[name](copy.deepcopy(op_graph), device_graph)  # it writes placements back
        original_wall_s = time.perf_counter() - start
        original_devices = np.array([placed.nodes[op]["p"] for op in range(ir.num_ops)])
        start = time.perf_counter()
        strategy = ours(ir, cluster, evaluator.costs)
        ours_wall_s = time.perf_counter() - start
        our_devices = resolve(strategy, ir, cluster).op_device
        original_s = evaluator.evaluate(
            placement_strategy(ir, cluster, original_devices, name)
        ).step_time_s
        ours_s = evaluator.evaluate(strategy).step_time_s
        rows.append(
            [
                f"{original_s * 1e3:,.0f}",
                f"{ours_s * 1e3:,.0f}",
                f"{ours_s / original_s:.3f}",
                f"{100 * np.mean(original_devices == our_devices):.0f}%",
                f"{ours_wall_s:.2f} / {original_wall_s:.1f}",
            ]
        )
        print(f"| {model} | {name} | " + " | ".join(rows[-1]) + " |", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baechi-repo", default=os.environ.get("BAECHI_REPO"))
    parser.add_argument("--models", nargs="*", default=list(dict.fromkeys(m for m, _, _ in CASES)))
    args = parser.parse_args()
    if not args.baechi_repo or not Path(args.baechi_repo).exists():
        print("skipped: no Baechi repository (pass --baechi-repo or set BAECHI_REPO)")
        return
    lines = [
        "| model | cluster | placer | original ms | ours ms | ours / original | same device "
        "| placer wall s (ours / original) |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    with tempfile.TemporaryDirectory() as folder:
        placers = load_original(Path(args.baechi_repo), Path(folder))
        for model, cluster_name, spec in CASES:
            if model not in args.models:
                continue
            for name, row in zip(OURS, compare(model, spec, placers), strict=True):
                lines.append(f"| {model} | {cluster_name} | {name} | " + " | ".join(row) + " |")
    body = "\n".join(
        [
            "Step time in ms simulated by our simulator for the placement of Baechi's original "
            "code and of ours, on the same op graph, op times, memory and transfer times "
            "(four GPUs of one machine, 100 Gbps between any two; m-SCT's LP on cvxopt's "
            "solver). Same device: the share of ops both put on the same GPU. On the mixed "
            "`cloud` allocation (V100s and T4s, 10 Gbps between machines) the original is "
            "given what Baechi measures: op times of the first GPU, transfers of the first "
            "pair, each GPU's memory; ours take the same view.",
            "",
            *lines,
        ]
    )
    write_section(
        "baechi_original",
        "Baechi's placers against the original code",
        "python -m bench.baechi_original --baechi-repo <Baechi checkout> --models "
        + " ".join(args.models),
        body,
    )


if __name__ == "__main__":
    main()
