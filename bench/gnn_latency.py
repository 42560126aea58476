"""The GNN prior's inference per expansion: message passing over all edge types at once
(:mod:`tagplan.gnn.hetero_attention`, what the search runs) against PyG's HeteroConv of
GATv2Conv modules over the same parameters (the reference), with the shipped checkpoint's
weights, on one thread.

For each case a search with the shipped prior runs ``--iterations`` iterations; the
vertices it expanded are then scored again by both paths, alternating, each timed over
``--repeats`` rounds (median per expansion, the whole ``probabilities()`` call: graph
features, tensors, forward pass, mixing). The two priors must agree to 1e-5.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from bench.report import (
    add_comparison_arguments,
    before_cells,
    before_note,
    kept_for_later,
    rows_before,
    write_section,
)
from tagplan.gnn import load_prior
from tagplan.gnn.dataset import Case, search_for

CASES = [
    ("bert_large", "scale:256"),
    ("resnet101", "scale:64"),
    ("transformer", "cloud"),
    ("vgg19", "testbed"),
]


def measure(model: str, cluster: str, iterations: int, repeats: int) -> dict:
    prior = load_prior()  # one thread, as a plan runs it
    search = search_for(Case(f"zoo:{model}", cluster, 0), prior)
    search.run(iterations=iterations)
    queries = [query for query, _ in search.visit_targets(1)]
    seconds: dict[bool, list[float]] = {True: [], False: []}
    answers: dict[bool, list[np.ndarray]] = {True: [], False: []}
    for _ in range(repeats):
        for fused in (True, False):
            prior.model.run_pyg_reference(not fused)
            answers[fused] = []
            for query in queries:
                started = time.perf_counter()
                answers[fused].append(prior.probabilities(query))
                seconds[fused].append(time.perf_counter() - started)
    gap = max(
        float(np.abs(a - b).max()) for a, b in zip(answers[True], answers[False], strict=True)
    )
    if gap > 1e-5:
        raise SystemExit(f"{model} on {cluster}: the two paths differ by {gap:.2e}")
    return {
        "case": f"{model} {cluster}",
        "model": model,
        "cluster": cluster,
        "groups": search.grouping.num_groups,
        "device_groups": search.space.cluster.num_groups,
        "actions": len(search.space),
        "expansions": len(queries),
        "fused_ms": 1000 * statistics.median(seconds[True]),
        "reference_ms": 1000 * statistics.median(seconds[False]),
        "gap": gap,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="write BENCHMARKS.md")
    add_comparison_arguments(parser)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    for model, cluster in CASES:
        row = measure(model, cluster, args.iterations, args.repeats)
        print(row, flush=True)
        rows.append(row)
    if kept_for_later(args, rows):
        return
    before, label = rows_before(args), args.before_label
    extra = f" {label}, fused (ms) | {label} / this |" if before else ""
    lines = [
        "| model | cluster | op groups | device groups | actions | expansions "
        f"| HeteroConv (ms) | fused (ms) | speed-up | largest prior difference |{extra}",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        + " ---: | ---: |" * bool(before),
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['cluster']} | {r['groups']} | {r['device_groups']} "
            f"| {r['actions']} | {r['expansions']} | {r['reference_ms']:.2f} "
            f"| {r['fused_ms']:.2f} | {r['reference_ms'] / r['fused_ms']:.2f}x | {r['gap']:.1e} |"
            + before_cells(before.get(r["case"]), "fused_ms", r["fused_ms"], 2)
        )
    body = "\n".join(
        [
            "Milliseconds per expansion of the shipped GNN prior (`probabilities()`: the "
            "state's graph, its tensors, the forward pass), one thread, median over the "
            f"vertices a {args.iterations}-iteration search expanded, {args.repeats} rounds "
            "alternating the two paths. *HeteroConv*: PyG's HeteroConv of one GATv2Conv per "
            "edge type over the network's parameters (`PriorNet.run_pyg_reference`); "
            "*fused*: the same layers computed over all "
            "edge types as one edge list, the op-group x device-group types as dense grids "
            "(`tagplan/gnn/hetero_attention.py`), what a search runs. Same weights; the "
            "priors agree to the last column." + before_note(args, before),
            "",
            *lines,
        ]
    )
    if args.write:
        write_section(
            "gnn-latency",
            "GNN prior inference per expansion",
            " ".join(["python -m bench.gnn_latency", *sys.argv[1:]]),
            body,
        )


if __name__ == "__main__":
    main()
