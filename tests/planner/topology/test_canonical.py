"""Canonical fingerprint: invariant to naming and numbering, sensitive to everything else."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.topology import (
    Cluster,
    ClusterSpec,
    builtin_catalog,
    canonical_order,
    fingerprint,
    load_cluster,
    map_devices,
    map_groups,
    named_cluster_spec,
    random_cluster_spec,
)

Respell = Callable[[ClusterSpec, int], dict[str, Any]]

CYCLE = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 0)]
TWO_TRIANGLES = [(0, 1), (1, 2), (2, 0), (3, 4), (4, 5), (5, 3)]
PETERSEN = (
    [(i, (i + 1) % 5) for i in range(5)]
    + [(i, i + 5) for i in range(5)]
    + [(5 + i, 5 + (i + 2) % 5) for i in range(5)]
)
PRISM = (
    [(i, (i + 1) % 5) for i in range(5)]
    + [(i, i + 5) for i in range(5)]
    + [(5 + i, 5 + (i + 1) % 5) for i in range(5)]
)


def fast_links(n: int, edges: list[tuple[int, int]]) -> ClusterSpec:
    """``n`` identical machines on a 10 Gbps network with 40 Gbps links on ``edges``:
    a pattern Weisfeiler-Lehman refinement alone cannot tell apart."""
    return ClusterSpec.model_validate(
        {
            "machines": [
                {"name": f"n{i}", "gpus": {"type": "T4", "count": 2}, "intra_bandwidth_gbps": 96}
                for i in range(n)
            ],
            "network": {
                "bandwidth_gbps": 10,
                "links": [{"between": [f"n{a}", f"n{b}"], "bandwidth_gbps": 40} for a, b in edges],
            },
        }
    )


def edited(spec: ClusterSpec, edit: Callable[[dict[str, Any]], None]) -> Cluster:
    data = spec.model_dump(mode="json", exclude_none=True)
    edit(data)
    return load_cluster(data)


class TestInvariance:
    @pytest.mark.parametrize("name", ["testbed", "cloud"])
    def test_named_respelled(self, name: str, respelled: Respell) -> None:
        spec = named_cluster_spec(name)
        expected = fingerprint(Cluster.from_spec(spec))
        for seed in range(10):
            assert fingerprint(load_cluster(respelled(spec, seed))) == expected

    def test_random_with_links_respelled(self, respelled: Respell) -> None:
        for seed in range(40):
            spec = random_cluster_spec(seed)
            expected = canonical_order(Cluster.from_spec(spec))
            assert expected.exact
            for shuffle in range(3):
                other = load_cluster(respelled(spec, 1000 * seed + shuffle))
                assert fingerprint(other) == expected.fingerprint

    @pytest.mark.parametrize("edges", [CYCLE, TWO_TRIANGLES, PETERSEN, PRISM])
    def test_regular_link_patterns_respelled(self, edges: list, respelled: Respell) -> None:
        spec = fast_links(max(max(e) for e in edges) + 1, edges)
        order = canonical_order(Cluster.from_spec(spec))
        assert order.exact
        for seed in range(8):
            assert fingerprint(load_cluster(respelled(spec, seed))) == order.fingerprint

    def test_type_spelling_and_explicit_defaults(self) -> None:
        base = fingerprint(load_cluster("testbed"))

        def respell(data: dict[str, Any]) -> None:
            data["machines"][0]["gpus"]["type"] = "v100-32GB"
            data["machines"][1]["intra_latency_us"] = 2.0
            data["network"]["links"] = [{"between": ["p100-0", "v100-0"], "bandwidth_gbps": 100}]

        assert fingerprint(edited(named_cluster_spec("testbed"), respell)) == base

    def test_single_machine(self) -> None:
        c = load_cluster(
            {
                "machines": [
                    {
                        "name": "a",
                        "gpus": {"type": "H100", "count": 8},
                        "intra_bandwidth_gbps": 3600,
                    }
                ]
            }
        )
        order = canonical_order(c)
        assert order.exact and order.device_to_canonical.tolist() == list(range(8))


class TestSensitivity:
    EDITS: ClassVar[dict[str, Callable[[dict[str, Any]], None]]] = {
        "intra bandwidth": lambda d: d["machines"][3].update(intra_bandwidth_gbps=97),
        "intra latency": lambda d: d["machines"][3].update(intra_latency_us=3),
        "network bandwidth": lambda d: d["network"].update(bandwidth_gbps=99),
        "network latency": lambda d: d["network"].update(latency_us=11),
        "one link": lambda d: d["network"].update(
            links=[{"between": ["gtx1080ti-0", "p100-1"], "bandwidth_gbps": 50}]
        ),
        "one link latency": lambda d: d["network"].update(
            links=[{"between": ["gtx1080ti-0", "p100-1"], "bandwidth_gbps": 100, "latency_us": 20}]
        ),
        "one GPU type": lambda d: d["machines"][6]["gpus"].update(type="T4"),
        "one GPU count": lambda d: d["machines"][6]["gpus"].update(count=3),
        "catalog figure": lambda d: d.update(
            gpu_types=[
                {
                    "name": "P100",
                    "fp32_tflops": 10.6,
                    "memory_bandwidth_gb_per_s": 732,
                    "memory_gib": 16,
                }
            ]
        ),
        **{
            f"catalog {field}": lambda d, update=update: d.update(
                gpu_types=[{**builtin_catalog()["P100"].model_dump(), **update}]
            )
            for field, update in {
                "tf32 peak": {"tf32_tflops": 40.0},
                "winograd": {"winograd": False},
                "tile": {"gemm_tile": 128},
                "multiprocessors": {"multiprocessors": 80},
            }.items()
        },
    }

    @pytest.mark.parametrize("change", sorted(EDITS))
    def test_change_alters_fingerprint(self, change: str) -> None:
        base = fingerprint(load_cluster("testbed"))
        assert fingerprint(edited(named_cluster_spec("testbed"), self.EDITS[change])) != base

    def test_non_isomorphic_link_patterns_differ(self) -> None:
        assert fingerprint(Cluster.from_spec(fast_links(6, CYCLE))) != fingerprint(
            Cluster.from_spec(fast_links(6, TWO_TRIANGLES))
        )
        assert fingerprint(Cluster.from_spec(fast_links(10, PETERSEN))) != fingerprint(
            Cluster.from_spec(fast_links(10, PRISM))
        )

    def test_which_machine_gets_the_link_matters(self) -> None:
        # A fast link between two GTX machines is not a fast link between a GTX and a P100.
        def gtx_pair(d: dict[str, Any]) -> None:
            d["network"]["links"] = [
                {"between": ["gtx1080ti-0", "gtx1080ti-1"], "bandwidth_gbps": 200}
            ]

        def mixed_pair(d: dict[str, Any]) -> None:
            d["network"]["links"] = [{"between": ["gtx1080ti-0", "p100-0"], "bandwidth_gbps": 200}]

        spec = named_cluster_spec("testbed")
        assert fingerprint(edited(spec, gtx_pair)) != fingerprint(edited(spec, mixed_pair))


class TestMapping:
    def assert_isomorphism(self, a: Cluster, b: Cluster) -> None:
        devices = map_devices(a, b)
        assert sorted(devices.tolist()) == list(range(a.num_devices))
        for k, j in enumerate(devices):
            assert a.type_names[a.device_type[k]] == b.type_names[b.device_type[j]]
            ma, mb = a.device_machine[k], b.device_machine[j]
            assert sorted(a.device_type[a.device_machine == ma].tolist()) == sorted(
                b.device_type[b.device_machine == mb].tolist()
            )
            assert (
                a.machine_intra_bandwidth_bytes_per_s[ma]
                == b.machine_intra_bandwidth_bytes_per_s[mb]
            )
        np.testing.assert_array_equal(
            b.bandwidth_bytes_per_s[np.ix_(devices, devices)], a.bandwidth_bytes_per_s
        )
        np.testing.assert_array_equal(b.latency_s[np.ix_(devices, devices)], a.latency_s)
        groups = map_groups(a, b)
        np.testing.assert_array_equal(groups[a.group_of_device], b.group_of_device[devices])
        np.testing.assert_array_equal(b.group_size[groups], a.group_size)

    @pytest.mark.parametrize("name", ["testbed", "cloud", "random:3", "random:11"])
    def test_device_k_maps_to_an_equivalent_device(self, name: str, respelled: Respell) -> None:
        a = load_cluster(name)
        for seed in range(5):
            self.assert_isomorphism(a, load_cluster(respelled(a.to_spec(), seed)))

    def test_link_pattern_mapping(self, respelled: Respell) -> None:
        a = Cluster.from_spec(fast_links(10, PETERSEN))
        for seed in range(3):
            self.assert_isomorphism(a, load_cluster(respelled(a.to_spec(), seed)))

    def test_permutations_are_inverse(self) -> None:
        order = canonical_order(load_cluster("random:4"))
        n = order.device_to_canonical.size
        assert order.canonical_to_device[order.device_to_canonical].tolist() == list(range(n))
        assert sorted(order.machine_to_canonical.tolist()) == list(
            range(order.machine_to_canonical.size)
        )

    def test_different_clusters_refuse(self) -> None:
        with pytest.raises(InvalidInput, match="the clusters differ"):
            map_devices(load_cluster("testbed"), load_cluster("cloud"))


class TestSearchLimits:
    def test_leaf_limit_is_reported(self) -> None:
        c = Cluster.from_spec(fast_links(10, PETERSEN))
        order = canonical_order(c, max_leaves=1)
        assert not order.exact
        assert order.fingerprint == canonical_order(c, max_leaves=1).fingerprint  # deterministic
        assert sorted(order.device_to_canonical.tolist()) == list(range(c.num_devices))

    def test_many_identical_machines_are_fast(self) -> None:
        spec = fast_links(128, [])
        start = time.perf_counter()
        order = canonical_order(Cluster.from_spec(spec))
        assert order.exact and time.perf_counter() - start < 1.0
