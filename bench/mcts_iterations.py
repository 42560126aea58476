"""TAG Table 7's "Pure MCTS" column: search iterations until the uniform-prior tree search
first finds a strategy faster than DP-NCCL, per model, over random clusters (TAG §5.7's
generator). This is the number a learned prior has to cut."""

from __future__ import annotations

import argparse
import math
import statistics
import time

from bench.plan_quality import analyzed
from bench.report import write_section
from tagplan.planner.evaluate import Evaluator
from tagplan.planner.search.actions import ActionSpace
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.search.grouping import cluster_mean_op_time_s, group_ops
from tagplan.planner.search.mcts import SearchProgress, StrategySearch
from tagplan.planner.topology import load_cluster

MODELS = ["inception_v3", "resnet101", "vgg19", "transformer", "bert_small"]
TAG_TABLE_7 = {
    "inception_v3": (66.0, 9.5),
    "resnet101": (73.4, 4.6),
    "vgg19": (56.6, 17.7),
    "transformer": (145.0, 121.8),
    "bert_small": (97.8, 7.9),
}


def iterations_to_beat(
    ir, cluster_name: str, seed: int, cap: int, cap_s: float
) -> tuple[int | None, int | None]:
    """Iterations of a shuffled-tie uniform-prior search until it beats DP-NCCL and until
    it beats Horovod-like (None: not within ``cap`` iterations / ``cap_s`` seconds)."""
    cluster = load_cluster(cluster_name)
    evaluator = Evaluator(ir, cluster)
    steps = {
        name: evaluator.evaluate(baseline_strategy(name, ir, cluster, evaluator.costs))
        for name in ("dp-nccl", "horovod")
    }
    dp_s = steps["dp-nccl"].step_time_s
    horovod_s = math.inf if steps["horovod"].result.oom else steps["horovod"].step_time_s
    search = StrategySearch(
        evaluator,
        group_ops(ir, cluster_mean_op_time_s(ir, cluster, evaluator.costs), seed=seed),
        ActionSpace(ir, cluster, evaluator.costs),
        reference_step_s=dp_s,
        seed=seed,
        shuffle_ties=True,
    )
    beat_horovod: list[int] = []

    def watch(p: SearchProgress) -> None:
        if not beat_horovod and p.best_step_time_s is not None and p.best_step_time_s < horovod_s:
            beat_horovod.append(p.iterations)

    outcome = search.run(
        iterations=cap, budget_s=cap_s, stop_below_s=min(dp_s, horovod_s), progress=watch
    )
    return outcome.first_better_iteration, (beat_horovod or [None])[0]


def _stats(found: list[int], total: int) -> list[str]:
    if not found:
        return [f"0 / {total}", "-", "-", "-"]
    return [
        f"{len(found)} / {total}",
        f"{statistics.mean(found):.1f}",
        f"{statistics.median(found):.0f}",
        str(max(found)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--clusters", type=int, default=20)
    parser.add_argument("--first-seed", type=int, default=101)
    parser.add_argument("--cap", type=int, default=200, help="iterations per search")
    parser.add_argument("--cap-s", type=float, default=30.0, help="seconds per search")
    args = parser.parse_args()
    started = time.perf_counter()
    lines = [
        "| model | beat DP-NCCL | mean iterations | median | max | beat Horovod-like "
        "| mean iterations | median | max | TAG Pure MCTS | TAG (GNN) |",
        "| --- |" + " ---: |" * 10,
    ]
    for model in args.models:
        ir = analyzed(model)
        dp: list[int] = []
        horovod: list[int] = []
        for k in range(args.clusters):
            seed = args.first_seed + k
            n_dp, n_hv = iterations_to_beat(ir, f"random:{seed}", seed, args.cap, args.cap_s)
            print(model, seed, n_dp, n_hv, flush=True)
            dp += [n_dp] if n_dp is not None else []
            horovod += [n_hv] if n_hv is not None else []
        pure, gnn = TAG_TABLE_7.get(model, (None, None))
        cells = [*_stats(dp, args.clusters), *_stats(horovod, args.clusters)]
        cells += [f"{pure}" if pure else "", f"{gnn}" if gnn else ""]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    last = args.first_seed + args.clusters - 1
    body = "\n".join(
        [
            f"Clusters `random:{args.first_seed}` to `random:{last}` "
            "(TAG's generator: 1-6 machines of 1-8 GPUs of three or more types). Each search is "
            "the uniform-prior MCTS with shuffled ties, seeded by the cluster, stopped at the "
            "first strategy faster than both DP-NCCL and the Horovod-like baseline (bucketed "
            f"AllReduce overlapped with backward), or after {args.cap} iterations / "
            f"{args.cap_s:.0f} s; means are over the clusters where it got there. TAG's "
            "columns are its Table 7 (iterations to beat DP-NCCL, on its own random "
            "topologies).",
            "",
            *lines,
            "",
            f"Whole run: {time.perf_counter() - started:.0f} s wall.",
        ]
    )
    write_section(
        "mcts-iterations",
        "Iterations until pure MCTS beats DP-NCCL (TAG Table 7)",
        "python -m bench.mcts_iterations",
        body,
    )


if __name__ == "__main__":
    main()
