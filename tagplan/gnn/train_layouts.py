"""Training the layout head (:mod:`.model`) on a trained network, AlphaZero-style as the
network itself is trained (:mod:`.train`): rounds of *generate* (search every training
case with the pipelines in the tree, :func:`~.dataset.search_for` with ``layouts``, and
keep the visit distribution at every vertex of the pipelined part visited at least
``min_visits`` times) and *fit* (cross-entropy between the head's prior and those
distributions).

The head reads the base network's embeddings of each search's root state and the base
network's weights stay as they are: its decisions over op groups, trained and measured
before, do not change, and the checkpoint gains a head (and a new digest). Round 0
searches with the base network, whose layout vertices take the layouts' own prior (their
compute bounds); each later round with the previous round's head. Each round's
validation compares the head's cross-entropy with the uniform prior's and with the
layouts' own prior's on held-out cases.

A run lives in one directory, as :mod:`.train`'s does: ``base.pt`` (the base network),
``round-K/data/*.npz`` (one file per case: its root state and its layout vertices),
``round-K/prior.pt`` and ``run.json``;
a rerun with the same options and base resumes where it stopped. The base may be a
checkpoint with a head already (the shipped one): its network without the head is the
base, so the shipped checkpoint's recipe can be run again from it.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from tagplan.gnn.checkpoint import load_checkpoint, save_checkpoint, state_digest
from tagplan.gnn.dataset import (
    Case,
    case_file,
    graph_arrays,
    graph_from,
    save_arrays,
    search_for,
)
from tagplan.gnn.features import StateGraph, ablate, state_graph, static_graph
from tagplan.gnn.layout_features import LayoutStatics
from tagplan.gnn.model import PriorNet
from tagplan.gnn.tensors import to_tensors
from tagplan.gnn.train import (
    TrainOptions,
    cases_for,
    check_options,
    generate_cases,
    held_out_cases,
    open_run,
)
from tagplan.planner.search.prior import LayoutQuery, Prior

__all__ = [
    "LayoutExample",
    "evaluate_layout_fit",
    "fit_layout_head",
    "generate_layout_case",
    "train_layouts",
    "with_layout_head",
    "without_layout_head",
]


@dataclass(frozen=True, eq=False)
class LayoutExample:
    """One layout vertex: its candidates (:class:`~.layout_features.LayoutCandidates`'
    fields), the visit distribution over them and the layouts' own prior there."""

    x: np.ndarray
    device_groups: tuple[tuple[int, ...], ...]
    focus: np.ndarray
    target: np.ndarray
    own_prior: np.ndarray


@dataclass(frozen=True, eq=False)
class LayoutCase:
    """A case's root state (what the head's embeddings come from) and its examples."""

    root: StateGraph
    examples: list[LayoutExample]


def generate_layout_case(
    case: Case, prior: Prior | None, *, iterations: int, min_visits: int
) -> tuple[LayoutCase | None, dict]:
    """The layout examples of one case (``None`` where its tree holds no layout: a
    single unit, or every layout bounded out) and a summary of its search."""
    search = search_for(case, prior, layouts=True)
    outcome = search.run(iterations=iterations)
    branches = search.layouts
    summary = {
        **asdict(case),
        "layouts": 0 if branches is None else len(branches),
        "best_step_s": outcome.step_time_s,
        "reference_step_s": search.reference_step_s,
        "pipelined": outcome.pipelined,
        "evaluations": outcome.evaluations,
        "examples": 0,
    }
    if branches is None:
        return None, summary
    statics = LayoutStatics(search.context, branches)
    examples = []
    for query, visits in search.visit_targets(min_visits):
        if isinstance(query, LayoutQuery) and len(visits) > 1:  # one candidate: no choice
            found = statics.candidates(query.path)
            own = branches.prior(query.path)
            examples.append(LayoutExample(found.x, found.device_groups, found.focus, visits, own))
    summary["examples"] = len(examples)
    root = state_graph(static_graph(search.context), search.context.root_query())
    return LayoutCase(root, examples), summary


def _save(path: Path, found: LayoutCase | None, summary: dict) -> None:
    arrays: dict[str, np.ndarray] = {}
    if found is not None:
        arrays.update(graph_arrays("root.", found.root))
        for i, e in enumerate(found.examples):
            arrays[f"{i}.x"], arrays[f"{i}.focus"] = e.x, e.focus
            arrays[f"{i}.target"] = e.target.astype(np.float32)
            arrays[f"{i}.own_prior"] = e.own_prior.astype(np.float32)
            arrays[f"{i}.sizes"] = np.array([len(g) for g in e.device_groups], dtype=np.int64)
            arrays[f"{i}.members"] = np.array(
                [m for g in e.device_groups for m in g], dtype=np.int64
            )
    save_arrays(path, arrays, summary)


def _load(path: Path) -> tuple[LayoutCase | None, dict]:
    with np.load(path, allow_pickle=False) as data:
        summary = json.loads(str(data["summary"]))
        if "root.op_x" not in data:
            return None, summary
        examples = []
        for i in range(summary["examples"]):
            bounds = np.cumsum([0, *data[f"{i}.sizes"].tolist()])
            members = data[f"{i}.members"].tolist()
            groups = tuple(tuple(members[a:b]) for a, b in itertools.pairwise(bounds))
            examples.append(
                LayoutExample(
                    data[f"{i}.x"],
                    groups,
                    data[f"{i}.focus"],
                    data[f"{i}.target"],
                    data[f"{i}.own_prior"],
                )
            )
        return LayoutCase(graph_from(data, "root."), examples), summary


def with_layout_head(base: PriorNet, seed: int) -> PriorNet:
    """``base``'s weights with a new layout head, initialized from ``seed``."""
    torch.manual_seed(seed)
    model = PriorNet(**{**base.hyper, "layout_head": True})
    state = {k: v for k, v in base.state_dict().items() if not k.startswith("layout_")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("layout_") for k in missing)
    return model


def without_layout_head(model: PriorNet) -> PriorNet:
    """``model``'s network without its layout head (itself if it has none)."""
    if not model.has_layout_head:
        return model
    base = PriorNet(**{k: v for k, v in model.hyper.items() if k != "layout_head"})
    base.load_state_dict(
        {k: v for k, v in model.state_dict().items() if not k.startswith("layout_")}
    )
    return base.eval()


def _embeddings(model: PriorNet, cases: Sequence[LayoutCase]) -> list[dict[str, torch.Tensor]]:
    """Each case's root-state embeddings by the (fixed) encoder."""
    out = []
    with torch.inference_mode():
        for case in cases:
            data = to_tensors(ablate(case.root, model.hyper["ablation"]))
            out.append(model.encode(data, model.shape_of(data)))
    return out


def _log_prior(model: PriorNet, h: dict[str, torch.Tensor], e: LayoutExample) -> torch.Tensor:
    logits = model.layout_logits(
        h, torch.from_numpy(e.x), e.device_groups, torch.from_numpy(e.focus)
    )
    return torch.log_softmax(logits, 0)


def evaluate_layout_fit(
    model: PriorNet, cases: Sequence[LayoutCase], embeddings: Sequence[dict] | None = None
) -> dict[str, float]:
    """Mean cross-entropy of the head's prior against the visit distributions, beside
    the uniform prior's and the layouts' own prior's, and how often the head's favourite
    is the most visited candidate (the own prior's, for scale)."""
    embeddings = embeddings if embeddings is not None else _embeddings(model, cases)
    pairs = [(h, e) for h, case in zip(embeddings, cases, strict=True) for e in case.examples]
    if not pairs:
        return {}
    loss = uniform = own = top1 = own_top1 = 0.0
    with torch.inference_mode():
        for h, e in pairs:
            target = torch.from_numpy(e.target).double()
            log_p = _log_prior(model, h, e).double()
            loss += float(-(target * log_p).sum())
            uniform += float(np.log(len(e.target)))
            own += float(-(e.target * np.log(np.maximum(e.own_prior, 1e-12))).sum())
            best = int(np.argmax(e.target))
            top1 += float(int(torch.argmax(log_p)) == best)
            own_top1 += float(int(np.argmax(e.own_prior)) == best)
    n = len(pairs)
    return {
        "cross_entropy": loss / n,
        "uniform_cross_entropy": uniform / n,
        "own_prior_cross_entropy": own / n,
        "top1_agreement": top1 / n,
        "own_prior_top1_agreement": own_top1 / n,
        "examples": n,
    }


def fit_layout_head(
    base: PriorNet,
    train_set: Sequence[LayoutCase],
    val_set: Sequence[LayoutCase],
    options: TrainOptions,
    *,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[PriorNet, list[dict]]:
    """``base`` with a layout head fitted to the examples (only the head's weights
    change). Returns the network and the per-epoch metrics."""
    report = progress or (lambda *_: None)
    model = with_layout_head(base, options.seed)
    train_h, val_h = _embeddings(model, train_set), _embeddings(model, val_set)
    pairs = [(h, e) for h, case in zip(train_h, train_set, strict=True) for e in case.examples]
    optimizer = torch.optim.AdamW(
        model.layout_parameters(), lr=options.learning_rate, weight_decay=options.weight_decay
    )
    history: list[dict] = []
    report("fit layouts", 0, options.epochs)
    for epoch in range(options.epochs):
        model.train()
        order = np.random.default_rng(options.seed * 1_000 + epoch).permutation(len(pairs))
        total = 0.0
        for start in range(0, len(order), options.batch_size):
            chunk = [pairs[i] for i in order[start : start + options.batch_size]]
            optimizer.zero_grad()
            loss = sum(
                -(torch.from_numpy(e.target) * _log_prior(model, h, e)).sum() for h, e in chunk
            ) / len(chunk)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.layout_parameters(), 5.0)
            optimizer.step()
            total += float(loss.detach()) * len(chunk)
        model.eval()
        history.append(
            {
                "epoch": epoch + 1,
                "train_cross_entropy": total / max(len(pairs), 1),
                **{f"val_{k}": v for k, v in evaluate_layout_fit(model, val_set, val_h).items()},
            }
        )
        report("fit layouts", epoch + 1, options.epochs)
    return model, history


def train_layouts(
    out_dir: str | Path,
    base_checkpoint: str | Path,
    options: TrainOptions | None = None,
    *,
    progress: Callable[[str, int, int], None] | None = None,
) -> Path:
    """Run (or resume) a layout-head run on ``base_checkpoint`` in ``out_dir``; returns
    the final checkpoint's path."""
    options = options or TrainOptions()
    check_options(options)
    base, base_meta = load_checkpoint(base_checkpoint)
    base = without_layout_head(base)  # a checkpoint with a head trains a new one
    base_sha256 = state_digest(base.state_dict())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record_path = out / "run.json"
    record = open_run(
        record_path, {"options": asdict(options), "base_sha256": base_sha256, "rounds": []}
    )
    report = progress or (lambda *_: None)
    cases = cases_for(options)
    held_out = held_out_cases(options)
    generator = out / "base.pt"  # round 0 searches with the base network alone
    if not generator.exists():
        save_checkpoint(generator, base, {k: base_meta.get(k) for k in ("training", "metrics")})
    for round_index in range(options.rounds):
        round_dir = out / f"round-{round_index}"
        started = time.perf_counter()
        generate_cases(
            cases, round_dir / "data", generator, options, report, generate_layout_case, _save
        )
        generated_s = time.perf_counter() - started
        train_set: list[LayoutCase] = []
        val_set: list[LayoutCase] = []
        summaries = []
        for case in cases:
            found, summary = _load(case_file(round_dir / "data", case))
            summaries.append(summary)
            if found is not None:
                (val_set if case in held_out else train_set).append(found)
        started = time.perf_counter()
        model, history = fit_layout_head(base, train_set, val_set, options, progress=report)
        metrics = {k: v for k, v in history[-1].items() if k.startswith("val_")}
        training = {
            "options": asdict(options),
            "round": round_index,
            "base_sha256": base_sha256,
            "train_examples": sum(len(c.examples) for c in train_set),
            "validation_examples": sum(len(c.examples) for c in val_set),
        }
        generator = round_dir / "prior.pt"
        save_checkpoint(
            generator,
            model,
            {
                "training": base_meta.get("training"),
                "metrics": base_meta.get("metrics"),
                "layout_training": training,
                "layout_metrics": metrics,
            },
        )
        record["rounds"] = [r for r in record["rounds"] if r["round"] != round_index]
        record["rounds"].append(
            {
                **training,
                "prior": "base" if round_index == 0 else f"round-{round_index - 1}/prior.pt",
                "cases": summaries,
                "history": history,
                "metrics": metrics,
                "generate_s": round(generated_s, 1),
                "fit_s": round(time.perf_counter() - started, 1),
            }
        )
        record_path.write_text(json.dumps(record, indent=1))
    return out / f"round-{options.rounds - 1}" / "prior.pt"
