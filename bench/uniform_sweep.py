"""The sweep of uniform strategies (docs/design.md §7, *The sweep*) against the tree
without it, on clusters of seeds no training run draws from.

For each case (a zoo model on an unseen random cluster: the cases of
``bench.gnn_prior``, half TAG §5.2's generator, half 8-12 machines and 32-128 GPUs), four
searches over the same op groups, actions and simulator, ``--iterations`` each: the tree
with the uniform prior and with the shipped GNN prior, each without and with the sweep
(a plan's first tree sweeps). Searches of one case share their simulations, which
changes no iteration count. The best known step of a case is the best any of the four
found; each search's figures are its best step and the iterations until it came within
1% of the best known.

Cases run in ``--workers`` processes and are appended to ``--out`` as JSON lines, so a
run resumes; ``--write`` turns every line of the file into the BENCHMARKS.md section.
"""

from __future__ import annotations

import argparse
import math
import statistics
from concurrent.futures import ProcessPoolExecutor

import torch

from bench.gnn_prior import MODELS, WITHIN, _count, _first_within, cases_left, records_of
from bench.report import add_case_run_arguments, append_records, write_section
from tagplan.gnn import load_prior
from tagplan.gnn.dataset import Case, search_for
from tagplan.planner.search.mcts import SearchProgress

SEARCHES = ("uniform", "uniform+sweep", "gnn", "gnn+sweep")


def run_case(case: Case, iterations: int, checkpoint: str | None) -> dict:
    torch.set_num_threads(1)
    gnn = load_prior(checkpoint)
    scores: dict = {}  # the case's simulations, shared by its searches
    traces: dict[str, list[float]] = {}
    record: dict = {"graph": case.graph, "cluster": case.cluster}
    for name in SEARCHES:
        search = search_for(
            case,
            gnn if name.startswith("gnn") else None,
            scores=scores,
            shuffle_ties=False,
            sweep=name.endswith("+sweep"),
        )
        best: list[float] = []

        def watch(p: SearchProgress, best: list[float] = best) -> None:
            best.append(math.inf if p.best_step_time_s is None else p.best_step_time_s)

        outcome = search.run(iterations=iterations, progress=watch)
        traces[name] = best
        record[name] = {"best_s": min(best), "swept": outcome.swept}
    record.update(  # the four searches share their op groups and actions
        groups=search.grouping.num_groups,
        device_groups=search.space.cluster.num_groups,
        gpus=search.space.cluster.num_devices,
        actions=len(search.space),
    )
    known = min(min(trace) for trace in traces.values())
    record["known_s"] = known
    for name, trace in traces.items():
        record[name]["iterations"] = _first_within(trace, known * WITHIN)
    return record


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))


def write(records: list[dict], args) -> None:
    lines = [
        "| prior | cluster half | cases | best step with / without the sweep (geomean) "
        "| faster with | slower with | iterations to 1% without: median / mean "
        "| with: median / mean | without >= 20 | 3x fewer with | swept (median) |",
        "| --- | --- |" + " ---: |" * 9,
    ]
    halves = (("TAG §5.2's generator", False), ("8-12 machines, 32-128 GPUs", True))
    for prior in ("uniform", "gnn"):
        for label, large in (*halves, ("all", None)):
            rows = [r for r in records if large is None or (r["cluster"].count(":") == 2) == large]
            plain, swept = [r[prior] for r in rows], [r[f"{prior}+sweep"] for r in rows]
            fits = [(a, b) for a, b in zip(plain, swept, strict=True) if math.isfinite(a["best_s"])]
            ratio = _geomean([b["best_s"] / a["best_s"] for a, b in fits])
            faster = sum(b["best_s"] < a["best_s"] * 0.999 for a, b in fits)
            slower = sum(b["best_s"] > a["best_s"] * 1.001 for a, b in fits)
            without = [_count(a["iterations"], args.iterations) for a in plain]
            with_ = [_count(b["iterations"], args.iterations) for b in swept]
            long = [(a, b) for a, b in zip(without, with_, strict=True) if a >= 20]
            lines.append(
                f"| {prior} | {label} | {len(rows)} | {ratio:.3f} | {faster} | {slower} | "
                f"{statistics.median(without):.0f} / {statistics.fmean(without):.1f} | "
                f"{statistics.median(with_):.0f} / {statistics.fmean(with_):.1f} | "
                f"{len(long)} | {sum(3 * b <= a for a, b in long)} | "
                f"{statistics.median(b['swept'] for b in swept):.0f} |"
            )

    def change(r: dict) -> float:
        return r["gnn+sweep"]["best_s"] / r["gnn"]["best_s"]

    gnn_over = _geomean([r["gnn+sweep"]["best_s"] / r["uniform+sweep"]["best_s"] for r in records])
    moved = sorted((r for r in records if abs(change(r) - 1) > 1e-3), key=change)
    notes = [
        "GNN prior, every case whose best step moved by more than 0.1%: "
        + ", ".join(_case_note(r, "gnn") for r in moved),
        f"the GNN search against the uniform one, both with the sweep: best step {gnn_over:.3f}"
        " (geomean)",
    ]
    body = "\n".join(
        [
            "Each case is a zoo model on a random cluster of a seed no training run draws "
            "from (`bench.gnn_prior`'s cases: every other one 8-12 machines and 32-128 "
            "GPUs). Four searches of the same op groups, actions and simulator, as "
            "`tagplan plan` builds them: the tree with the uniform prior and with the "
            "shipped GNN prior, each without and with the sweep of uniform strategies "
            "(docs/design.md §7, *The sweep*: a plan's first tree sweeps). The best known "
            "step of a case is the best of the four; *iterations to 1%*: until a search's "
            "best came within 1% of it (a search that never got there counts one past the "
            "budget); *without >= 20*: cases where the search without the sweep needs 20 "
            "iterations or more (Table 7's long cases), *3x fewer with*: those where the "
            "sweep needs a third of them or fewer; *swept*: the iterations the sweep chose. "
            "The sweep's bounds are not iterations; what they cost a plan is in *Plan "
            "latency*.",
            "",
            f"{args.iterations} iterations per search, {len(records)} cases.",
            "",
            *lines,
            "",
            *(f"- {note}" for note in notes),
        ]
    )
    write_section(
        "uniform-sweep",
        "The sweep of uniform strategies",
        f"python -m bench.uniform_sweep --models {' '.join(args.models)} --per-model "
        f"{args.per_model} --iterations {args.iterations} --seed {args.seed} --write",
        body,
    )


def _case_note(record: dict, prior: str) -> str:
    before, after = record[prior]["best_s"], record[f"{prior}+sweep"]["best_s"]
    return (
        f"{record['graph'].removeprefix('zoo:')} on `{record['cluster']}` "
        f"{1e3 * before:.1f} -> {1e3 * after:.1f} ms ({100 * (after / before - 1):+.1f}%)"
    )


def _describe(record: dict) -> str:
    steps = " ".join(f"{name} {1e3 * record[name]['best_s']:.1f}" for name in SEARCHES)
    return f"{record['graph']} {record['cluster']} {steps}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--per-model", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=150)
    add_case_run_arguments(parser, "bench-uniform-sweep.jsonl")
    args = parser.parse_args()
    cases = cases_left(args)
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [pool.submit(run_case, c, args.iterations, args.checkpoint) for c in cases]
        append_records(futures, args.out, _describe)
    if args.write:
        write(records_of(args), args)


if __name__ == "__main__":
    main()
