"""How the GNN prior transfers to a model it never saw, and what its parts are worth
(TAG §5.8 Table 8, Fig. 7).

*Unseen models* (``--without RUN ...``): each RUN is a training run of
``tagplan train --exclude MODEL``, every round generated and fitted without MODEL's cases,
every other case the all-model run's. MODEL is then searched on ``testbed`` and ``cloud``
(TAG Table 8) and on ``--clusters`` unseen clusters of :mod:`bench.gnn_prior` (the first
of Table 7's) with the run's last network, with the all-model checkpoint (``--all-model``,
by default the shipped one) and with the uniform prior, ``--iterations`` iterations each.
Reported: each network's best step, the gap between the two (TAG Table 8's goal: within
5%), and the iterations each search needs to come within 1% of the best any of them found.

*Ablation* (``--ablation-run RUN``): networks fitted with the run's options on one of its
rounds' data (``--round``, by default its last) without the runtime-feedback features and
without the device graph (TAG Fig. 7) search unseen-cluster cases (``--per-model`` per
model of ``--models``) beside the run's own network. Fitted networks are kept in
``RUN/transfer/`` and reused by a rerun.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from pathlib import Path

import torch

from bench.gnn_prior import WITHIN, _first_within, _trace, eval_cases
from bench.report import write_section
from tagplan.gnn import load_prior
from tagplan.gnn.checkpoint import save_checkpoint
from tagplan.gnn.dataset import Case, search_for
from tagplan.gnn.train import TrainOptions, cases_for, fit, held_out_cases, load_examples
from tagplan.planner.search.prior import Prior

UNSEEN_DESCRIPTION = (
    "Each model's network comes from a training run without it (`tagplan train --exclude M"
    "ODEL`): both rounds generated and fitted without the model's cases, every other case "
    "the shipped run's. The model is then searched on testbed and cloud (TAG Table 8) and "
    "on the first unseen clusters of the Table 7 benchmark with that network, with the sh"
    "ipped all-model checkpoint and with the uniform prior. *Gap*: the unseen-model networ"
    "k's best step over the all-model one's, minus one (TAG Table 8's goal: within 5%)."
)
ABLATION_DESCRIPTION = (
    "Networks fitted with the training run's options on one round's data without the runt"
    "ime feedback or without the device graph (TAG Fig. 7), each searching unseen-cluster "
    "cases of bench/gnn_prior.py beside the run's own network."
)
ABLATED = ("no-feedback", "no-device-graph")
TABLE8_CLUSTERS = ("testbed", "cloud")


def _options(run: Path) -> TrainOptions:
    return TrainOptions.from_json(json.loads((run / "run.json").read_text())["options"])


def _last_checkpoint(run: Path) -> Path:
    return run / f"round-{_options(run).rounds - 1}" / "prior.pt"


def fitted(run: Path, round_index: int, ablation: str) -> tuple[Path, dict]:
    """A network fitted on the round's data without a part (cached in ``RUN/transfer``)."""
    path = run / "transfer" / f"round-{round_index}-{ablation}.pt"
    options = _options(run)
    options = dataclasses.replace(options, hyper={**options.hyper, "ablation": ablation})
    if not path.exists():
        cases = cases_for(options)
        data = run / f"round-{round_index}" / "data"
        train_set, val_set, _ = load_examples(data, cases, held_out_cases(options))
        model, history = fit(train_set, val_set, options)
        save_checkpoint(
            path,
            model,
            {
                "training": {"from": str(run), "ablation": ablation},
                "metrics": {k: v for k, v in history[-1].items() if k.startswith("val_")},
            },
        )
    return path, json.loads(path.with_suffix(".json").read_text())["metrics"]


def _search(case: Case, prior: Prior | None, iterations: int, scores: dict) -> list[float]:
    return _trace(search_for(case, prior, scores=scores, shuffle_ties=False), iterations)


def _left_out_model(run: Path) -> str:
    excluded = _options(run).exclude
    if len(excluded) != 1:
        raise SystemExit(f"{run} must leave out exactly one model (tagplan train --exclude)")
    return excluded[0]


def unseen_model_rows(
    runs: list[Path], all_model: Path | None, clusters: int, iterations: int
) -> tuple[list[str], list[dict]]:
    """Table 8's rows, and per case: whether its cluster is a named one, the gap
    (unseen-model best step over all-model's, minus one) and each search's iterations to
    within 1% (``iterations + 1`` for never)."""
    rows, records = [], []
    priors: dict[str, Prior | None] = {"uniform": None, "all": load_prior(all_model)}
    for run in runs:
        model = _left_out_model(run)
        without = _last_checkpoint(run)
        metrics = json.loads(without.with_suffix(".json").read_text())["metrics"]
        priors["unseen"] = load_prior(without)
        cases = [Case(f"zoo:{model}", c, 0) for c in TABLE8_CLUSTERS]
        for case in cases + eval_cases([model], clusters, 2):
            scores: dict = {}
            traces = {k: _search(case, p, iterations, scores) for k, p in priors.items()}
            known = min(min(t) for t in traces.values())
            to_1pct = {k: _first_within(t, known * WITHIN) for k, t in traces.items()}
            gap = min(traces["unseen"]) / min(traces["all"]) - 1
            records.append(
                {
                    "named": case.cluster in TABLE8_CLUSTERS,
                    "gap": gap,
                    "to_1pct": {k: v or iterations + 1 for k, v in to_1pct.items()},
                }
            )
            rows.append(
                f"| {model} | {case.cluster} | {1e3 * min(traces['all']):.1f} | "
                f"{1e3 * min(traces['unseen']):.1f} | {100 * gap:+.1f}% | "
                f"{to_1pct['uniform'] or 'never'} | {to_1pct['all'] or 'never'} | "
                f"{to_1pct['unseen'] or 'never'} | {metrics['val_cross_entropy']:.3f} |"
            )
            print(rows[-1], flush=True)
    return rows, records


def unseen_summary(records: list[dict], iterations: int) -> list[str]:
    """The lines under Table 8: how often the unseen-model network is within 5%, and the
    iterations each prior needs."""
    gaps = [r["gap"] for r in records]
    named = [r["gap"] for r in records if r["named"]]
    geomean = math.exp(statistics.fmean(math.log1p(g) for g in gaps)) - 1
    counts = {k: [r["to_1pct"][k] for r in records] for k in ("uniform", "all", "unseen")}
    return [
        f"- the unseen-model network's plan at most 5% slower than the all-model one's in "
        f"{sum(g <= 0.05 for g in gaps)} of {len(gaps)} cases (testbed and cloud: "
        f"{sum(g <= 0.05 for g in named)} of {len(named)}); worst {100 * max(gaps):+.1f}%, "
        f"best {100 * min(gaps):+.1f}%, geometric mean {100 * geomean:+.2f}%",
        "- iterations to within 1%, median / mean (never counts as "
        f"{iterations + 1}): "
        + ", ".join(
            f"{name} {statistics.median(counts[k]):.0f} / {statistics.fmean(counts[k]):.1f}"
            for k, name in (("uniform", "uniform"), ("all", "all-model"), ("unseen", "unseen"))
        ),
    ]


def ablation_rows(
    run: Path, round_index: int, models: list[str], per_model: int, iterations: int
) -> list[str]:
    variants = {"full": (run / f"round-{round_index}" / "prior.pt", None)}
    for ablation in ABLATED:
        variants[ablation] = fitted(run, round_index, ablation)
    priors = {name: load_prior(path) for name, (path, _) in variants.items()}
    counts: dict[str, list[int]] = {name: [] for name in variants}
    best: dict[str, list[float]] = {name: [] for name in variants}
    for case in eval_cases(models, per_model, 0):
        scores: dict = {}
        traces = {name: _search(case, prior, iterations, scores) for name, prior in priors.items()}
        known = min(min(t) for t in traces.values())
        for name, trace in traces.items():
            counts[name].append(_first_within(trace, known * WITHIN) or iterations + 1)
            best[name].append(min(trace) / known)
        print(case, {n: c[-1] for n, c in counts.items()}, flush=True)
    rows = []
    for name, (path, metrics) in variants.items():
        if metrics is None:
            metrics = json.loads(path.with_suffix(".json").read_text())["metrics"]
        geo = math.exp(statistics.fmean(math.log(b) for b in best[name]))
        rows.append(
            f"| {name} | {statistics.median(counts[name]):.0f} | "
            f"{statistics.fmean(counts[name]):.1f} | {geo:.3f} | "
            f"{metrics['val_cross_entropy']:.3f} | {metrics['val_top1_agreement']:.2f} |"
        )
        print(rows[-1], flush=True)
    return rows


def _write_unseen(args: argparse.Namespace, rows: list[str], records: list[dict]) -> None:
    runs = " ".join(f"runs/without-{_left_out_model(run)}" for run in args.without)
    body = [
        UNSEEN_DESCRIPTION,
        "",
        f"{args.iterations} iterations per search, {args.clusters} unseen clusters per model "
        "beside testbed and cloud; steps in ms; cells *to 1%*: iterations until within 1% "
        "of the best any of the three searches found.",
        "",
        "| model | cluster | all-model GNN | GNN without the model | gap | uniform to 1% | "
        "all-model to 1% | unseen to 1% | validation CE of the run |",
        "| --- | --- |" + " ---: |" * 7,
        *rows,
        "",
        *unseen_summary(records, args.iterations),
    ]
    write_section(
        "gnn-transfer",
        "GNN prior on unseen models (TAG Table 8)",
        "tagplan train --out runs/without-MODEL --exclude MODEL for each model; python -m "
        f"bench.gnn_transfer --without {runs} --clusters {args.clusters} "
        f"--iterations {args.iterations} --write",
        "\n".join(body),
    )


def _write_ablation(args: argparse.Namespace, round_index: int, rows: list[str]) -> None:
    body = [
        ABLATION_DESCRIPTION,
        "",
        f"{len(args.models) * args.per_model} unseen-cluster cases of "
        f"{', '.join(args.models)}, {args.iterations} iterations per search:",
        "",
        "| network | iterations to 1%: median | mean | best / best known (geomean) | "
        "validation CE | top-1 agreement |",
        "| --- |" + " ---: |" * 5,
        *rows,
    ]
    write_section(
        "gnn-ablation",
        "GNN prior without its parts (TAG Fig. 7)",
        f"python -m bench.gnn_transfer --ablation-run RUN --round {round_index} --models "
        f"{' '.join(args.models)} --per-model {args.per_model} --iterations "
        f"{args.iterations} --write",
        "\n".join(body),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--without", type=Path, nargs="*", default=[], help="leave-out runs")
    parser.add_argument("--all-model", type=Path, help="default: the shipped checkpoint")
    parser.add_argument("--clusters", type=int, default=6, help="unseen clusters per model")
    parser.add_argument("--ablation-run", type=Path)
    parser.add_argument("--round", type=int, default=None, help="default: the run's last")
    parser.add_argument("--models", nargs="*", default=["vgg19", "wide_deep", "bert_small"])
    parser.add_argument("--per-model", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.without:
        rows, records = unseen_model_rows(
            args.without, args.all_model, args.clusters, args.iterations
        )
        if args.write:
            _write_unseen(args, rows, records)
    if args.ablation_run:
        run = args.ablation_run
        round_index = _options(run).rounds - 1 if args.round is None else args.round
        rows = ablation_rows(run, round_index, args.models, args.per_model, args.iterations)
        if args.write:
            _write_ablation(args, round_index, rows)


if __name__ == "__main__":
    main()
