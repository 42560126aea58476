"""Cluster spec validation (docs/design.md §2): happy paths and every refusal, by message."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.topology import (
    DEFAULT_INTRA_LATENCY_US,
    DEFAULT_NETWORK_LATENCY_US,
    GpuCount,
    loads_cluster_spec,
    parse_cluster_spec,
)

BASE: dict[str, Any] = {
    "machines": [
        {"name": "m0", "gpus": {"type": "V100-32GB", "count": 4}, "intra_bandwidth_gbps": 1200},
        {"name": "m1", "gpus": {"type": "GTX-1080Ti", "count": 2}, "intra_bandwidth_gbps": 96},
    ],
    "network": {
        "bandwidth_gbps": 100,
        "latency_us": 12,
        "links": [{"between": ["m0", "m1"], "bandwidth_gbps": 25}],
    },
}


def variant(**changes: Any) -> dict[str, Any]:
    """BASE with dotted-path changes, e.g. ``variant(**{"machines.0.name": "x"})``."""
    data = copy.deepcopy(BASE)
    for path, value in changes.items():
        *parents, last = path.split(".")
        node: Any = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return data


def refused(data: Any, pattern: str) -> str:
    with pytest.raises(InvalidInput, match=pattern) as info:
        parse_cluster_spec(data)
    return str(info.value)


class TestHappyPaths:
    def test_count_form(self) -> None:
        spec = parse_cluster_spec(BASE)
        assert [m.name for m in spec.machines] == ["m0", "m1"]
        assert isinstance(spec.machines[0].gpus, GpuCount)
        assert spec.machines[0].gpu_slots() == [(i, "V100-32GB") for i in range(4)]
        assert spec.network is not None and spec.network.links[0].between == ("m0", "m1")

    def test_list_form_sorted_by_index(self) -> None:
        spec = parse_cluster_spec(
            {
                "machines": [
                    {
                        "name": "box",
                        "gpus": [{"index": 5, "type": "T4"}, {"index": 2, "type": "A10"}],
                        "intra_bandwidth_gbps": 96,
                    }
                ]
            }
        )
        assert spec.machines[0].gpu_slots() == [(2, "A10"), (5, "T4")]
        assert spec.network is None  # one machine needs no network

    def test_defaults(self) -> None:
        data = variant(**{"network.links": []})
        del data["network"]["latency_us"]
        spec = parse_cluster_spec(data)
        assert spec.machines[0].intra_latency_us == DEFAULT_INTRA_LATENCY_US
        assert spec.network is not None
        assert spec.network.latency_us == DEFAULT_NETWORK_LATENCY_US

    def test_type_names_normalized(self) -> None:
        spec = parse_cluster_spec(variant(**{"machines.0.gpus.type": "v100-32gb"}))
        assert spec.machines[0].gpu_slots()[0][1] == "V100-32GB"

    def test_gpu_types_add_and_override(self) -> None:
        data = variant(**{"machines.1.gpus.type": "my-gpu"})
        data["gpu_types"] = [
            {
                "name": "My-GPU",
                "fp32_tflops": 5,
                "memory_bandwidth_gb_per_s": 400,
                "memory_gib": 12,
            },
            {
                "name": "v100-32gb",
                "fp32_tflops": 14,
                "memory_bandwidth_gb_per_s": 900,
                "memory_gib": 32,
            },
        ]
        spec = parse_cluster_spec(data)
        assert spec.machines[1].gpu_slots()[0][1] == "My-GPU"
        assert [t.name for t in spec.gpu_types] == ["My-GPU", "V100-32GB"]
        assert spec.type_table()["V100-32GB"].fp32_tflops == 14

    def test_yaml_text(self) -> None:
        spec = loads_cluster_spec(
            """
            machines:
              - name: m0
                gpus: {type: T4, count: 2}
                intra_bandwidth_gbps: 96
            """
        )
        assert spec.machines[0].gpu_slots() == [(0, "T4"), (1, "T4")]

    def test_json_text(self) -> None:
        spec = loads_cluster_spec(
            '{"machines": [{"name": "a", "gpus": {"type": "L4", "count": 1},'
            ' "intra_bandwidth_gbps": 64}]}',
            fmt="json",
        )
        assert spec.machines[0].name == "a"


class TestRefusals:
    def test_unknown_gpu_type_lists_known_types(self) -> None:
        message = refused(variant(**{"machines.1.gpus.type": "V100"}), "unknown GPU type 'V100'")
        assert "machine 'm1'" in message
        for known in ("V100-32GB", "GTX-1080Ti", "T4", "H100"):
            assert known in message

    @pytest.mark.parametrize(
        ("path", "where"),
        [
            ("machines.0.intra_bandwidth_gbps", "machines[0] (m0).intra_bandwidth_gbps"),
            ("network.bandwidth_gbps", "network.bandwidth_gbps"),
            ("network.links.0.bandwidth_gbps", "network.links[0].bandwidth_gbps"),
        ],
    )
    @pytest.mark.parametrize("value", [0, -5])
    def test_non_positive_bandwidth(self, path: str, where: str, value: int) -> None:
        message = refused(variant(**{path: value}), re.escape(where))
        assert "greater than 0" in message and f"got {value}" in message

    def test_infinite_bandwidth(self) -> None:
        refused(variant(**{"network.bandwidth_gbps": float("inf")}), "finite")

    def test_negative_latency(self) -> None:
        refused(
            variant(**{"network.latency_us": -1}), r"network\.latency_us.*greater than or equal"
        )

    def test_duplicate_machine_names(self) -> None:
        refused(variant(**{"machines.1.name": "m0"}), "duplicate machine name 'm0'")

    def test_link_to_unknown_machine(self) -> None:
        message = refused(
            variant(**{"network.links.0.between": ["m0", "m9"]}), "unknown machine 'm9'"
        )
        assert "network.links[0]" in message and "m0, m1" in message

    def test_link_to_itself(self) -> None:
        refused(variant(**{"network.links.0.between": ["m1", "m1"]}), "two different machines")

    def test_repeated_link(self) -> None:
        data = variant()
        data["network"]["links"].append({"between": ["m1", "m0"], "bandwidth_gbps": 10})
        refused(data, r"network\.links\[1\] repeats the pair")

    def test_machine_with_zero_count(self) -> None:
        refused(variant(**{"machines.1.gpus.count": 0}), r"machine 'm1' has no GPUs \(count is 0")

    def test_machine_with_empty_list(self) -> None:
        refused(variant(**{"machines.1.gpus": []}), r"machine 'm1' has no GPUs \(the gpus list")

    def test_duplicate_gpu_indices(self) -> None:
        gpus = [{"index": 1, "type": "T4"}, {"index": 0, "type": "T4"}, {"index": 1, "type": "T4"}]
        refused(variant(**{"machines.1.gpus": gpus}), "machine 'm1' lists GPU index 1 twice")

    def test_negative_gpu_index(self) -> None:
        refused(variant(**{"machines.1.gpus": [{"index": -1, "type": "T4"}]}), "index")

    @pytest.mark.parametrize("data", [{}, {"machines": []}])
    def test_empty_cluster(self, data: dict[str, Any]) -> None:
        refused(data, "the cluster has no machines")

    def test_network_required_for_two_machines(self) -> None:
        data = variant()
        del data["network"]
        refused(data, "network.bandwidth_gbps is required")

    def test_unknown_field(self) -> None:
        data = variant()
        data["machines"][0]["intra_bandwidth"] = 5
        refused(data, r"machines\[0\] \(m0\)\.intra_bandwidth: unknown field")

    def test_missing_field(self) -> None:
        data = variant()
        del data["machines"][1]["intra_bandwidth_gbps"]
        refused(data, r"machines\[1\] \(m1\)\.intra_bandwidth_gbps: required field is missing")

    def test_missing_count(self) -> None:
        refused(variant(**{"machines.0.gpus": {"type": "T4"}}), r"gpus\.count: required field")

    def test_malformed_gpus(self) -> None:
        refused(variant(**{"machines.0.gpus": "4x T4"}), "gpus must be {type, count} or a list")

    def test_bad_machine_name(self) -> None:
        refused(variant(**{"machines.0.name": "rack/1"}), "machine name 'rack/1' must start")

    def test_gpu_type_defined_twice(self) -> None:
        data = variant()
        entry = {"name": "X", "fp32_tflops": 1, "memory_bandwidth_gb_per_s": 1, "memory_gib": 1}
        data["gpu_types"] = [entry, {**entry, "name": "x"}]
        refused(data, "gpu_types defines 'x' twice")

    def test_not_a_mapping(self) -> None:
        refused([1, 2], "must be a mapping")

    def test_bad_yaml(self) -> None:
        with pytest.raises(InvalidInput, match="not valid"):
            loads_cluster_spec("machines: [unclosed")

    def test_bad_json(self) -> None:
        with pytest.raises(InvalidInput, match="not valid json"):
            loads_cluster_spec("{'single': 'quotes'}", fmt="json")
