"""load_cluster: names, mappings, specs, text and files; dumps round trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.topology import (
    dumps_cluster_spec,
    fingerprint,
    load_cluster,
    load_cluster_spec,
    loads_cluster_spec,
    tag_testbed_spec,
)

SMALL = {
    "machines": [
        {"name": "a", "gpus": {"type": "A100-80GB", "count": 2}, "intra_bandwidth_gbps": 2400},
        {"name": "b", "gpus": [{"index": 1, "type": "L4"}], "intra_bandwidth_gbps": 64},
    ],
    "network": {"bandwidth_gbps": 25},
}


class TestSources:
    def test_name(self) -> None:
        assert load_cluster("cloud").num_devices == 32

    def test_mapping_and_spec_and_cluster(self) -> None:
        c = load_cluster(SMALL)
        assert c.device_names == ("a/GPU:0", "a/GPU:1", "b/GPU:1")
        assert load_cluster(c) is c
        assert load_cluster(c.to_spec()).device_names == c.device_names

    def test_text(self) -> None:
        assert load_cluster(json.dumps(SMALL)).num_devices == 3
        assert load_cluster(dumps_cluster_spec(load_cluster(SMALL))).num_devices == 3

    @pytest.mark.parametrize("suffix", [".json", ".yaml", ".yml"])
    def test_file(self, tmp_path: Path, suffix: str) -> None:
        path = tmp_path / f"alloc{suffix}"
        fmt = "json" if suffix == ".json" else "yaml"
        path.write_text(dumps_cluster_spec(load_cluster(SMALL), fmt=fmt))
        assert load_cluster(path).num_devices == 3
        assert load_cluster(str(path)).num_devices == 3
        assert load_cluster_spec(path).machines[1].gpu_slots() == [(1, "L4")]

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(InvalidInput, match="does not exist"):
            load_cluster(str(tmp_path / "nope.yaml"))

    def test_wrong_suffix(self, tmp_path: Path) -> None:
        with pytest.raises(InvalidInput, match=r"must end in \.json, \.yaml or \.yml"):
            load_cluster(tmp_path / "alloc.txt")

    def test_invalid_file_content(self, tmp_path: Path) -> None:
        path = tmp_path / "alloc.json"
        path.write_text(json.dumps({"machines": []}))
        with pytest.raises(InvalidInput, match="no machines"):
            load_cluster(path)

    def test_unsupported_object(self) -> None:
        with pytest.raises(InvalidInput, match="cannot load a cluster from a int"):
            load_cluster(7)  # type: ignore[arg-type]

    def test_unknown_name(self) -> None:
        with pytest.raises(InvalidInput, match="unknown named cluster"):
            load_cluster("lab-3")


class TestDumps:
    @pytest.mark.parametrize("fmt", ["json", "yaml"])
    def test_round_trip(self, fmt: str) -> None:
        spec = tag_testbed_spec()
        text = dumps_cluster_spec(spec, fmt=fmt)  # type: ignore[arg-type]
        again = loads_cluster_spec(text)
        assert again == spec
        assert fingerprint(load_cluster(again)) == fingerprint(load_cluster(spec))

    def test_yaml_is_compact(self) -> None:
        text = dumps_cluster_spec(tag_testbed_spec())
        assert "gpus: {type: V100-32GB, count: 4}" in text
        assert "gpu_types" not in text
