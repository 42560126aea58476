"""Unit conversions at the schema boundary (docs/design.md §2: bytes and seconds inside)."""

from __future__ import annotations

import pytest

from tagplan.planner.topology import load_cluster
from tagplan.planner.topology.units import gbps_to_bytes_per_s, gib_to_bytes, us_to_s


class TestConversions:
    def test_gbps(self) -> None:
        assert gbps_to_bytes_per_s(100) == 12.5e9
        assert gbps_to_bytes_per_s(8) == 1e9

    def test_gib(self) -> None:
        assert gib_to_bytes(16) == 17_179_869_184
        assert gib_to_bytes(0.5) == 2**29

    def test_us(self) -> None:
        assert us_to_s(10) == 1e-5
        assert us_to_s(2) == 2e-6


class TestClusterUnits:
    def test_testbed_figures_in_bytes_and_seconds(self) -> None:
        cluster = load_cluster("testbed")
        v100 = cluster.device_index("v100-0/GPU:0")
        p100 = cluster.device_index("p100-0/GPU:0")
        assert cluster.bandwidth_bytes_per_s[v100, p100] == 12.5e9  # 100 Gbps
        assert cluster.bandwidth_bytes_per_s[v100, v100 + 1] == 150e9  # 1200 Gbps
        assert cluster.latency_s[v100, p100] == 1e-5  # default 10 us
        assert cluster.latency_s[v100, v100 + 1] == 2e-6  # default 2 us
        assert cluster.device_memory_bytes[v100] == 32 * 2**30
        assert cluster.device_peak_fp32_flops[v100] == pytest.approx(15.7e12)
        assert cluster.device_memory_bandwidth_bytes_per_s[v100] == 900e9
