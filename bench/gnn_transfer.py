"""How the GNN prior transfers and what its parts are worth (TAG §5.8 Table 8, Fig. 7).

From one round of a training run (``--run``, made by ``tagplan train``; ``--round``,
default its last), networks are fitted with the run's options on that round's data:

* every training case except one model's, for each model of ``--leave-out`` (TAG Table 8:
  the model is unseen); that model is then searched on ``testbed`` and ``cloud`` with the
  network that never saw it and with the run's own checkpoint (which did), ``--iterations``
  iterations each, with the uniform prior beside them;
* every training case, without the runtime-feedback features, and without the device
  graph (TAG Fig. 7's ablation); each searches the cases of ``bench.gnn_prior`` on unseen
  clusters (``--per-model`` per model of ``--models``) beside the full network.

The fits reuse the round's data, which the previous round's network (trained on every
model, with every feature) guided: the left-out model's cases are out of the fit, but not
out of the network that searched the other cases. A clean leave-one-out reruns every
round without the model (``tagplan train --exclude MODEL``, about 40 minutes a model).

Reported: the left-out model's best step with the unseen-model network against the
all-model one (TAG Table 8's goal: within 5%), the iterations each needs to come within 1%
of the best step any of the searches found, and the validation cross-entropy of each fit.
Fitted networks are kept in ``RUN/transfer/`` and reused by a rerun.
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
from tagplan.gnn.train import (
    TrainOptions,
    cases_for,
    fit,
    held_out_cases,
    load_examples,
)

LEAVE_OUT = ["bert_small", "vgg19", "inception_v3", "wide_deep"]
DESCRIPTION = (
    "Networks fitted with the training run's options on one round's data (by default its la"
    "st): without one model's cases (TAG Table 8), that model then searched on testbed and "
    "cloud with the network that never saw it, with the run's checkpoint and with the unifo"
    "rm prior; and without the runtime feedback or without the device graph (TAG Fig. 7), e"
    "ach searching unseen-cluster cases of bench/gnn_prior.py beside the full network. The "
    "round's data were searched by the previous round's network, which saw every model: the"
    " left-out model is out of the fit but not out of the network that guided the other cas"
    "es' searches (a clean leave-one-out reruns both rounds with `tagplan train --exclude`)"
    "."
)
ABLATED = ("no-feedback", "no-device-graph")


def _options(run: Path) -> TrainOptions:
    saved = json.loads((run / "run.json").read_text())["options"]
    saved["models"] = tuple(saved["models"])
    return TrainOptions(**saved)


def fitted(
    run: Path, round_index: int, name: str, leave_out: str | None, ablation: str
) -> tuple[Path, dict]:
    """A network fitted on the round's data (cached in ``RUN/transfer``)."""
    path = run / "transfer" / f"round-{round_index}-{name}.pt"
    options = _options(run)
    options = dataclasses.replace(options, hyper={**options.hyper, "ablation": ablation})
    if not path.exists():
        cases = cases_for(options)
        kept = [c for c in cases if leave_out is None or c.graph != f"zoo:{leave_out}"]
        data = run / f"round-{round_index}" / "data"
        train_set, val_set, _ = load_examples(data, kept, held_out_cases(cases))
        model, history = fit(train_set, val_set, options)
        save_checkpoint(
            path,
            model,
            {
                "training": {"from": str(run), "leave_out": leave_out, "ablation": ablation},
                "metrics": {k: v for k, v in history[-1].items() if k.startswith("val_")},
            },
        )
    return path, json.loads(path.with_suffix(".json").read_text())["metrics"]


def _search(case: Case, checkpoint: Path | None, iterations: int, scores: dict) -> list[float]:
    prior = None if checkpoint is None else load_prior(checkpoint)
    return _trace(search_for(case, prior, scores=scores, shuffle_ties=False), iterations)


def unseen_model_rows(run: Path, round_index: int, models: list[str], iterations: int) -> list[str]:
    full = run / f"round-{round_index}" / "prior.pt"
    rows = []
    for model in models:
        without, metrics = fitted(run, round_index, f"without-{model}", model, "none")
        for cluster in ("testbed", "cloud"):
            case = Case(f"zoo:{model}", cluster, 0)
            scores: dict = {}
            traces = {
                "uniform": _search(case, None, iterations, scores),
                "all": _search(case, full, iterations, scores),
                "unseen": _search(case, without, iterations, scores),
            }
            known = min(min(t) for t in traces.values())
            to_1pct = {k: _first_within(t, known * WITHIN) for k, t in traces.items()}
            gap = min(traces["unseen"]) / min(traces["all"]) - 1
            rows.append(
                f"| {model} | {cluster} | {1e3 * min(traces['all']):.1f} | "
                f"{1e3 * min(traces['unseen']):.1f} | {100 * gap:+.1f}% | "
                f"{to_1pct['uniform'] or 'never'} | {to_1pct['all'] or 'never'} | "
                f"{to_1pct['unseen'] or 'never'} | {metrics['val_cross_entropy']:.3f} |"
            )
            print(rows[-1], flush=True)
    return rows


def ablation_rows(
    run: Path, round_index: int, models: list[str], per_model: int, iterations: int
) -> list[str]:
    variants = {"full": (run / f"round-{round_index}" / "prior.pt", None)}
    for ablation in ABLATED:
        variants[ablation] = fitted(run, round_index, ablation, None, ablation)
    counts: dict[str, list[int]] = {name: [] for name in variants}
    best: dict[str, list[float]] = {name: [] for name in variants}
    for case in eval_cases(models, per_model, 0):
        scores: dict = {}
        traces = {
            name: _search(case, path, iterations, scores) for name, (path, _) in variants.items()
        }
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--round", type=int, default=None, help="default: the run's last")
    parser.add_argument("--leave-out", nargs="*", default=LEAVE_OUT)
    parser.add_argument("--models", nargs="*", default=["vgg19", "wide_deep", "bert_small"])
    parser.add_argument("--per-model", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=150)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    round_index = _options(args.run).rounds - 1 if args.round is None else args.round
    unseen = unseen_model_rows(args.run, round_index, args.leave_out, args.iterations)
    ablated = ablation_rows(args.run, round_index, args.models, args.per_model, args.iterations)
    if not args.write:
        return
    body = "\n".join(
        [
            DESCRIPTION,
            "",
            f"**Unseen models** ({args.iterations} iterations per search; steps in ms; "
            "iterations until within 1% of the best any search found):",
            "",
            "| model | cluster | all-model GNN | GNN without the model | gap | uniform to 1% | "
            "all-model to 1% | unseen to 1% | validation CE of the fit |",
            "| --- | --- |" + " ---: |" * 7,
            *unseen,
            "",
            f"**Ablation** ({len(args.models) * args.per_model} unseen-cluster cases of "
            f"{', '.join(args.models)}):",
            "",
            "| network | iterations to 1%: median | mean | best / best known (geomean) | "
            "validation CE | top-1 agreement |",
            "| --- |" + " ---: |" * 5,
            *ablated,
        ]
    )
    write_section(
        "gnn-transfer",
        "GNN prior on unseen models, and ablations (TAG Table 8, Fig. 7)",
        f"python -m bench.gnn_transfer --run RUN --round {round_index} --leave-out "
        f"{' '.join(args.leave_out)} --models {' '.join(args.models)} --per-model "
        f"{args.per_model} --iterations {args.iterations} --write",
        body,
    )


if __name__ == "__main__":
    main()
