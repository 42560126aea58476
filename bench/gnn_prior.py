"""What the GNN prior buys the search (TAG §5.7 Table 7, §5.8), on clusters of seeds no
training run draws from (:data:`~tagplan.gnn.train.EVAL_SEEDS`).

For each case (a zoo model on an unseen random cluster; half of them TAG §5.2's
generator, half larger allocations of 8-12 machines and 32-128 GPUs), three searches
over the same op groups, actions and simulator, as ``tagplan plan`` builds them:

* the MCTS with the uniform prior (the first tree of a plan: ties in the candidate
  generator's order), ``--iterations`` iterations;
* the same MCTS with the GNN prior, the same number of iterations;
* simulated annealing (``bench.search_yardstick``) for ``--anneal`` strategies, a
  yardstick independent of the tree.

The best known step of a case is the best any of them found; each MCTS's figure is the
iterations until its best came within 1% of it (TAG Table 7 counts iterations until a
target is reached). Searches of one case share their simulations, which changes no
iteration count.

``--also CHECKPOINT...`` searches other networks in the same cases (their simulations
shared, the best known step the best of every search) and writes a table of them beside
the main checkpoint: training options compared side by side before one is shipped.

``--sweep`` runs every MCTS with the sweep of uniform strategies that a plan's first tree
starts with (docs/design.md §7, *The sweep*) and writes its own section: Table 7 for the
tree a plan runs, where without it the section stands for TAG's pure MCTS.

``--budgets`` adds the small-budget comparison: on the cases with 8 or more device
groups, the step each prior reaches with a wall-clock search budget of 2 s and 5 s (the
prior's inference included). ``--latency`` measures the prior's inference per expansion
on 60 op groups x 32 device groups.

Cases run in ``--workers`` processes and are appended to ``--out`` as JSON lines, so a
run resumes and several runs (say, fewer clusters for the models whose simulation is
slow) add up; ``--write`` turns every line of the file into the BENCHMARKS.md section.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch

from bench.report import add_case_run_arguments, append_records, records_done, write_section
from bench.search_yardstick import run_annealing
from tagplan.gnn import load_prior
from tagplan.gnn.dataset import Case, search_for
from tagplan.gnn.train import EVAL_SEEDS
from tagplan.planner.search.mcts import SearchProgress, StrategySearch
from tagplan.planner.topology import load_cluster

MODELS = [
    "vgg19",
    "wide_deep",
    "bert_small",
    "inception_v3",
    "gnmt_small",
    "resnet101",
    "transformer",
    "bert_large",
]
WITHIN = 1.01
LONG_SEARCH_AT_LEAST = 20  # Table 7's goal counts cases where uniform needs this many
LARGE_GPUS = (32, 128)  # GPUs of the larger half of the cases


def eval_cases(models: list[str], per_model: int, seed: int) -> list[Case]:
    """``per_model`` unseen clusters per model, every other one an allocation of 8-12
    machines and 32-128 GPUs."""
    rng = random.Random(seed)
    cases = []
    for model in models:
        for index in range(per_model):
            cluster, cluster_seed = _large_cluster(rng) if index % 2 else _tag_cluster(rng)
            cases.append(Case(f"zoo:{model}", cluster, cluster_seed))
    return cases


def cases_left(args: argparse.Namespace) -> list[Case]:
    """The cases of ``args.models``, ``args.per_model`` and ``args.seed`` that the JSON
    lines of ``args.out`` do not hold yet (a run resumes)."""
    done = records_done(args.out, _case_key)
    return [
        c
        for c in eval_cases(args.models, args.per_model, args.seed)
        if (c.graph, c.cluster) not in done
    ]


def records_of(args: argparse.Namespace) -> list[dict]:
    """Every case record of ``args.out``."""
    return list(records_done(args.out, _case_key).values())


def _case_key(record: dict) -> tuple[str, str]:
    return record["graph"], record["cluster"]


def _tag_cluster(rng: random.Random) -> tuple[str, int]:
    """A cluster of TAG §5.2's generator and its seed."""
    cluster_seed = rng.randrange(EVAL_SEEDS.start, EVAL_SEEDS.stop)
    return f"random:{cluster_seed}", cluster_seed


def _large_cluster(rng: random.Random) -> tuple[str, int]:
    """A cluster of 8-12 machines and its seed, seeds drawn until it has
    :data:`LARGE_GPUS` GPUs."""
    while True:
        cluster_seed = rng.randrange(EVAL_SEEDS.start, EVAL_SEEDS.stop)
        cluster = f"random:{cluster_seed}:{8 + cluster_seed % 5}"
        if LARGE_GPUS[0] <= load_cluster(cluster).num_devices <= LARGE_GPUS[1]:
            return cluster, cluster_seed


def _trace(search: StrategySearch, iterations: int) -> list[float]:
    """Best step (inf while nothing fits) after each iteration."""
    best: list[float] = []

    def watch(p: SearchProgress) -> None:
        best.append(math.inf if p.best_step_time_s is None else p.best_step_time_s)

    search.run(iterations=iterations, progress=watch)
    return best


def _first_within(trace: list[float], target_s: float) -> int | None:
    return next((i for i, s in enumerate(trace, start=1) if s <= target_s), None)


def _budget_step(case: Case, prior, budget_s: float, sweep: bool) -> float:
    outcome = search_for(case, prior, shuffle_ties=False, sweep=sweep).run(budget_s=budget_s)
    return math.inf if outcome.oom else outcome.step_time_s


def run_case(
    case: Case,
    iterations: int,
    anneal: int,
    budgets: bool,
    checkpoint: str | None,
    also: Sequence[str] = (),
    sweep: bool = False,
):
    torch.set_num_threads(1)
    gnn = load_prior(checkpoint)
    others = {path: load_prior(path) for path in also}
    started = time.perf_counter()
    scores: dict = {}  # the case's simulations, shared by its searches

    def tree(prior) -> StrategySearch:
        return search_for(case, prior, scores=scores, shuffle_ties=False, sweep=sweep)

    uniform_search = tree(None)
    uniform = _trace(uniform_search, iterations)
    guided = _trace(tree(gnn), iterations)
    other_traces = {path: _trace(tree(prior), iterations) for path, prior in others.items()}
    annealer = search_for(case, None, scores=scores, shuffle_ties=False)
    annealed = run_annealing(annealer, (0,) * annealer.grouping.num_groups, anneal, 0).best_s
    known = min(min(uniform), min(guided), min(annealed), *map(min, other_traces.values()))
    record = {
        "graph": case.graph,
        "cluster": case.cluster,
        "sweep": sweep,
        "groups": uniform_search.grouping.num_groups,
        "device_groups": uniform_search.space.cluster.num_groups,
        "gpus": uniform_search.space.cluster.num_devices,
        "actions": len(uniform_search.space),
        "reference_s": uniform_search.reference_step_s,
        "known_s": known,
        "uniform_best_s": min(uniform),
        "gnn_best_s": min(guided),
        "anneal_best_s": min(annealed),
        "uniform_iterations": _first_within(uniform, known * WITHIN),
        "gnn_iterations": _first_within(guided, known * WITHIN),
        "prior_ms": 1000 * gnn.seconds / max(gnn.calls, 1),
    }
    if others:
        record["also"] = {
            path: {
                "best_s": min(trace),
                "iterations": _first_within(trace, known * WITHIN),
                "prior_ms": 1000 * others[path].seconds / max(others[path].calls, 1),
            }
            for path, trace in other_traces.items()
        }
    if budgets and record["device_groups"] >= 8:
        for budget in (2.0, 5.0):
            record[f"uniform_{budget:g}s"] = _budget_step(case, None, budget, sweep)
            record[f"gnn_{budget:g}s"] = _budget_step(case, gnn, budget, sweep)
            for path, prior in others.items():
                record["also"][path][f"{budget:g}s"] = _budget_step(case, prior, budget, sweep)
    record["wall_s"] = time.perf_counter() - started
    return record


def latency(checkpoint: str | None) -> dict:
    """The prior's inference per expansion on BERT-Large (60 op groups) over 32 device
    groups (``scale:256``), one thread."""
    torch.set_num_threads(1)
    prior = load_prior(checkpoint)
    search = search_for(Case("zoo:bert_large", "scale:256", 1), prior)
    outcome = search.run(iterations=40)
    per_call = prior.seconds / prior.calls
    return {
        "groups": search.grouping.num_groups,
        "device_groups": search.space.cluster.num_groups,
        "actions": len(search.space),
        "ms_per_expansion": 1000 * per_call,
        "prior_share": prior.seconds / outcome.elapsed_s,
    }


def _stats(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} / {statistics.fmean(values):.1f}"


def _count(value: int | None, iterations: int) -> int:
    """Iterations until within 1%; a search that never got there counts one past its
    budget."""
    return value if value is not None else iterations + 1


def _long_cases(records: list[dict], iterations: int) -> list[dict]:
    """The cases where the uniform search needs :data:`LONG_SEARCH_AT_LEAST` iterations or
    more (those Table 7's goal counts)."""
    return [
        r for r in records if _count(r["uniform_iterations"], iterations) >= LONG_SEARCH_AT_LEAST
    ]


def _three_x_fewer(long_cases: list[dict], path: str | None, iterations: int) -> int:
    """Of ``long_cases``, those where checkpoint ``path``'s search (:func:`_guided`) needs
    3x fewer iterations than the uniform search."""
    return sum(
        3 * _count(_guided(r, path)["iterations"], iterations)
        <= _count(r["uniform_iterations"], iterations)
        for r in long_cases
    )


def _at_least_as_fast(rows: list[dict], path: str | None, budget: str) -> int:
    """Of ``rows``, those where checkpoint ``path``'s plan at ``budget`` is at least as
    fast as the uniform search's."""
    return sum(_guided(r, path)[budget] <= r[f"uniform_{budget}"] * 1.0001 for r in rows)


def _guided(record: dict, path: str | None) -> dict:
    """A GNN search's figures in ``record``: the main checkpoint's (``path`` None) or
    those of an ``--also`` checkpoint."""
    if path is not None:
        return record["also"][path]
    budgets = {b: record[f"gnn_{b}"] for b in ("2s", "5s") if f"gnn_{b}" in record}
    return {"iterations": record["gnn_iterations"], "best_s": record["gnn_best_s"], **budgets}


def _side_by_side(records: list[dict], args) -> list[str]:
    """The ``--also`` checkpoints beside the main one, on the cases every one searched:
    per model, iterations to within 1% and the cases where each needs 3x fewer than the
    uniform search (of those where it needs 20 or more); the budget comparison per
    checkpoint. Nothing without ``--also`` records."""
    paths = list(dict.fromkeys(p for r in records for p in r.get("also", {})))
    shared = [r for r in records if all(p in r.get("also", {}) for p in paths)]
    if not paths or not shared:
        return []
    nets = [(args.checkpoint or "shipped", None), *((p, p) for p in paths)]
    header = "| model | cases uniform >= 20 |" + "".join(
        f" {label}: median / mean | 3x fewer |" for label, _ in nets
    )
    lines = [header, "| --- | ---: |" + " ---: | ---: |" * len(nets)]
    for model in [*dict.fromkeys(r["graph"] for r in shared), "all"]:
        mine = [r for r in shared if model in ("all", r["graph"])]
        hard = _long_cases(mine, args.iterations)
        cells = ""
        for _, path in nets:
            counts = [_count(_guided(r, path)["iterations"], args.iterations) for r in mine]
            cells += f" {_stats(counts)} | {_three_x_fewer(hard, path, args.iterations)} |"
        lines.append(f"| {model.removeprefix('zoo:')} | {len(hard)} |{cells}")
    notes = []
    budget_rows = [r for r in shared if "uniform_2s" in r]
    for label, path in nets:
        for budget in ("2s", "5s") if budget_rows else ():
            at_least = _at_least_as_fast(budget_rows, path, budget)
            notes.append(
                f"{label}, {budget} budget: at least as fast as the uniform search in "
                f"{at_least} of {len(budget_rows)}"
            )
    return [
        "",
        f"Checkpoints side by side on the same {len(shared)} cases (`--also`; the best known "
        "step of a case is the best of every search, these included):",
        "",
        *lines,
        "",
        *(f"- {note}" for note in notes),
    ]


def write(records: list[dict], latency_record: dict | None, args) -> None:
    def iters(r, key):
        return _count(r[key], args.iterations)

    lines = [
        "| model | cases | uniform: median / mean | GNN: median / mean | ratio of means | "
        "cases uniform >= 20 | GNN >= 3x fewer there | GNN best <= uniform best |",
        "| --- |" + " ---: |" * 7,
    ]
    all_u, all_g = [], []
    long_cases = long_wins = 0
    for model in dict.fromkeys(r["graph"] for r in records):
        mine = [r for r in records if r["graph"] == model]
        u = [iters(r, "uniform_iterations") for r in mine]
        g = [iters(r, "gnn_iterations") for r in mine]
        all_u += u
        all_g += g
        hard = _long_cases(mine, args.iterations)
        wins = _three_x_fewer(hard, None, args.iterations)
        long_cases += len(hard)
        long_wins += wins
        not_worse = sum(r["gnn_best_s"] <= r["uniform_best_s"] * 1.0001 for r in mine)
        lines.append(
            f"| {model.removeprefix('zoo:')} | {len(mine)} | {_stats(u)} | {_stats(g)} | "
            f"{statistics.fmean(u) / statistics.fmean(g):.2f} | {len(hard)} | {wins} | "
            f"{not_worse} of {len(mine)} |"
        )
    summary = [
        f"all cases: uniform median / mean {_stats(all_u)}, GNN {_stats(all_g)} iterations "
        f"to within 1% of the best known (ratio of means "
        f"{statistics.fmean(all_u) / statistics.fmean(all_g):.2f}); a search that never got "
        f"there counts as {args.iterations + 1}",
        f"cases where the uniform search needs {LONG_SEARCH_AT_LEAST} iterations or more: "
        f"{long_cases}; the GNN needs 3x fewer in {long_wins} of them",
    ]
    halves = (("TAG §5.2's generator", False), ("8-12 machines, 32-128 GPUs", True))
    for label, large in halves:  # the larger half's clusters name their machine count
        half = [r for r in records if (r["cluster"].count(":") == 2) == large]
        if half:
            u = [iters(r, "uniform_iterations") for r in half]
            g = [iters(r, "gnn_iterations") for r in half]
            summary.append(
                f"{label} ({len(half)} cases): uniform median / mean {_stats(u)}, GNN "
                f"{_stats(g)} (ratio of means {statistics.fmean(u) / statistics.fmean(g):.2f})"
            )
    budget_rows = [r for r in records if "gnn_2s" in r]
    for budget in ("2s", "5s"):
        if not budget_rows:
            break
        pairs = [(r[f"uniform_{budget}"], r[f"gnn_{budget}"]) for r in budget_rows]
        finite = [(u, g) for u, g in pairs if math.isfinite(u) and math.isfinite(g)]
        at_least = _at_least_as_fast(budget_rows, None, budget)
        gain = math.exp(statistics.fmean(math.log(u / g) for u, g in finite)) if finite else 1
        summary.append(
            f"{budget} search budget on the {len(pairs)} cases with 8+ device groups: the "
            f"GNN's plan at least as fast in {at_least} ({100 * at_least / len(pairs):.0f}%), "
            f"geometric-mean gain {gain:.3f}x"
        )
    if latency_record:
        summary.append(
            f"inference: {latency_record['ms_per_expansion']:.1f} ms per expansion on "
            f"{latency_record['groups']} op groups x {latency_record['device_groups']} device "
            f"groups ({latency_record['actions']} actions), one thread; the prior's share of "
            f"that search's time {100 * latency_record['prior_share']:.0f}%"
        )
    mean_prior_ms = statistics.fmean(r["prior_ms"] for r in records)
    summary.append(f"mean prior inference over the cases: {mean_prior_ms:.1f} ms per expansion")
    body = "\n".join(
        [
            "Each case is a zoo model on a random cluster of a seed no training run draws "
            "from (every other one 8-12 machines and 32-128 GPUs). Three searches over the "
            "same op groups, actions and simulator, as `tagplan plan` builds them: the MCTS "
            "with the uniform prior (ties in the candidate generator's order, as a plan's "
            "first tree), the same MCTS with the shipped GNN prior, and simulated annealing "
            "(`bench/search_yardstick.py`) as a yardstick outside the tree."
            + (
                " Both trees, in the budget rows too, start with the sweep of uniform "
                "strategies as a plan's first tree does (docs/design.md §7, *The sweep*)."
                if args.sweep
                else " Both trees are TAG's pure MCTS, without the sweep."
            )
            + " The best known "
            "step of a case is the best any of them found; each MCTS's figure is the "
            "iterations until its best came within 1% of it (TAG Table 7). The budget rows "
            "run each prior's search alone for 2 s and 5 s of wall clock (inference included) "
            "on the cases with 8 or more device groups and compare the search's best step "
            "(the baselines a plan also weighs are not in it).",
            "",
            f"{args.iterations} iterations per MCTS, {args.anneal} strategies for annealing, "
            f"{len(records)} cases. Cells: iterations until within 1% of the best known.",
            "",
            *lines,
            "",
            *(f"- {line}" for line in summary),
            *_side_by_side(records, args),
        ]
    )
    key, title = (
        (
            "gnn-prior-sweep",
            "What the GNN prior buys a plan's first tree (TAG Table 7 with the sweep)",
        )
        if args.sweep
        else ("gnn-prior", "What the GNN prior buys the search (TAG Table 7 on unseen clusters)")
    )
    write_section(
        key,
        title,
        f"python -m bench.gnn_prior --models ... --per-model N --iterations "
        f"{args.iterations} --anneal {args.anneal}"
        + (" --sweep" if args.sweep else "")
        + (" --budgets" if args.budgets else "")
        + (" --latency" if args.latency else "")
        + " --write",
        body,
    )


def _describe(record: dict) -> str:
    return (
        f"{record['graph']} {record['cluster']} {record['uniform_iterations']} "
        f"{record['gnn_iterations']} {record['wall_s']:.0f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--per-model", type=int, default=6)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--anneal", type=int, default=100)
    parser.add_argument("--budgets", action="store_true")
    parser.add_argument("--latency", action="store_true")
    parser.add_argument(
        "--sweep", action="store_true", help="every MCTS starts with the uniform strategies"
    )
    parser.add_argument(
        "--also",
        nargs="*",
        default=[],
        help="other checkpoints searched in the same cases, compared in a table of their own",
    )
    add_case_run_arguments(parser, "bench-gnn-prior.jsonl")
    args = parser.parse_args()
    if any(r.get("sweep", False) != args.sweep for r in records_of(args)):
        parser.error(
            f"{args.out} holds cases searched {'without' if args.sweep else 'with'} "
            "the sweep; name another --out"
        )
    cases = cases_left(args)
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [
            pool.submit(
                run_case,
                c,
                args.iterations,
                args.anneal,
                args.budgets,
                args.checkpoint,
                args.also,
                args.sweep,
            )
            for c in cases
        ]
        append_records(futures, args.out, _describe)
    latency_record = latency(args.checkpoint) if args.latency else None
    if latency_record:
        print(latency_record)
    if args.write:
        write(records_of(args), latency_record, args)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
