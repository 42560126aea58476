"""GNN prior checkpoints: a ``state_dict`` with the metadata that says what it is.

A checkpoint file is ``torch.save`` of ``{"state_dict": ..., "meta": ...}`` holding only
tensors and plain values, so it loads with ``torch.load(weights_only=True)``: a file
from anywhere cannot run code. ``meta`` records the format, the feature schema
(:data:`~.features.SCHEMA_VERSION` and every feature's name, so a network is never fed
features it was not trained on; a network with a layout head also records the layout
candidates' features, :mod:`.layout_features`), the network's shape, the training run
(data, seeds, metrics) and the sha256 of the weights. :func:`load_checkpoint` refuses a
file whose format, schema or digest does not match, naming what differs.

:func:`save_checkpoint` writes the metadata beside the file as JSON too, so the trained
checkpoint the package ships (``tagplan/gnn/checkpoints/prior.pt``, the default prior) is
described without torch.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import torch

from tagplan.gnn.features import (
    ACT_FEATURES,
    DEV_FEATURES,
    EDGE_FEATURES,
    OP_FEATURES,
    SCHEMA_VERSION,
)
from tagplan.gnn.layout_features import LAYOUT_FEATURES, LAYOUT_SCHEMA_VERSION
from tagplan.gnn.model import PriorNet
from tagplan.planner.errors import InvalidInput

__all__ = [
    "FORMAT",
    "CheckpointRefused",
    "feature_schema",
    "load_checkpoint",
    "save_checkpoint",
    "state_digest",
]

FORMAT = "tagplan-gnn-prior/1"


class CheckpointRefused(InvalidInput):
    """The file is not a checkpoint this version can use (the message says why)."""


def feature_schema(*, layout_head: bool = False) -> dict[str, Any]:
    """The features this version computes, as a checkpoint records them; the layout
    candidates' too for a network with a layout head."""
    schema: dict[str, Any] = {
        "version": SCHEMA_VERSION,
        "op": list(OP_FEATURES),
        "dev": list(DEV_FEATURES),
        "act": list(ACT_FEATURES),
        "edges": {"__".join(k): list(v) for k, v in EDGE_FEATURES.items()},
    }
    if layout_head:
        schema["layout"] = {"version": LAYOUT_SCHEMA_VERSION, "features": list(LAYOUT_FEATURES)}
    return schema


def state_digest(state_dict: dict[str, torch.Tensor]) -> str:
    """sha256 over the weights' names, shapes and values, in name order."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()


def save_checkpoint(path: str | Path, model: PriorNet, meta: dict[str, Any]) -> str:
    """Write ``model`` with ``meta`` (training record and metrics: plain values) plus the
    format, schema, shape and digest, and the same metadata as JSON beside it (``.json``:
    readable without torch); returns the weights' digest."""
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    digest = state_digest(state)
    full_meta = {
        **meta,
        "format": FORMAT,
        "schema": feature_schema(layout_head=model.has_layout_head),
        "hyper": dict(model.hyper),
        "state_sha256": digest,
    }
    buffer = io.BytesIO()
    torch.save({"state_dict": state, "meta": full_meta}, buffer)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(buffer.getvalue())
    target.with_suffix(".json").write_text(json.dumps(full_meta, indent=1, sort_keys=True))
    return digest


def _refuse(source: str, why: str) -> CheckpointRefused:
    return CheckpointRefused(f"checkpoint {source} refused: {why}")


def load_checkpoint(source: str | Path | bytes) -> tuple[PriorNet, dict[str, Any]]:
    """The network and metadata of a checkpoint file (a path or its bytes), in eval mode.

    Raises :class:`CheckpointRefused` for a file that is not a checkpoint, one of another
    format or feature schema, or one whose weights do not match their digest."""
    name = "(uploaded bytes)" if isinstance(source, bytes) else str(source)
    data = source if isinstance(source, bytes) else Path(source).read_bytes()
    try:
        payload = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # torch raises many kinds for a file that is not its format
        raise _refuse(name, f"not a loadable weights-only torch file ({exc})") from None
    if not isinstance(payload, dict) or not {"state_dict", "meta"} <= payload.keys():
        raise _refuse(name, "expected a dict with 'state_dict' and 'meta'")
    meta, state = payload["meta"], payload["state_dict"]
    if meta.get("format") != FORMAT:
        raise _refuse(name, f"format {meta.get('format')!r}, this version reads {FORMAT!r}")
    layout_head = bool(meta.get("hyper", {}).get("layout_head", False))
    schema, expected = meta.get("schema", {}), feature_schema(layout_head=layout_head)
    if schema != expected:
        differs = sorted(k for k in expected if schema.get(k) != expected[k])
        raise _refuse(
            name,
            f"feature schema v{schema.get('version')} does not match this version's "
            f"v{SCHEMA_VERSION} (differs in: {', '.join(differs)}); retrain with "
            "`tagplan train`",
        )
    if state_digest(state) != meta.get("state_sha256"):
        raise _refuse(name, "the weights do not match their recorded sha256")
    try:
        model = PriorNet(**meta["hyper"])
        model.load_state_dict(state, strict=True)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise _refuse(name, f"the weights do not fit the network ({exc})") from None
    model.eval()
    return model, meta
