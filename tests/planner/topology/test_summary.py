"""describe(): the CLI summary of a cluster."""

from __future__ import annotations

import json

import pytest

from tagplan.planner.topology import describe, fingerprint, load_cluster


def test_testbed_summary() -> None:
    cluster = load_cluster("testbed")
    summary = describe(cluster)
    assert (summary["machines"], summary["gpus"], summary["groups"]) == (7, 16, 7)
    assert summary["gpu_types"] == {"GTX-1080Ti": 8, "P100": 4, "V100-32GB": 4}
    assert summary["total_peak_fp32_tflops"] == pytest.approx(4 * 15.7 + 8 * 11.34 + 4 * 9.3)
    assert summary["total_memory_gib"] == 4 * 32 + 8 * 11 + 4 * 16
    assert summary["machine_list"][0] == {
        "name": "v100-0",
        "gpus": "4x V100-32GB",
        "intra_bandwidth_gbps": 1200.0,
    }
    assert summary["fingerprint"] == fingerprint(cluster)
    json.dumps(summary)  # JSON-ready


def test_mixed_machine_line() -> None:
    cluster = load_cluster(
        {
            "machines": [
                {
                    "name": "a",
                    "intra_bandwidth_gbps": 64,
                    "gpus": [{"index": 0, "type": "T4"}, {"index": 1, "type": "A10"}],
                }
            ]
        }
    )
    assert describe(cluster)["machine_list"][0]["gpus"] == "1x A10, 1x T4"
