"""The planner's version changes with its code and with its data tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from tagplan.planner import version


def digest_of(root: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(version, "_PLANNER", root)
    return version.planner_version.__wrapped__()


def test_a_catalog_edit_changes_the_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cost.py").write_text("EFFICIENCY = 0.65\n")
    catalog = tmp_path / "topology" / "gpu_catalog.yaml"
    catalog.parent.mkdir()
    catalog.write_text("gpu_types: [{name: H100, gemm_tile: 128}]\n")
    before = digest_of(tmp_path, monkeypatch)
    assert digest_of(tmp_path, monkeypatch) == before  # a digest, not a clock
    catalog.write_text("gpu_types: [{name: H100}]\n")
    assert digest_of(tmp_path, monkeypatch) != before
    (tmp_path / "cost.py").write_text("EFFICIENCY = 0.7\n")
    assert digest_of(tmp_path, monkeypatch) != before


def test_the_shipped_version_names_the_package() -> None:
    assert "+" in version.planner_version()
    assert len(version.planner_version().rsplit("+", 1)[1]) == 12
