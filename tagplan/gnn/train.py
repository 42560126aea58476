"""Training the prior AlphaZero-style (TAG §4.2.2; GDP §3.3's pre-training over a batch
of graphs): rounds of *generate* (search every training case with the current prior and
keep the visit distributions, :mod:`~.dataset`) and *fit* (cross-entropy between the
network's prior and those distributions, over the candidate actions).

The cases are the zoo's training graphs on TAG §5.2's random clusters (and larger ones
with 4-8 machines by default), with ``testbed`` and ``cloud``, all from seeds in
:data:`TRAIN_SEEDS`; evaluation uses other seeds (:data:`EVAL_SEEDS`), so a benchmark
never plans on a cluster the network was trained on. A case's cluster is fixed by its
seed; every tenth case, counting from the last, is held out to validate the fit.

Everything is deterministic for a seed: the cases, each case's search (an iteration
budget), the split, the initial weights and the order of the batches. A run lives in one
directory — ``round-K/data/*.npz`` (one file per case), ``round-K/train_state.pt``
(weights, optimizer and epoch, written after every epoch), ``round-K/prior.pt`` and
``run.json`` (options, cases, per-round metrics) — and a rerun with the same options
resumes where it stopped.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tagplan.gnn import load_prior
from tagplan.gnn.checkpoint import save_checkpoint
from tagplan.gnn.dataset import Case, Example, case_file, generate_case, load_case, save_case
from tagplan.gnn.features import ablate
from tagplan.gnn.model import DEFAULT_HYPER, PriorNet
from tagplan.gnn.tensors import batch_tensors, to_tensors
from tagplan.planner.errors import InvalidInput

__all__ = [
    "EVAL_SEEDS",
    "TRAIN_MODELS",
    "TRAIN_SEEDS",
    "TrainOptions",
    "cases_for",
    "check_options",
    "evaluate_fit",
    "fit",
    "generate_cases",
    "held_out_cases",
    "load_examples",
    "open_run",
    "train",
]

TRAIN_MODELS = (
    "vgg19",
    "inception_v3",
    "resnet101",
    "transformer",
    "bert_small",
    "wide_deep",
    "gnmt_small",
    "small_cnn",
    "mlp",
    "tiny_lstm",
)
"""Zoo graphs the shipped checkpoint trains on (bert_large, the largest, is left for the
unseen-model benchmark, as is any graph a user brings)."""
TRAIN_SEEDS = range(10_000, 20_000)
EVAL_SEEDS = range(50_000, 60_000)
_HELD_OUT_EVERY = 10


@dataclass(frozen=True)
class TrainOptions:
    """How a run generates data and fits (the defaults made the shipped checkpoint)."""

    models: tuple[str, ...] = TRAIN_MODELS
    exclude: tuple[str, ...] = ()
    """Models whose cases are drawn but not generated nor fitted (TAG Table 8's unseen
    model): every other case, and the validation split, stay those of the run without it."""
    clusters_per_model: int = 8
    larger_machines: tuple[int, int] = (4, 8)
    """Machines of every third case's cluster, a larger allocation than TAG's generator
    draws (the range, both ends included)."""
    seed: int = 0
    rounds: int = 2
    iterations: int = 150
    min_visits: int = 6
    epochs: int = 40
    batch_size: int = 32
    learning_rate: float = 2e-3
    weight_decay: float = 1e-5
    workers: int = 2
    hyper: dict = field(default_factory=lambda: dict(DEFAULT_HYPER))

    @classmethod
    def from_json(cls, saved: dict) -> TrainOptions:
        """The options a run's record holds (JSON lists back to tuples; an option an
        earlier record lacks takes its default)."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()})


def _cluster_for(seed: int, index: int, machines: tuple[int, int]) -> str:
    """The cluster of a training case: TAG's generator, a larger allocation with
    ``machines`` machines every third case, and the named testbed and cloud for the first
    two."""
    if index == 0:
        return "testbed"
    if index == 1:
        return "cloud"
    if index % 3 == 0:
        low, high = machines
        return f"random:{seed}:{low + seed % (high - low + 1)}"
    return f"random:{seed}"


def cases_for(options: TrainOptions, *, with_excluded: bool = False) -> list[Case]:
    """The training cases of a run: for every model, ``clusters_per_model`` clusters with
    seeds drawn from :data:`TRAIN_SEEDS` by ``options.seed``; an excluded model's are
    drawn too (so the others' stay the same) and dropped unless ``with_excluded``."""
    rng = random.Random(options.seed)
    cases = []
    for model in options.models:
        for index in range(options.clusters_per_model):
            seed = rng.randrange(TRAIN_SEEDS.start, TRAIN_SEEDS.stop)
            if model in options.exclude and not with_excluded:
                continue
            graph = model if ":" in model or "/" in model else f"zoo:{model}"
            cases.append(Case(graph, _cluster_for(seed, index, options.larger_machines), seed))
    return cases


Generate = Callable[..., tuple[Any, dict]]  # (case, prior, iterations=, min_visits=)
Save = Callable[[Path, Any, dict], None]  # (path, data, summary)


def _generate_one(
    generate: Generate,
    save: Save,
    case: Case,
    checkpoint: str | None,
    iterations: int,
    min_visits: int,
    out: str,
) -> dict:
    """Worker process: one case with the prior of ``checkpoint`` (None: uniform)."""
    prior = None if checkpoint is None else load_prior(checkpoint)
    data, summary = generate(case, prior, iterations=iterations, min_visits=min_visits)
    save(Path(out), data, summary)
    return summary


def generate_cases(
    cases: Sequence[Case],
    data_dir: Path,
    checkpoint: Path | None,
    options: TrainOptions,
    progress: Callable[[str, int, int], None],
    generate: Generate = generate_case,
    save: Save = save_case,
) -> None:
    """Search every case without a data file in ``data_dir`` yet with the prior of
    ``checkpoint`` (``generate``: module-level functions, as they run in other
    processes) and ``save`` what it gives, ``options.workers`` processes at a time."""
    todo = [c for c in cases if not case_file(data_dir, c).exists()]
    done = len(cases) - len(todo)
    progress("generate", done, len(cases))
    args = [
        (
            generate,
            save,
            c,
            None if checkpoint is None else str(checkpoint),
            options.iterations,
            options.min_visits,
            str(case_file(data_dir, c)),
        )
        for c in todo
    ]
    if options.workers <= 1:
        for a in args:
            _generate_one(*a)
            done += 1
            progress("generate", done, len(cases))
        return
    with ProcessPoolExecutor(options.workers) as pool:
        for _ in pool.map(_generate_one, *zip(*args, strict=True)) if args else ():
            done += 1
            progress("generate", done, len(cases))


def _batches(examples: Sequence[Example], size: int, rng: np.random.Generator | None):
    order = np.arange(len(examples)) if rng is None else rng.permutation(len(examples))
    for start in range(0, len(order), size):
        chunk = [examples[i] for i in order[start : start + size]]
        yield batch_tensors([to_tensors(e.graph, e.target) for e in chunk])


def evaluate_fit(model: PriorNet, examples: Sequence[Example]) -> dict[str, float]:
    """Cross-entropy against the visit distributions (and the uniform prior's, for
    scale), how often the network's favourite is the search's most visited action, and
    the mean prior it puts on that action."""
    if not examples:
        return {}
    model.eval()
    loss = uniform = top1 = mass = 0.0
    with torch.inference_mode():
        for batch in _batches(examples, 64, None):
            log_p = model.log_probabilities(batch)
            y, act_batch = batch["act"].y, batch["act"].batch
            graphs = int(act_batch.max()) + 1
            per_graph = torch.zeros(graphs).index_add_(0, act_batch, -(y * log_p))
            loss += float(per_graph.sum())
            counts = torch.bincount(act_batch, minlength=graphs).double()
            uniform += float(counts.log().sum())
            for g in range(graphs):
                mine = act_batch == g
                best = int(torch.argmax(y[mine]))
                top1 += float(int(torch.argmax(log_p[mine])) == best)
                mass += float(log_p[mine][best].exp())
    n = len(examples)
    return {
        "cross_entropy": loss / n,
        "uniform_cross_entropy": uniform / n,
        "top1_agreement": top1 / n,
        "prior_on_most_visited": mass / n,
        "examples": n,
    }


def fit(
    train_set: Sequence[Example],
    val_set: Sequence[Example],
    options: TrainOptions,
    *,
    state_path: Path | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[PriorNet, list[dict]]:
    """Fit a network of ``options.hyper`` to the examples' targets (without the part
    ``options.hyper["ablation"]`` names); with ``state_path``, resume from and save to it
    after every epoch. Returns the network and the per-epoch metrics."""
    report = progress or (lambda *_: None)
    ablation = options.hyper.get("ablation", "none")
    train_set = [Example(ablate(e.graph, ablation), e.target) for e in train_set]
    val_set = [Example(ablate(e.graph, ablation), e.target) for e in val_set]
    torch.manual_seed(options.seed)
    model = PriorNet(**options.hyper)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=options.learning_rate, weight_decay=options.weight_decay
    )
    history: list[dict] = []
    start_epoch = 0
    if state_path is not None and state_path.exists():
        state = torch.load(state_path, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = int(state["epoch"])
        history = json.loads(state["history"])
    report("fit", start_epoch, options.epochs)
    for epoch in range(start_epoch, options.epochs):
        model.train()
        rng = np.random.default_rng(options.seed * 1_000 + epoch)
        total = 0.0
        for batch in _batches(train_set, options.batch_size, rng):
            optimizer.zero_grad()
            log_p = model.log_probabilities(batch)
            loss = -(batch["act"].y * log_p).sum() / batch.num_graphs
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            total += float(loss.detach()) * batch.num_graphs
        history.append(
            {
                "epoch": epoch + 1,
                "train_cross_entropy": total / max(len(train_set), 1),
                **{f"val_{k}": v for k, v in evaluate_fit(model, val_set).items()},
            }
        )
        if state_path is not None:
            partial = state_path.with_suffix(".partial")
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch + 1,
                    "history": json.dumps(history),
                },
                partial,
            )
            partial.replace(state_path)
        report("fit", epoch + 1, options.epochs)
    model.eval()
    return model, history


def _what_counts(record: dict) -> dict:
    """What a run's results depend on: its record but the rounds and how many processes
    generate, as JSON holds it, an option a record lacks (a run of an earlier version)
    taking its default."""
    saved = json.loads(json.dumps(record))
    options = {**json.loads(json.dumps(asdict(TrainOptions()))), **saved["options"]}
    del options["workers"]
    return {**{k: v for k, v in saved.items() if k != "rounds"}, "options": options}


def open_run(record_path: Path, record: dict) -> dict:
    """The record of a run: ``record`` (its options, what else its results depend on,
    no rounds yet) for a new run; the record ``record_path`` holds, with ``record``'s
    options, for a run that resumes. Refuses to resume a run with other options."""
    if not record_path.exists():
        return record
    previous = json.loads(record_path.read_text())
    if _what_counts(previous) != _what_counts(record):
        raise InvalidInput(
            f"{record_path.parent} holds a run with other options; resume with the same "
            "ones or use another directory"
        )
    return {**previous, "options": record["options"]}


def check_options(options: TrainOptions) -> None:
    """Refuse options no run can follow, before anything is generated."""
    if options.rounds < 1 or options.epochs < 1 or options.clusters_per_model < 1:
        raise InvalidInput("rounds, epochs and clusters per model must be at least 1")
    if not set(options.models) - set(options.exclude):
        raise InvalidInput("every model of the run is excluded: nothing to train on")
    low, high = options.larger_machines
    if not 1 <= low <= high:
        raise InvalidInput(f"larger clusters need 1 <= low <= high machines, not {low}-{high}")


def held_out_cases(options: TrainOptions) -> set[Case]:
    """The cases that validate a run's fit: every tenth, counting from the last, of the
    cases with the excluded models' (so excluding a model moves no other case)."""
    cases = cases_for(options, with_excluded=True)
    return {cases[i] for i in range(len(cases) - 1, 0, -_HELD_OUT_EVERY)}


def load_examples(
    data_dir: Path, cases: Sequence[Case], held_out: set[Case]
) -> tuple[list[Example], list[Example], list[dict]]:
    """The examples of ``cases`` split into training and validation, and their summaries."""
    train_set: list[Example] = []
    val_set: list[Example] = []
    summaries = []
    for case in cases:
        examples, summary = load_case(case_file(data_dir, case))
        (val_set if case in held_out else train_set).extend(examples)
        summaries.append(summary)
    return train_set, val_set, summaries


def train(
    out_dir: str | Path,
    options: TrainOptions | None = None,
    *,
    progress: Callable[[str, int, int], None] | None = None,
) -> Path:
    """Run (or resume) a training run in ``out_dir``; returns the final checkpoint's path."""
    options = options or TrainOptions()
    check_options(options)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record_path = out / "run.json"
    record = open_run(record_path, {"options": asdict(options), "rounds": []})
    report = progress or (lambda *_: None)
    cases = cases_for(options)
    held_out = held_out_cases(options)
    checkpoint: Path | None = None
    for round_index in range(options.rounds):
        round_dir = out / f"round-{round_index}"
        started = time.perf_counter()
        generate_cases(cases, round_dir / "data", checkpoint, options, report)
        generated_s = time.perf_counter() - started
        train_set, val_set, summaries = load_examples(round_dir / "data", cases, held_out)
        started = time.perf_counter()
        model, history = fit(
            train_set, val_set, options, state_path=round_dir / "train_state.pt", progress=report
        )
        fitted_s = time.perf_counter() - started
        final = history[-1] if history else {}
        round_record = {
            "round": round_index,
            "prior": "uniform" if checkpoint is None else str(checkpoint.relative_to(out)),
            "cases": summaries,
            "train_examples": len(train_set),
            "validation_examples": len(val_set),
            "held_out_cases": sorted(c.slug for c in held_out),
            "history": history,
            "metrics": {k: v for k, v in final.items() if k.startswith("val_")},
            "generate_s": round(generated_s, 1),
            "fit_s": round(fitted_s, 1),
        }
        checkpoint = round_dir / "prior.pt"
        save_checkpoint(
            checkpoint,
            model,
            {
                "training": {
                    "options": asdict(options),
                    "round": round_index,
                    "cases": len(cases),
                    "train_examples": len(train_set),
                    "validation_examples": len(val_set),
                },
                "metrics": {
                    k: (v if isinstance(v, int) or math.isfinite(v) else None)
                    for k, v in round_record["metrics"].items()
                },
            },
        )
        record["rounds"] = [r for r in record["rounds"] if r["round"] != round_index]
        record["rounds"].append(round_record)
        record_path.write_text(json.dumps(record, indent=1))
    return out / f"round-{options.rounds - 1}" / "prior.pt"
