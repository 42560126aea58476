"""The resolved cluster: arrays, device groups (TAG §4.2) and path figures."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.topology import Cluster, load_cluster, parse_cluster_spec

GBPS = 1e9 / 8


def three_machines() -> Cluster:
    """m0: 2x V100-32GB, m1: mixed T4/A10 by index, m2: 1x P100; one slow, slow-latency link."""
    return load_cluster(
        {
            "machines": [
                {
                    "name": "m0",
                    "gpus": {"type": "V100-32GB", "count": 2},
                    "intra_bandwidth_gbps": 1200,
                    "intra_latency_us": 1,
                },
                {
                    "name": "m1",
                    "intra_bandwidth_gbps": 96,
                    "gpus": [
                        {"index": 0, "type": "T4"},
                        {"index": 3, "type": "T4"},
                        {"index": 1, "type": "A10"},
                    ],
                },
                {"name": "m2", "gpus": {"type": "P100", "count": 1}, "intra_bandwidth_gbps": 64},
            ],
            "network": {
                "bandwidth_gbps": 40,
                "latency_us": 10,
                "links": [{"between": ["m2", "m0"], "bandwidth_gbps": 25, "latency_us": 50}],
            },
        }
    )


class TestDevices:
    def test_order_names_and_dtypes(self) -> None:
        c = three_machines()
        assert c.device_names == (
            "m0/GPU:0",
            "m0/GPU:1",
            "m1/GPU:0",
            "m1/GPU:1",
            "m1/GPU:3",
            "m2/GPU:0",
        )
        assert c.device_machine.tolist() == [0, 0, 1, 1, 1, 2]
        assert c.device_local_index.tolist() == [0, 1, 0, 1, 3, 0]
        assert c.type_names == ("A10", "P100", "T4", "V100-32GB")
        assert [c.type_names[t] for t in c.device_type] == [
            "V100-32GB",
            "V100-32GB",
            "T4",
            "A10",
            "T4",
            "P100",
        ]
        for name in ("device_machine", "device_local_index", "device_type", "group_of_device"):
            assert getattr(c, name).dtype == np.int32
        assert c.type_memory_bytes.dtype == np.int64
        assert c.type_peak_fp32_flops.dtype == np.float64
        assert c.bandwidth_bytes_per_s.shape == (6, 6)

    def test_per_device_figures_follow_type(self) -> None:
        c = three_machines()
        np.testing.assert_array_equal(
            c.device_peak_fp32_flops, c.type_peak_fp32_flops[c.device_type]
        )
        np.testing.assert_array_equal(c.device_memory_bytes, c.type_memory_bytes[c.device_type])
        assert c.device_memory_bytes[5] == 16 * 2**30

    def test_fp16_falls_back_to_fp32_when_unknown(self) -> None:
        c = load_cluster(
            {
                "gpu_types": [
                    {"name": "X", "fp32_tflops": 2, "memory_bandwidth_gb_per_s": 1, "memory_gib": 1}
                ],
                "machines": [
                    {"name": "a", "gpus": {"type": "X", "count": 1}, "intra_bandwidth_gbps": 1}
                ],
            }
        )
        assert c.type_peak_fp16_flops[0] == c.type_peak_fp32_flops[0] == 2e12
        assert c.type_peak_tf32_flops[0] == 2e12  # no TF32 tensor cores: the FP32 rate
        assert c.type_winograd.dtype == bool and c.type_winograd[0]
        assert c.type_gemm_tile[0] == 0  # no tiles unless the type names them
        assert c.type_multiprocessors[0] == 0  # no multiprocessor count unless named

    def test_tf32_peak_and_winograd_per_type(self) -> None:
        c = load_cluster(
            {
                "gpu_types": [
                    {
                        "name": "X",
                        "fp32_tflops": 2,
                        "tf32_tflops": 8,
                        "memory_bandwidth_gb_per_s": 1,
                        "memory_gib": 1,
                        "winograd": False,
                        "gemm_tile": 64,
                        "multiprocessors": 40,
                    }
                ],
                "machines": [
                    {"name": "a", "gpus": {"type": "X", "count": 1}, "intra_bandwidth_gbps": 1}
                ],
            }
        )
        assert c.type_peak_tf32_flops[0] == 8e12 and not c.type_winograd[0]
        assert c.type_gemm_tile[0] == 64 and c.type_multiprocessors[0] == 40

    def test_arrays_are_read_only(self) -> None:
        c = three_machines()
        with pytest.raises(ValueError, match="read-only"):
            c.bandwidth_bytes_per_s[0, 1] = 1.0

    def test_device_index(self) -> None:
        c = three_machines()
        assert c.device_index("m1/GPU:3") == 4
        with pytest.raises(InvalidInput, match="unknown device 'm1/GPU:2'"):
            c.device_index("m1/GPU:2")


class TestLinks:
    def test_bandwidth_matrix(self) -> None:
        bw = three_machines().bandwidth_bytes_per_s
        assert np.all(np.isinf(np.diag(bw)))
        np.testing.assert_array_equal(bw, bw.T)
        assert bw[0, 1] == 1200 * GBPS  # intra m0
        assert bw[2, 4] == 96 * GBPS  # intra m1
        assert bw[0, 2] == 40 * GBPS  # default network
        assert bw[0, 5] == bw[5, 1] == 25 * GBPS  # override, either direction

    def test_latency_matrix(self) -> None:
        lat = three_machines().latency_s
        assert np.all(np.diag(lat) == 0)
        assert lat[0, 1] == 1e-6 and lat[2, 3] == 2e-6  # explicit / default intra
        assert lat[0, 2] == 1e-5 and lat[0, 5] == 5e-5

    def test_path(self) -> None:
        c = three_machines()
        assert c.path(0, 0) == ("device", float("inf"), 0.0)
        assert c.path(0, 1) == ("intra", 1200 * GBPS, 1e-6)
        assert c.path(5, 0) == ("inter", 25 * GBPS, 5e-5)

    def test_min_bandwidth(self) -> None:
        c = three_machines()
        assert c.min_bandwidth_bytes_per_s([0]) == float("inf")
        assert c.min_bandwidth_bytes_per_s([0, 1]) == 1200 * GBPS
        assert c.min_bandwidth_bytes_per_s([0, 1, 2]) == 40 * GBPS
        assert c.min_bandwidth_bytes_per_s(np.arange(6)) == 25 * GBPS

    def test_machine_matrices(self) -> None:
        c = three_machines()
        np.testing.assert_array_equal(
            c.machine_bandwidth_bytes_per_s / GBPS, [[1200, 40, 25], [40, 96, 40], [25, 40, 64]]
        )
        np.testing.assert_array_equal(c.machine_intra_latency_s, [1e-6, 2e-6, 2e-6])


class TestGroups:
    def test_one_group_per_machine_and_type(self) -> None:
        c = three_machines()
        assert c.group_names == ("m0/V100-32GB", "m1/A10", "m1/T4", "m2/P100")
        assert c.group_machine.tolist() == [0, 1, 1, 2]
        assert c.group_size.tolist() == [2, 1, 2, 1]
        assert c.group_of_device.tolist() == [0, 0, 2, 1, 2, 3]
        assert c.group_devices(2).tolist() == [2, 4]  # not contiguous: index 1 is the A10
        for g in range(c.num_groups):
            members = c.group_devices(g)
            assert np.all(c.group_of_device[members] == g)
            assert np.all(c.device_type[members] == c.group_type[g])

    def test_group_bandwidths(self) -> None:
        c = three_machines()
        np.testing.assert_array_equal(
            c.group_intra_bandwidth_bytes_per_s / GBPS, [1200, 96, 96, 64]
        )
        np.testing.assert_array_equal(
            c.group_bandwidth_bytes_per_s / GBPS,
            [[1200, 40, 40, 25], [40, 96, 96, 40], [40, 96, 96, 40], [25, 40, 40, 64]],
        )
        assert c.group_latency_s[0, 3] == 5e-5 and c.group_latency_s[1, 2] == 2e-6

    def test_testbed_groups(self) -> None:
        c = load_cluster("testbed")
        assert c.num_groups == 7
        assert np.all(c.group_bandwidth_bytes_per_s[~np.eye(7, dtype=bool)] == 100 * GBPS)
        assert c.group_intra_bandwidth_bytes_per_s.tolist() == [1200 * GBPS] + [96 * GBPS] * 6


class TestSpecRoundTrip:
    def test_to_spec_rebuilds_the_same_cluster(self) -> None:
        c = three_machines()
        again = Cluster.from_spec(parse_cluster_spec(c.to_spec().model_dump()))
        assert again.device_names == c.device_names
        np.testing.assert_array_equal(again.bandwidth_bytes_per_s, c.bandwidth_bytes_per_s)
        np.testing.assert_array_equal(again.latency_s, c.latency_s)

    def test_to_spec_is_a_copy(self) -> None:
        c = three_machines()
        spec = c.to_spec()
        spec.machines[0].name = "changed"
        assert c.to_spec().machines[0].name == "m0"

    def test_repr(self) -> None:
        assert repr(three_machines()).startswith("Cluster(3 machines, 6 GPUs, 4 device groups")
