"""Warm starts: search iterations to come within 1% of a cold search, from a near miss.

For each model and random cluster, a plan on the cluster is the cached plan; three near
misses follow — the cluster with its last machine removed, with one more machine (a copy
of its first), and the same cluster at twice the batch size. On each near miss one search
starts cold and one starts from the cached plan adapted to it
(:mod:`tagplan.planner.search.warm_start`), both with the same iteration budget, and each
reports the first iteration whose best step is within 1% of the cold search's best (a
baseline the cold search did not find may still be chosen by the plan; the last column
compares the plans).
"""

from __future__ import annotations

import argparse
import copy
import statistics

from bench.report import write_section
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
from tagplan.planner.plan import Planner, PlanOptions, PlanProgress
from tagplan.planner.search.warm_start import adapt_strategy
from tagplan.planner.strategy import Strategy
from tagplan.planner.topology import Cluster, load_cluster
from tagplan.planner.topology.named import random_cluster_spec

COMMAND = "python -m bench.warm_start"
MODELS = [
    "vgg19",
    "inception_v3",
    "transformer",
    "bert_small",
    "gnmt_small",
    "wide_deep",
    "small_cnn",
    "mlp",
]
"""The zoo without its two largest graphs, whose searches take many minutes each here."""


def _search(ir, cluster: Cluster, iterations: int, start: Strategy | None):
    """The plan of a search of ``iterations`` and its best step after each iteration."""
    options = PlanOptions(iterations=iterations, patience=None, sfb=False, budget_s=1e6)
    best: dict[int, float] = {}

    def progress(report: PlanProgress) -> None:
        if report.phase == "search" and report.best_step_time_s is not None:
            best[report.iterations] = report.best_step_time_s

    planner = Planner(ir, cluster, options=options, graphdef=False, start=start, progress=progress)
    return planner.finish([planner.search_shard(0)]), best


def _reach(best: dict[int, float], target_s: float) -> int | None:
    return next((i for i in sorted(best) if best[i] <= target_s * 1.01), None)


def _near_misses(spec: dict) -> list[tuple[str, dict, int]]:
    """(kind, cluster spec, batch factor) of the near misses of ``spec``."""
    fewer = copy.deepcopy(spec)
    gone = fewer["machines"].pop()["name"]
    links = fewer["network"].get("links") or []
    fewer["network"]["links"] = [link for link in links if gone not in link["between"]]
    more = copy.deepcopy(spec)
    more["machines"].append({**copy.deepcopy(spec["machines"][0]), "name": "extra"})
    return [("machine fewer", fewer, 1), ("machine more", more, 1), ("batch x2", spec, 2)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--seeds", nargs="*", type=int, default=[1])
    parser.add_argument("--iterations", type=int, default=80)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    lines = [
        "| model | cluster | near miss | cold: iterations to 1% | warm: iterations to 1% "
        "| warm step / cold step |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    cold_reach, warm_reach = [], []
    for model in args.models:
        source = load_graph_source(f"zoo:{model}")
        for seed in args.seeds:
            spec = random_cluster_spec(seed, machines=4).model_dump(mode="json")
            base_ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
            cached, _ = _search(base_ir, load_cluster(spec), args.iterations, None)
            for kind, near, factor in _near_misses(spec):
                ir = analyze(
                    source.graph_def,
                    batch_size=base_ir.batch_size * factor,
                    batch_inputs=source.batch_inputs,
                    loss=source.loss,
                )
                cluster = load_cluster(near)
                start = adapt_strategy(cached.strategy, load_cluster(spec), cluster)
                cold, cold_best = _search(ir, cluster, args.iterations, None)
                warm, warm_best = _search(ir, cluster, args.iterations, start)
                target = min(cold_best.values())  # the cold search's own result
                c, w = _reach(cold_best, target), _reach(warm_best, target)
                cold_reach.append(c or args.iterations)
                warm_reach.append(w or args.iterations)
                lines.append(
                    f"| {model} | random:{seed} | {kind} | {c} | {w} | "
                    f"{warm.step_time_s / cold.step_time_s:.3f} |"
                )
                print(lines[-1], flush=True)
    ratio = statistics.median(cold_reach) / max(statistics.median(warm_reach), 1)
    summary = (
        f"Median iterations to within 1% of the cold search's step over {len(cold_reach)} "
        f"near misses: cold {statistics.median(cold_reach):g}, warm "
        f"{statistics.median(warm_reach):g} ({ratio:.1f}x fewer; bar: 3x). Each search: "
        f"{args.iterations} iterations, one tree, SFB off."
    )
    text = "\n".join(
        [__doc__.split("\n\n", 1)[1].replace("\n", " ").strip(), "", summary, "", *lines]
    )
    print(text)
    if not args.no_write:
        write_section("warm_start", "Warm starts from near misses", COMMAND, text)


if __name__ == "__main__":
    main()
