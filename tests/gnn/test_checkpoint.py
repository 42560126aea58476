"""Checkpoints: they round-trip, and anything else is refused with a clear message."""

from __future__ import annotations

import io
import pickle

import pytest
import torch

from tagplan.gnn import UNIFORM, default_prior, load_prior, prior_name, shipped_record
from tagplan.gnn.checkpoint import (
    FORMAT,
    CheckpointRefused,
    load_checkpoint,
    save_checkpoint,
    state_digest,
)
from tagplan.gnn.features import SCHEMA_VERSION, state_graph, static_graph
from tagplan.gnn.model import PriorNet
from tagplan.gnn.tensors import to_tensors


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(3)
    model = PriorNet(hidden=16, heads=2, layers=1)
    path = tmp_path / "prior.pt"
    digest = save_checkpoint(path, model, {"training": {"note": "test"}})
    return model, path, digest


def test_a_checkpoint_round_trips(saved, searched) -> None:
    model, path, digest = saved
    loaded, meta = load_checkpoint(path)
    assert meta["state_sha256"] == digest == state_digest(loaded.state_dict())
    assert meta["format"] == FORMAT and meta["schema"]["version"] == SCHEMA_VERSION
    assert meta["training"] == {"note": "test"} and meta["hyper"]["hidden"] == 16
    query = next(q for q, _ in searched.visit_targets(1))
    data = to_tensors(state_graph(static_graph(searched.context), query))
    assert torch.equal(model.eval()(data), loaded(data))
    assert load_prior(path.read_bytes()).name == prior_name(digest)
    assert (path.with_suffix(".json")).exists()  # described without torch


def _resave(path, change) -> bytes:
    payload = torch.load(path, weights_only=True)
    change(payload)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def test_a_checkpoint_of_another_feature_schema_is_refused(saved) -> None:
    _, path, _ = saved

    def older(payload):
        payload["meta"]["schema"]["version"] = SCHEMA_VERSION - 1
        payload["meta"]["schema"]["op"] = payload["meta"]["schema"]["op"][:-1]

    with pytest.raises(CheckpointRefused, match=r"feature schema v0 .* v1 \(differs in: op, "):
        load_checkpoint(_resave(path, older))


def test_tampered_foreign_and_unsafe_files_are_refused(saved, tmp_path, capsys) -> None:
    _, path, _ = saved

    def tamper(payload):
        name = next(iter(payload["state_dict"]))
        payload["state_dict"][name] = payload["state_dict"][name] + 1.0

    with pytest.raises(CheckpointRefused, match="do not match their recorded sha256"):
        load_checkpoint(_resave(path, tamper))
    with pytest.raises(CheckpointRefused, match="format"):
        load_checkpoint(_resave(path, lambda p: p["meta"].update(format="other/1")))
    with pytest.raises(CheckpointRefused, match="not a loadable"):
        load_checkpoint(b"this is not a checkpoint")
    with pytest.raises(CheckpointRefused, match="'state_dict' and 'meta'"):
        buffer = io.BytesIO()
        torch.save({"weights": torch.zeros(1)}, buffer)
        load_checkpoint(buffer.getvalue())

    class Payload:  # a pickle that would run code when loaded without weights_only
        def __reduce__(self):
            return (print, ("executed",))

    unsafe = tmp_path / "unsafe.pt"
    unsafe.write_bytes(pickle.dumps(Payload()))
    with pytest.raises(CheckpointRefused, match="not a loadable weights-only"):
        load_checkpoint(unsafe)
    assert "executed" not in capsys.readouterr().out


def test_the_shipped_checkpoint_is_the_default_prior() -> None:
    prior, note = default_prior()
    assert note is None and prior.name != UNIFORM
    assert prior.name == prior_name(shipped_record()["state_sha256"])
