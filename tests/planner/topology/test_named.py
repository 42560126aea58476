"""Named clusters: TAG §5.2 testbed, cloud and the random topology generator."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.errors import InvalidInput
from tagplan.planner.topology import (
    Cluster,
    list_named_clusters,
    load_cluster,
    named_cluster_spec,
    random_cluster_spec,
)
from tagplan.planner.topology.named import RANDOM_GPU_TYPES

GBPS = 1e9 / 8
SEEDS = range(200)


def groups_by_type(cluster: Cluster) -> list[tuple[str, int]]:
    return [
        (cluster.type_names[t], int(n))
        for t, n in zip(cluster.group_type, cluster.group_size, strict=True)
    ]


class TestTestbed:
    def test_shape(self) -> None:
        c = load_cluster("testbed")
        assert (c.num_machines, c.num_devices, c.num_groups) == (7, 16, 7)
        assert groups_by_type(c) == [("V100-32GB", 4)] + [("GTX-1080Ti", 2)] * 4 + [("P100", 2)] * 2

    def test_links(self) -> None:
        c = load_cluster("testbed")
        assert c.machine_intra_bandwidth_bytes_per_s[0] == 1200 * GBPS  # NVLink-class
        assert np.all(c.machine_intra_bandwidth_bytes_per_s[1:] == 96 * GBPS)  # PCIe-class
        off = ~np.eye(7, dtype=bool)
        assert np.all(c.machine_bandwidth_bytes_per_s[off] == 100 * GBPS)


class TestCloud:
    def test_shape(self) -> None:
        c = load_cluster("cloud")
        assert (c.num_machines, c.num_devices, c.num_groups) == (6, 32, 6)
        assert groups_by_type(c) == [("V100-16GB", 8)] * 2 + [("T4", 4)] * 4
        off = ~np.eye(6, dtype=bool)
        assert np.all(c.machine_bandwidth_bytes_per_s[off] == 10 * GBPS)


class TestRandom:
    def test_ranges_over_many_seeds(self) -> None:
        machines_seen: set[int] = set()
        types_seen: set[str] = set()
        sizes_seen: set[int] = set()
        for seed in SEEDS:
            c = Cluster.from_spec(random_cluster_spec(seed))
            machines_seen.add(c.num_machines)
            assert 1 <= c.num_machines <= 6
            assert c.num_groups == c.num_machines  # one type per machine
            sizes = np.bincount(c.device_machine)
            assert np.all((sizes >= 1) & (sizes <= 8))
            sizes_seen.update(sizes.tolist())
            types_seen.update(c.type_names)
            intra = c.machine_intra_bandwidth_bytes_per_s / GBPS
            assert np.all((intra >= 64) & (intra <= 160))
            off = ~np.eye(c.num_machines, dtype=bool)
            inter = c.machine_bandwidth_bytes_per_s[off] / GBPS
            assert np.all((inter >= 20) & (inter <= 50))
        assert machines_seen == set(range(1, 7))
        assert sizes_seen == set(range(1, 9))
        assert types_seen == set(RANDOM_GPU_TYPES) and len(types_seen) >= 3

    def test_deterministic_per_seed(self) -> None:
        for seed in (0, 1, 42, 2**40):
            assert random_cluster_spec(seed) == random_cluster_spec(seed)
        specs = {random_cluster_spec(seed).model_dump_json() for seed in range(20)}
        assert len(specs) == 20

    def test_pair_bandwidth_is_the_slower_uplink(self) -> None:
        # Through one switch a pair is limited by the slower machine: the pair matrix
        # has rank-one min structure, so each row's off-diagonal maximum is shared.
        for seed in range(50):
            c = Cluster.from_spec(random_cluster_spec(seed))
            if c.num_machines < 3:
                continue
            bw = c.machine_bandwidth_bytes_per_s.copy()
            np.fill_diagonal(bw, 0)
            uplink = bw.max(axis=1)
            expected = np.minimum.outer(uplink, uplink)
            np.fill_diagonal(expected, 0)
            np.testing.assert_array_equal(bw, expected)

    def test_by_name(self) -> None:
        assert named_cluster_spec("random:5") == random_cluster_spec(5)
        assert load_cluster(" random: 5 ").device_names == load_cluster("random:5").device_names

    @pytest.mark.parametrize("machines", [1, 7, 32])
    def test_a_fixed_number_of_machines_draws_the_rest_alike(self, machines: int) -> None:
        """``random:SEED:M``: exactly M machines, each within TAG's ranges, the first
        ones as ``random:SEED`` draws them when it draws at least as many."""
        spec = named_cluster_spec(f"random:9:{machines}")
        assert spec == random_cluster_spec(9, machines)
        assert len(spec.machines) == machines
        cluster = Cluster.from_spec(spec)
        assert 1 <= cluster.num_devices / machines <= 8
        drawn = random_cluster_spec(9)
        shared = min(machines, len(drawn.machines))
        assert spec.machines[:shared] == drawn.machines[:shared]

    @pytest.mark.parametrize("machines", [0, 33])
    def test_machines_out_of_range(self, machines: int) -> None:
        with pytest.raises(InvalidInput, match="1 to 32 machines"):
            named_cluster_spec(f"random:1:{machines}")


class TestScale:
    @pytest.mark.parametrize("gpus", [16, 64, 256])
    def test_machines_of_eight_of_three_kinds(self, gpus: int) -> None:
        cluster = load_cluster(f"scale:{gpus}")
        assert cluster.num_devices == gpus and cluster.num_machines == gpus // 8
        assert cluster.num_groups == gpus // 8  # one GPU type per machine
        kinds = [str(cluster.type_names[cluster.device_type[d]]) for d in range(0, gpus, 8)]
        assert kinds[:3] == ["V100-32GB", "A100-40GB", "T4"][: len(kinds)]
        bw = cluster.machine_bandwidth_bytes_per_s / 1e9 * 8  # Gbps
        t4 = np.array([k == "T4" for k in kinds])
        off = ~np.eye(len(kinds), dtype=bool)
        expected = np.where(t4[:, None] | t4[None, :], 100.0, 200.0)
        np.testing.assert_allclose(bw[off], expected[off])

    @pytest.mark.parametrize("name", ["scale:12", "scale:8", "scale:2048", "scale:x"])
    def test_bad_sizes(self, name: str) -> None:
        with pytest.raises(InvalidInput, match="scale:N"):
            named_cluster_spec(name)


class TestNames:
    def test_listing(self) -> None:
        listed = list_named_clusters()
        names = ["testbed", "cloud", "random:SEED", "random:SEED:M", "scale:N"]
        assert [c.name for c in listed] == names
        assert all(c.description for c in listed)
        assert all(named_cluster_spec(c.example).machines for c in listed)

    def test_case_insensitive(self) -> None:
        assert named_cluster_spec("TestBed") == named_cluster_spec("testbed")

    @pytest.mark.parametrize("name", ["random:", "random:abc", "random:-1", "random:1.5"])
    def test_malformed_random(self, name: str) -> None:
        with pytest.raises(InvalidInput, match=r"malformed random cluster .*random:SEED"):
            named_cluster_spec(name)

    def test_unknown(self) -> None:
        with pytest.raises(InvalidInput, match=r"unknown named cluster 'lab'.*testbed, cloud"):
            named_cluster_spec("lab")
