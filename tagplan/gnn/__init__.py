"""The learned prior of the search (docs/design.md §8, TAG §4.2.1-4.2.2).

Features (:mod:`.features`, numpy), the network (:mod:`.model`, PyTorch Geometric), the
prior the search asks (:mod:`.prior`), checkpoints (:mod:`.checkpoint`) and training
(:mod:`.dataset`, :mod:`.train`). torch is imported only when a prior is loaded, so the
package imports without it, and planning without torch falls back to the uniform prior
(:func:`default_prior` says so).

Priors are named for what a plan reports and what the strategy cache keys on:
``uniform``, or ``gnn:<first 12 hex digits of the weights' sha256>``.
"""

from __future__ import annotations

import json
from importlib import resources
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from tagplan.planner.errors import InvalidInput
from tagplan.planner.search.prior import Prior, UniformPrior

__all__ = [
    "UNIFORM",
    "default_prior",
    "gnn_available",
    "load_prior",
    "prior_name",
    "resolve_prior",
    "shipped_prior_name",
    "shipped_record",
]

UNIFORM = "uniform"
_SHIPPED = ("checkpoints", "prior.pt")
_RECORD = ("checkpoints", "prior.json")


def gnn_available() -> bool:
    """Whether torch is installed (``pip install '.[gnn]'``): the prior's network runs on
    torch alone (PyTorch Geometric, in the same extra, is the tests' reference)."""
    return find_spec("torch") is not None


def prior_name(digest: str) -> str:
    """The name of the prior whose weights have sha256 ``digest``."""
    return f"gnn:{digest[:12]}"


def _package_file(parts: tuple[str, str]) -> Path:
    return Path(str(resources.files("tagplan.gnn").joinpath(*parts)))


def shipped_record() -> dict[str, Any]:
    """The shipped checkpoint's training record (read without torch)."""
    return json.loads(_package_file(_RECORD).read_text())


def shipped_prior_name() -> str:
    """The name of the shipped checkpoint's prior, or ``uniform`` when torch is missing."""
    if not gnn_available():
        return UNIFORM
    return prior_name(shipped_record()["state_sha256"])


def load_prior(source: str | Path | bytes | None = None) -> Prior:
    """The GNN prior of a checkpoint (a path or the file's bytes; ``None``: the shipped
    one). Raises :class:`~tagplan.planner.errors.InvalidInput` without torch, and
    :class:`~.checkpoint.CheckpointRefused` for a checkpoint this version cannot use."""
    if not gnn_available():
        raise InvalidInput("the GNN prior needs torch: pip install 'tagplan[gnn]'")
    import torch

    from tagplan.gnn.checkpoint import load_checkpoint
    from tagplan.gnn.prior import GnnPrior

    # one forward pass per expansion on a graph of a few thousand edges: one thread is
    # fastest, and more contend with the simulator for the same cores
    torch.set_num_threads(1)
    model, meta = load_checkpoint(_package_file(_SHIPPED) if source is None else source)
    return GnnPrior(model, name=prior_name(meta["state_sha256"]))


def default_prior() -> tuple[Prior, str | None]:
    """The prior a plan uses unless told otherwise: the shipped GNN, or the uniform prior
    and the reason when torch is not installed."""
    if not gnn_available():
        return UniformPrior(), "torch is not installed: searching with the uniform prior"
    return load_prior(), None


def resolve_prior(spec: str) -> tuple[Prior, str | None]:
    """A prior named the way users name it: ``gnn`` (the shipped checkpoint; uniform,
    with a note, without torch), ``uniform``, or a checkpoint file's path."""
    if spec == UNIFORM:
        return UniformPrior(), None
    if spec == "gnn":
        return default_prior()
    if not Path(spec).is_file():
        raise InvalidInput(f"--prior takes 'gnn', 'uniform' or a checkpoint file; {spec!r} is none")
    return load_prior(Path(spec)), None
