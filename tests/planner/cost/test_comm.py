"""Communication closed forms, segmented-linear fits, comm profiles (docs/design.md §3, TAG §4.1.2).

Clusters use round figures: 800 Gbps = 1e11 bytes/s inside a machine (2 us), 80 Gbps =
1e10 bytes/s between machines (10 us); gradients of S = 1e8 bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tagplan.planner.cost.comm import (
    CommEstimate,
    CommModel,
    allreduce_time_s,
    hierarchical_allreduce_time_s,
    p2p_time_s,
    ring_allreduce_time_s,
    tree_allreduce_time_s,
)
from tagplan.planner.cost.comm_profile import (
    COMM_PROFILE_FORMAT,
    CommProfile,
    Measurement,
    P2PModels,
    dump_comm_profile,
    dumps_comm_profile,
    load_comm_profile,
    loads_comm_profile,
    parse_comm_profile,
    profile_from_measurements,
)
from tagplan.planner.cost.comm_profiler import profile_comm
from tagplan.planner.cost.fit import Segment, SegmentedLinear, fit_segmented_linear
from tagplan.planner.errors import InvalidInput
from tagplan.planner.topology import Cluster, load_cluster

S = 1e8
B_INTRA, A_INTRA = 1e11, 2e-6
B_NET, A_NET = 1e10, 10e-6


def machines(*gpus: int, links: list[dict[str, Any]] | None = None) -> Cluster:
    """Machines m0, m1, ... with the given V100 counts on one 80 Gbps switch."""
    return load_cluster(
        {
            "machines": [
                {
                    "name": f"m{i}",
                    "gpus": {"type": "V100-32GB", "count": count},
                    "intra_bandwidth_gbps": 800,
                    "intra_latency_us": 2,
                }
                for i, count in enumerate(gpus)
            ],
            "network": {"bandwidth_gbps": 80, "latency_us": 10, "links": links or []},
        }
    )


@pytest.fixture
def two_by_two() -> Cluster:
    """m0: devices 0, 1; m1: devices 2, 3."""
    return machines(2, 2)


@pytest.fixture
def two_by_four() -> Cluster:
    """m0: devices 0-3; m1: devices 4-7."""
    return machines(4, 4)


class TestP2P:
    def test_same_machine(self, two_by_two: Cluster) -> None:
        assert p2p_time_s(two_by_two, 0, 1, S) == pytest.approx(A_INTRA + S / B_INTRA)
        assert p2p_time_s(two_by_two, 0, 1, S) == pytest.approx(0.001002)

    def test_cross_machine(self, two_by_two: Cluster) -> None:
        assert p2p_time_s(two_by_two, 1, 2, S) == pytest.approx(0.01001)

    def test_same_device_and_zero_bytes_are_free(self, two_by_two: Cluster) -> None:
        assert p2p_time_s(two_by_two, 3, 3, S) == 0.0
        assert p2p_time_s(two_by_two, 0, 2, 0) == 0.0

    def test_vectorized_over_sizes(self, two_by_two: Cluster) -> None:
        seconds = p2p_time_s(two_by_two, 0, 2, np.array([0.0, 1e6, S]))
        assert isinstance(seconds, np.ndarray)
        np.testing.assert_allclose(seconds, [0.0, 1e-5 + 1e-4, 0.01001])
        assert isinstance(p2p_time_s(two_by_two, 0, 2, 10), float)

    @pytest.mark.parametrize(
        ("src", "dst", "nbytes", "match"),
        [(0, 4, 1.0, "dst 4 is not a device"), (-1, 0, 1.0, "src"), (0, 1, -5, "nbytes")],
    )
    def test_bad_input(
        self, two_by_two: Cluster, src: int, dst: int, nbytes: float, match: str
    ) -> None:
        with pytest.raises(InvalidInput, match=match):
            p2p_time_s(two_by_two, src, dst, nbytes)


class TestRingAllReduce:
    def test_two_devices_one_machine(self, two_by_two: Cluster) -> None:
        # 2·1/2·S/B + 2·1·α
        assert ring_allreduce_time_s(two_by_two, [0, 1], S) == pytest.approx(1e-3 + 4e-6)

    def test_two_devices_two_machines(self, two_by_two: Cluster) -> None:
        assert ring_allreduce_time_s(two_by_two, [0, 2], S) == pytest.approx(1e-2 + 2e-5)

    def test_four_devices_bottleneck_and_latency(self, two_by_two: Cluster) -> None:
        # 2·3/4·S/B_net + 2·3·α_net: the ring crosses the network twice.
        expected = 1.5 * S / B_NET + 6 * A_NET
        assert expected == pytest.approx(0.01506)
        assert ring_allreduce_time_s(two_by_two, [0, 1, 2, 3], S) == pytest.approx(expected)

    def test_latency_term_alone_for_tiny_tensors(self, two_by_two: Cluster) -> None:
        assert ring_allreduce_time_s(two_by_two, [0, 1, 2, 3], 1) == pytest.approx(
            1.5 / B_NET + 6 * A_NET
        )

    def test_one_device_and_zero_bytes(self, two_by_two: Cluster) -> None:
        assert ring_allreduce_time_s(two_by_two, [2], S) == 0.0
        np.testing.assert_allclose(
            ring_allreduce_time_s(two_by_two, [0, 1, 2, 3], [0.0, S]), [0.0, 0.01506]
        )

    def test_order_is_the_ring_and_sets_are_sorted(self) -> None:
        # Four one-GPU machines; only the m0-m2 link is slow (8 Gbps, 50 us).
        slow_link = {"between": ["m0", "m2"], "bandwidth_gbps": 8, "latency_us": 50}
        cluster = machines(1, 1, 1, 1, links=[slow_link])
        fast = 1.5 * S / B_NET + 6 * A_NET
        slow = 1.5 * S / 1e9 + 6 * 50e-6
        assert ring_allreduce_time_s(cluster, [0, 1, 2, 3], S) == pytest.approx(fast)
        assert ring_allreduce_time_s(cluster, [0, 2, 1, 3], S) == pytest.approx(slow)
        assert ring_allreduce_time_s(cluster, {3, 1, 0, 2}, S) == pytest.approx(fast)

    def test_bad_devices(self, two_by_two: Cluster) -> None:
        with pytest.raises(InvalidInput, match="twice"):
            ring_allreduce_time_s(two_by_two, [0, 1, 0], S)
        with pytest.raises(InvalidInput, match="at least one device"):
            ring_allreduce_time_s(two_by_two, [], S)
        with pytest.raises(InvalidInput, match="not a device"):
            ring_allreduce_time_s(two_by_two, [0, 9], S)


class TestHierarchicalAllReduce:
    def test_two_by_two(self, two_by_two: Cluster) -> None:
        chain = S / B_INTRA + 1 * A_INTRA  # reduce to the leader (and broadcast back)
        leaders = 2 * 1 / 2 * S / B_NET + 2 * 1 * A_NET  # ring of devices 0 and 2
        expected = 2 * chain + leaders
        assert expected == pytest.approx(0.012024)
        assert hierarchical_allreduce_time_s(two_by_two, [0, 1, 2, 3], S) == pytest.approx(expected)

    def test_uneven_machines_wait_for_the_slowest(self, two_by_two: Cluster) -> None:
        # m0 reduces 0 -> leader 0; m1 has one device (2): same total as 2x2.
        assert hierarchical_allreduce_time_s(two_by_two, [2, 1, 0], S) == pytest.approx(0.012024)

    def test_one_device_per_machine_is_the_ring(self) -> None:
        cluster = machines(1, 1, 1)
        assert hierarchical_allreduce_time_s(cluster, [0, 1, 2], S) == pytest.approx(
            ring_allreduce_time_s(cluster, [0, 1, 2], S)
        )

    def test_auto_takes_the_cheaper(self, two_by_two: Cluster) -> None:
        devices = [0, 1, 2, 3]
        assert allreduce_time_s(two_by_two, devices, S) == pytest.approx(0.01506)
        assert allreduce_time_s(two_by_two, devices, S, "auto") == pytest.approx(0.012024)
        # On one machine the ring wins: 1.004 ms against 2·(1 ms + 2 us).
        assert allreduce_time_s(two_by_two, [0, 1], S, "hierarchical") == pytest.approx(0.002004)
        assert allreduce_time_s(two_by_two, [0, 1], S, "auto") == pytest.approx(0.001004)

    def test_unknown_algorithm(self, two_by_two: Cluster) -> None:
        with pytest.raises(InvalidInput, match="unknown AllReduce algorithm 'butterfly'"):
            allreduce_time_s(two_by_two, [0, 1], S, "butterfly")  # type: ignore[arg-type]


class TestTreeAllReduce:
    def test_two_by_two(self, two_by_two: Cluster) -> None:
        # 2·S/B_net (each link carries S up and S down) + 2·(1 chain hop + ⌈log2 2⌉ level)
        expected = 2 * S / B_NET + 2 * (A_INTRA + A_NET)
        assert tree_allreduce_time_s(two_by_two, [0, 1, 2, 3], S) == pytest.approx(expected)

    def test_latency_grows_with_log_of_machines(self) -> None:
        # 16 one-GPU machines: 4 tree levels each way against the ring's 15 hops each way.
        cluster = machines(*[1] * 16)
        devices = list(range(16))
        assert tree_allreduce_time_s(cluster, devices, 1) == pytest.approx(
            2 / B_NET + 2 * 4 * A_NET
        )
        assert ring_allreduce_time_s(cluster, devices, 1) == pytest.approx(
            2 * 15 / 16 / B_NET + 2 * 15 * A_NET
        )

    def test_one_machine_is_a_chain_slower_than_the_ring(self, two_by_two: Cluster) -> None:
        assert tree_allreduce_time_s(two_by_two, [0, 1], S) == pytest.approx(
            2 * S / B_INTRA + 2 * A_INTRA
        )
        assert allreduce_time_s(two_by_two, [0, 1], S, "nccl") == pytest.approx(
            ring_allreduce_time_s(two_by_two, [0, 1], S)
        )

    def test_one_device_and_zero_bytes(self, two_by_two: Cluster) -> None:
        assert tree_allreduce_time_s(two_by_two, [3], S) == 0.0
        np.testing.assert_allclose(
            tree_allreduce_time_s(two_by_two, [0, 2], [0.0, S]), [0.0, 2 * S / B_NET + 2 * A_NET]
        )

    def test_nccl_switches_to_the_ring_at_the_crossover(self) -> None:
        # M one-GPU machines: ring = tree where 2S/(M·B) = 2α(M-1-⌈log2 M⌉), so
        # S* = M·B·α·(M-1-⌈log2 M⌉) = 16·1e10·1e-5·11 = 17.6 MB.
        cluster = machines(*[1] * 16)
        devices = list(range(16))
        crossover = 16 * B_NET * A_NET * (16 - 1 - 4)
        sizes = np.array([crossover / 2, crossover * 2])
        ring = ring_allreduce_time_s(cluster, devices, sizes)
        tree = tree_allreduce_time_s(cluster, devices, sizes)
        assert tree[0] < ring[0] and ring[1] < tree[1]
        assert tree_allreduce_time_s(cluster, devices, crossover) == pytest.approx(
            ring_allreduce_time_s(cluster, devices, crossover)
        )
        np.testing.assert_allclose(
            allreduce_time_s(cluster, devices, sizes, "nccl"), [tree[0], ring[1]]
        )

    def test_auto_is_the_fastest_of_three(self) -> None:
        cluster = machines(4, 4, 4, 4, 4, 4, 4, 4)
        devices = list(range(32))
        sizes = np.logspace(2, 9, 15)
        fastest = np.minimum.reduce(
            [
                ring_allreduce_time_s(cluster, devices, sizes),
                hierarchical_allreduce_time_s(cluster, devices, sizes),
                tree_allreduce_time_s(cluster, devices, sizes),
            ]
        )
        np.testing.assert_allclose(allreduce_time_s(cluster, devices, sizes, "auto"), fastest)


# --------------------------------------------------------------------------- fitting

SIZES = 2.0 ** np.arange(10, 21)  # 1 KB .. 1 MB


def two_pieces(n: np.ndarray) -> np.ndarray:
    """20 us + 0.1 ns/byte up to 32 KB, then 1 ns/byte (continuous)."""
    knee = 32768.0
    return np.where(n <= knee, 2e-5 + 1e-10 * n, 2e-5 + 1e-10 * knee + 1e-9 * (n - knee))


class TestSegmentedLinear:
    def test_fit_recovers_two_segments_exactly(self) -> None:
        model = fit_segmented_linear(SIZES, two_pieces(SIZES))
        assert model.num_segments == 2
        assert model.breakpoints_bytes == pytest.approx((32768.0,), rel=1e-9)
        first, second = model.segments
        assert first.intercept_s == pytest.approx(2e-5, rel=1e-9)
        assert first.slope_s_per_byte == pytest.approx(1e-10, rel=1e-9)
        assert second.slope_s_per_byte == pytest.approx(1e-9, rel=1e-9)
        assert second.intercept_s == pytest.approx(2e-5 + 3.2768e-6 - 3.2768e-5, rel=1e-7)
        grid = np.geomspace(100, 1e9, 200)
        np.testing.assert_allclose(model.predict(grid), two_pieces(grid), rtol=1e-8)

    def test_repeated_sizes_and_fewer_segments(self) -> None:
        sizes = np.repeat(SIZES, 3)
        model = fit_segmented_linear(sizes, two_pieces(sizes), max_segments=2)
        assert model.breakpoints_bytes == pytest.approx((32768.0,), rel=1e-9)
        line = fit_segmented_linear(SIZES, 1e-5 + 2e-9 * SIZES, max_segments=3)
        assert line.num_segments == 1
        assert line.segments[0].slope_s_per_byte == pytest.approx(2e-9)
        assert fit_segmented_linear(SIZES, two_pieces(SIZES), max_segments=1).num_segments == 1

    def test_predictions_are_monotone_on_noisy_data(self) -> None:
        rng = np.random.default_rng(7)
        sizes = 2.0 ** np.arange(10, 29)
        times = (3e-4 + 1e-9 * sizes) * rng.lognormal(0.0, 0.3, sizes.size)
        model = fit_segmented_linear(sizes, times)
        assert all(s.slope_s_per_byte >= 0 for s in model.segments)
        predicted = model.predict(np.geomspace(1, 1e10, 2000))
        assert np.all(np.diff(predicted) >= 0)
        assert np.all(predicted > 0)

    def test_downward_jump_is_floored(self) -> None:
        model = SegmentedLinear(
            breakpoints_bytes=(1000.0,),
            segments=(
                Segment(intercept_s=1e-3, slope_s_per_byte=0.0),
                Segment(intercept_s=0.0, slope_s_per_byte=1e-7),
            ),
        )
        np.testing.assert_allclose(
            model.predict([999, 1000, 5000, 20000]), [1e-3, 1e-3, 1e-3, 2e-3]
        )
        assert isinstance(model.predict(10), float)

    def test_one_size_gives_a_flat_line(self) -> None:
        model = fit_segmented_linear([4096, 4096], [1e-3, 1e-3])
        assert model.segments == (Segment(intercept_s=1e-3, slope_s_per_byte=0.0),)

    @pytest.mark.parametrize(
        ("sizes", "times", "match"),
        [
            ([1, 2], [1e-3], "as many sizes as times"),
            ([1, 2], [1e-3, 0.0], "times_s must be finite and > 0"),
            ([0, 2], [1e-3, 1e-3], "sizes_bytes"),
        ],
    )
    def test_fit_rejects_bad_data(self, sizes: list[float], times: list[float], match: str) -> None:
        with pytest.raises(InvalidInput, match=match):
            fit_segmented_linear(sizes, times)


# --------------------------------------------------------------------------- profiles


def flat(seconds: float) -> dict[str, Any]:
    return {"breakpoints_bytes": [], "segments": [{"intercept_s": seconds, "slope_s_per_byte": 0}]}


def profile_dict() -> dict[str, Any]:
    return {
        "format": COMM_PROFILE_FORMAT,
        "version": 1,
        "device_kind": "V100-32GB",
        "p2p": {"intra": flat(1.0)},
        "allreduce": {
            "2": {
                "breakpoints_bytes": [65536],
                "segments": [
                    {"intercept_s": 2.0, "slope_s_per_byte": 0.0},
                    {"intercept_s": 2.0, "slope_s_per_byte": 1e-9},
                ],
            }
        },
        "measurements": [
            {"kind": "p2p", "scope": "intra", "devices": 2, "nbytes": 1024, "times_s": [1.0, 1.1]}
        ],
    }


def edited(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    data = profile_dict()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return data


class TestCommProfile:
    def test_round_trip(self, tmp_path: Path) -> None:
        profile = parse_comm_profile(profile_dict())
        file = tmp_path / "comm.json"
        dump_comm_profile(profile, file)
        assert load_comm_profile(file) == profile
        assert loads_comm_profile(dumps_comm_profile(profile)) == profile
        assert json.loads(file.read_text())["format"] == "tagplan.comm-profile"

    @pytest.mark.parametrize(
        ("path", "value", "match"),
        [
            (("format",), "tagplan.profile", "not a comm profile: format is 'tagplan.profile'"),
            (("version",), 2, "unsupported comm-profile version 2"),
            (("extra",), 1, "extra: unknown field"),
            (("device_kind",), " ", "device_kind must name a device type"),
            (("measurements", 0, "times_s"), [1.0, -0.5], "times must be > 0 seconds, got -0.5"),
            (("measurements", 0, "devices"), 3, "p2p measurement is between 2 devices"),
            (("p2p", "intra", "segments", 0, "intercept_s"), -1e-6, "predicts negative times"),
            (("p2p", "intra", "segments", 0, "slope_s_per_byte"), -1e-9, "slope_s_per_byte"),
            (("allreduce", "2", "breakpoints_bytes"), [65536, 65536], "strictly increasing"),
            (("allreduce", "2", "breakpoints_bytes"), [], "2 segments need 1 breakpoints"),
            (("allreduce", "1"), flat(1.0), "allreduce keys are device counts >= 2"),
            (("allreduce", "two"), flat(1.0), "got 'two'"),
        ],
    )
    def test_rejects(self, path: tuple[Any, ...], value: Any, match: str) -> None:
        with pytest.raises(InvalidInput, match=match):
            parse_comm_profile(edited(path, value))

    def test_rejects_missing_format_and_files(self, tmp_path: Path) -> None:
        data = profile_dict()
        del data["format"]
        with pytest.raises(InvalidInput, match="not a comm profile: format is None"):
            parse_comm_profile(data)
        with pytest.raises(InvalidInput, match="not valid JSON"):
            loads_comm_profile("{")
        with pytest.raises(InvalidInput, match="does not exist"):
            load_comm_profile(tmp_path / "missing.json")
        with pytest.raises(InvalidInput, match="must be a JSON object"):
            loads_comm_profile("[]")

    def test_fitted_from_measurements(self) -> None:
        measurements = [
            Measurement(kind=kind, scope="intra", devices=k, nbytes=int(n), times_s=(t, t))
            for kind, k, scale in [("p2p", 2, 1.0), ("allreduce", 3, 2.0)]
            for n, t in zip(SIZES, scale * two_pieces(SIZES), strict=True)
        ]
        profile = profile_from_measurements(measurements, "V100-32GB")
        assert profile.p2p.inter is None
        assert profile.p2p.intra is not None
        assert profile.p2p.intra.breakpoints_bytes == pytest.approx((32768.0,), rel=1e-9)
        assert set(profile.allreduce) == {"3"}
        assert profile.allreduce["3"].predict(1e6) == pytest.approx(2 * two_pieces(1e6))


class TestCommModel:
    def test_without_profile_matches_the_closed_forms(self, two_by_four: Cluster) -> None:
        model = CommModel(two_by_four)
        assert model.p2p_detail(0, 5, S) == CommEstimate(p2p_time_s(two_by_four, 0, 5, S), False)
        assert model.allreduce_time_s([0, 1, 4, 5], S) == allreduce_time_s(
            two_by_four, [0, 1, 4, 5], S, "auto"
        )

    def test_prefers_measured_where_covered(self, two_by_four: Cluster) -> None:
        data = profile_dict()
        data["device_kind"] = "v100-32gb"  # matched ignoring case
        model = CommModel(two_by_four, parse_comm_profile(data))
        assert model.p2p_detail(0, 1, S) == (1.0, True)
        assert model.p2p_detail(0, 1, 0) == (0.0, True)
        assert model.p2p_detail(0, 4, S) == (p2p_time_s(two_by_four, 0, 4, S), False)  # no inter
        seconds, measured = model.allreduce_detail([1, 2], S)
        assert (seconds, measured) == (pytest.approx(2.0 + 1e-9 * S), True)
        np.testing.assert_allclose(
            model.allreduce_time_s([1, 2], [1024, 65536 * 2]), [2.0, 2.0 + 1.31072e-4]
        )
        # AllReduce across machines, of an unprofiled size or asked hierarchical: closed form.
        assert model.allreduce_detail([0, 4], S).measured is False
        assert model.allreduce_detail([0, 1, 2], S).measured is False
        assert model.allreduce_detail([1, 2], S, "hierarchical").measured is False

    def test_other_device_kind_is_not_covered(self, two_by_four: Cluster) -> None:
        profile = parse_comm_profile(edited(("device_kind",), "CPU"))
        model = CommModel(two_by_four, profile)
        assert model.p2p_detail(0, 1, S) == (p2p_time_s(two_by_four, 0, 1, S), False)
        assert "profile of CPU" in repr(model)

    def test_profile_object_in_python(self, two_by_two: Cluster) -> None:
        line = SegmentedLinear(segments=(Segment(intercept_s=0.5, slope_s_per_byte=0.0),))
        profile = CommProfile(device_kind="V100-32GB", p2p=P2PModels(intra=line))
        assert CommModel(two_by_two, profile).p2p_time_s(0, 1, 10) == 0.5


@pytest.mark.tf
def test_profile_comm_on_virtual_cpu_devices() -> None:
    """Measures 1 KB .. 4 MB: below ~1 MB a CPU copy is hidden by the call overhead."""
    pytest.importorskip("tensorflow")
    profile = profile_comm(devices=2, max_bytes=4 << 20, repeats=3)
    assert parse_comm_profile(json.loads(dumps_comm_profile(profile))) == profile
    assert profile.device_kind == "CPU"
    assert profile.p2p.intra is not None
    assert profile.p2p.inter is None
    assert set(profile.allreduce) == {"2"}
    sizes = [1024 << i for i in range(13)]
    for kind in ("p2p", "allreduce"):
        runs = [m for m in profile.measurements if m.kind == kind]
        assert [m.nbytes for m in runs] == sizes
        assert all(len(m.times_s) == 3 and min(m.times_s) > 0 for m in runs)
        assert runs[-1].median_s > runs[0].median_s
    for model in (profile.p2p.intra, profile.allreduce["2"]):
        predicted = np.asarray(model.predict(np.array(sizes, dtype=float)))
        assert np.all(predicted > 0)
        assert np.all(np.diff(predicted) >= 0)
        assert predicted[-1] > predicted[0]
