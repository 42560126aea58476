"""What the GNN's layout head buys the search where pipelines are in its tree: the shipped
checkpoint (network + layout head) against its network alone, whose layout vertices take
the layouts' own prior (their compute bounds), on clusters no training run draws from.

Each case is searched twice for ``--iterations`` iterations, as ``tagplan plan`` builds
the search with its layouts (:func:`tagplan.gnn.dataset.search_for`: bounded by the
reference step, simulation costs as their fixed ratio, so both searches are
deterministic): the op groups' decisions get the same network in both; only the root's
choice between TAG's decisions and the layouts, and the choices below a layout, differ.
Per case: the best step each reached, the iterations until within 1% of the better of
the two, the pipelines each simulated and their estimated share of the search's
simulation time (what the pipelines cost it), and whether its best is a pipeline.

Cases: the zoo models on unseen random clusters (:func:`bench.gnn_prior.eval_cases`:
every other one 8-12 machines), and the pipeline benchmark's allocations where pipelines
matter (links between machines at a tenth of their drawn rate; VGG19 on four 3.8 GiB
GPUs, where nothing fits without a pipeline).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from importlib import resources
from pathlib import Path

import numpy as np
import torch

from bench.gnn_prior import WITHIN, _first_within, eval_cases
from bench.pipeline import TIGHT, _slow_random
from bench.report import add_case_run_arguments, records_done, write_section
from tagplan.gnn import load_prior, shipped_record
from tagplan.gnn.dataset import Case, search_for
from tagplan.gnn.train_layouts import without_layout_head
from tagplan.planner.search.layout_branches import is_pipelined_key
from tagplan.planner.search.mcts import SearchProgress, StrategySearch

_LAYOUT_RUN = ("checkpoints", "prior-layout-run.json")
MODELS = ["vgg19", "resnet101", "inception_v3", "transformer", "bert_small", "bert_large"]


def pipeline_cases() -> list[tuple[str, Case]]:
    """The pipeline benchmark's allocations where pipelines matter, with their labels."""
    return [
        ("VGG19, four 3.8 GiB GPUs", Case("zoo:vgg19", json.dumps(TIGHT), 0)),
        *(
            (
                f"{model}, random 4 machines (seed {seed}), links / 10",
                Case(f"zoo:{model}", json.dumps(_slow_random(seed, 4)), seed),
            )
            for model in ("transformer", "bert_large", "resnet101")
            for seed in (0, 3)
        ),
    ]


def _searched(case: Case, prior, iterations: int) -> tuple[StrategySearch, list[float]]:
    search = search_for(case, prior, shuffle_ties=False, layouts=True)
    trace: list[float] = []

    def watch(p: SearchProgress) -> None:
        trace.append(math.inf if p.best_step_time_s is None else p.best_step_time_s)

    search.run(iterations=iterations, progress=watch)
    return search, trace


def _pipelines(search: StrategySearch) -> tuple[int, float]:
    """Pipelines simulated and their estimated share of the simulation time."""
    layouts = search.layouts
    if layouts is None:
        return 0, 0.0
    costs = {key: layouts.cost_s(key) for key in search._scores}
    piped = [key for key in costs if is_pipelined_key(key)]
    total = sum(costs.values())
    return len(piped), sum(costs[k] for k in piped) / total if total else 0.0


def run_case(label: str, case: Case, iterations: int, checkpoint: str | None) -> dict:
    torch.set_num_threads(1)
    head = load_prior(checkpoint)
    base = type(head)(without_layout_head(head.model), name="network alone")
    started = time.perf_counter()
    record: dict = {"label": label, "graph": case.graph}
    searches = {}
    for name, prior in (("own", base), ("head", head)):
        search, trace = _searched(case, prior, iterations)
        searches[name] = (search, trace)
        count, share = _pipelines(search)
        fitting = [k for k, scored in search._scores.items() if not scored.oom]
        best_key = min(fitting, key=lambda k: search._scores[k].step_time_s, default=None)
        record[f"{name}_best_s"] = min(trace)
        record[f"{name}_pipelines"] = count
        record[f"{name}_pipeline_share"] = share
        record[f"{name}_pipelined"] = best_key is not None and is_pipelined_key(best_key)
    search = searches["own"][0]
    record["layouts"] = 0 if search.layouts is None else len(search.layouts)
    record["gpus"] = search.space.cluster.num_devices
    record["reference_s"] = search.reference_step_s
    known = min(record["own_best_s"], record["head_best_s"])
    for name, (_, trace) in searches.items():
        record[f"{name}_iterations"] = _first_within(trace, known * WITHIN)
    record["wall_s"] = time.perf_counter() - started
    return record


def _ms(seconds: float) -> str:
    return "OOM" if not math.isfinite(seconds) else f"{seconds * 1e3:,.1f}"


def write(records: list[dict], args) -> None:
    def iters(r: dict, key: str) -> int:
        return r[key] if r[key] is not None else args.iterations + 1

    rows = [r for r in records if r["layouts"]]
    lines = [
        "| case | layouts | best, own prior (ms) | best, head (ms) | iterations to 1%: own / "
        "head | pipelines simulated: own / head | their share of simulation: own / head | "
        "best is a pipeline: own / head |",
        "| --- |" + " ---: |" * 7,
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['layouts']} | {_ms(r['own_best_s'])} | {_ms(r['head_best_s'])}"
            f" | {iters(r, 'own_iterations')} / {iters(r, 'head_iterations')} | "
            f"{r['own_pipelines']} / {r['head_pipelines']} | "
            f"{100 * r['own_pipeline_share']:.0f}% / {100 * r['head_pipeline_share']:.0f}% | "
            f"{'yes' if r['own_pipelined'] else 'no'} / {'yes' if r['head_pipelined'] else 'no'} |"
        )
    finite = [r for r in rows if math.isfinite(r["own_best_s"]) and math.isfinite(r["head_best_s"])]
    gain = math.exp(statistics.fmean(math.log(r["own_best_s"] / r["head_best_s"]) for r in finite))
    summary = [
        f"{len(rows)} cases with layouts in the tree ({len(records) - len(rows)} more had "
        "none: one unit, or every layout bounded at or above the reference step)",
        f"best step: the head's at least as fast in "
        f"{sum(r['head_best_s'] <= r['own_best_s'] * 1.0001 for r in rows)} of {len(rows)}, "
        f"geometric-mean gain {gain:.3f}x",
        "iterations to within 1% of the better best, median own / head: "
        f"{statistics.median(iters(r, 'own_iterations') for r in rows)} / "
        f"{statistics.median(iters(r, 'head_iterations') for r in rows)} (a search that never "
        f"got there counts as {args.iterations + 1})",
        "pipelines' share of the simulation time, mean own / head: "
        f"{100 * statistics.fmean(r['own_pipeline_share'] for r in rows):.0f}% / "
        f"{100 * statistics.fmean(r['head_pipeline_share'] for r in rows):.0f}%",
    ]
    record = shipped_record() if args.checkpoint is None else {}
    if "layout_training" in record:
        training, fit = record["layout_training"], record["layout_metrics"]
        summary.append(
            f"the head: trained in {training['options']['rounds']} rounds on "
            f"{training['train_examples']} layout vertices ({training['validation_examples']} "
            f"held out: cross-entropy {fit['val_cross_entropy']:.3f} against the layouts' own "
            f"prior's {fit['val_own_prior_cross_entropy']:.3f} and the uniform prior's "
            f"{fit['val_uniform_cross_entropy']:.3f}; its favourite is the most visited "
            f"candidate in {100 * fit['val_top1_agreement']:.0f}% of them, the own prior's in "
            f"{100 * fit['val_own_prior_top1_agreement']:.0f}%)"
        )
    run_record = Path(str(resources.files("tagplan.gnn").joinpath(*_LAYOUT_RUN)))
    if args.checkpoint is None and run_record.exists():
        rounds = json.loads(run_record.read_text())["rounds"]
        summary.append(
            "the head's training run (`prior-layout-run.json` beside the checkpoint): "
            + "; ".join(
                f"round {r['round']} generated in {r['generate_s'] / 60:.0f} min, fitted in "
                f"{r['fit_s']:.0f} s"
                for r in rounds
            )
            + " on two cores"
        )
    body = "\n".join(
        [
            "Each case is searched twice, as `tagplan plan` builds the search with its "
            "layouts (`tagplan.gnn.dataset.search_for`: layouts bounded by the reference "
            "step, simulation costs as their fixed ratio, so both searches are "
            "deterministic): with the shipped checkpoint (network and layout head), and with "
            "its network alone, whose layout vertices take the layouts' own prior (their "
            "compute bounds). The op groups' decisions get the same network in both. Per "
            "case: the best step each reached, the iterations until within 1% of the better "
            "of the two, the pipelines each simulated and their estimated share of the "
            "search's simulation time (a pipeline's per-GPU simulation against an evaluation "
            "by class: what the pipelines cost the search), and whether its best plan that "
            "fits is a pipeline. Cases: the zoo models on random clusters of seeds no "
            "training run draws from (every other one 8-12 machines), and the pipeline "
            "benchmark's allocations where pipelines matter (links between machines at a "
            "tenth of their drawn rate; VGG19 on four 3.8 GiB GPUs, where nothing fits "
            "without a pipeline).",
            "",
            f"{args.iterations} iterations per search, {len(records)} cases.",
            "",
            *lines,
            "",
            *(f"- {line}" for line in summary),
        ]
    )
    write_section(
        "layout-prior",
        "The GNN's layout head: pipelines in the search",
        f"python -m bench.layout_prior --per-model {args.per_model} --iterations "
        f"{args.iterations} --write",
        body,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--per-model", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=150)
    add_case_run_arguments(parser, "bench-layout-prior.jsonl")
    args = parser.parse_args()
    done = records_done(args.out, lambda r: r["label"])
    cases = [
        (f"{c.graph.removeprefix('zoo:')}, {c.cluster}", c)
        for c in eval_cases(args.models, args.per_model, args.seed)
    ] + pipeline_cases()
    todo = [(label, c) for label, c in cases if label not in done]
    with ProcessPoolExecutor(args.workers) as pool:
        futures = [
            pool.submit(run_case, label, c, args.iterations, args.checkpoint) for label, c in todo
        ]
        for future in futures:
            record = future.result()
            with args.out.open("a") as out:
                out.write(json.dumps(record) + "\n")
            print(
                record["label"],
                _ms(record["own_best_s"]),
                _ms(record["head_best_s"]),
                record["own_pipelines"],
                record["head_pipelines"],
                f"{record['wall_s']:.0f} s",
                flush=True,
            )
            done[record["label"]] = record
    if args.write:
        write([done[label] for label, _ in cases if label in done], args)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
