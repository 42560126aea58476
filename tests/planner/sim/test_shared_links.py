"""Shared links (the engine's default link model): max-min fair bandwidth sharing.

Tiny graphs with known answers, then traffic patterns on a cluster of 8 machines of
8 P100 at 10 Gbps whose answers follow from the busiest link: each within 5%, and the
exact figure with latencies where the schedule has one.
"""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.compile.links import LinkLayout, latency_part_s, ring_bytes_per_link
from tagplan.planner.cost.comm import p2p_time_s, ring_allreduce_time_s
from tagplan.planner.errors import InvalidInput
from tagplan.planner.sim.simulate import simulate
from tagplan.planner.topology import Cluster
from tests.planner.clusters import gpus
from tests.planner.sim.builders import Task, build, collective, compute, transfer

MB = 10**6
NETWORK_BYTES_PER_S = 10e9 / 8


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return gpus("P100", 8, 8, network_gbps=10)


def _send(layout: LinkLayout, src: int, dst: int, nbytes: int) -> Task:
    """A point-to-point copy as the compiler makes it: links, shares, latency part."""
    seconds = float(p2p_time_s(layout.cluster, src, dst, nbytes))
    route = layout.path(src, dst)
    return transfer(
        route.links,
        seconds,
        shares=route.shares,
        latency_s=latency_part_s(seconds, nbytes / route.rate_bytes_per_s),
    )


def _graph(layout: LinkLayout, tasks: list[Task], edges: list[tuple[int, int]] = ()):
    return build(tasks, edges, num_devices=layout.cluster.num_devices, num_links=layout.num_links)


class TestSharingRule:
    def test_equal_flows_on_one_link_share_it(self) -> None:
        result = simulate(build([transfer([0], 2.0), transfer([0], 3.0)], num_links=1))
        np.testing.assert_array_equal(result.start_s, [0.0, 0.0])
        np.testing.assert_allclose(result.finish_s, [4.0, 5.0])
        np.testing.assert_allclose(result.link_busy_s, [5.0])

    def test_a_share_of_k_stands_for_k_equal_flows(self) -> None:
        # three equal flows beside a fourth on link 0, then one flow of three times the share
        equal = [transfer([0, 1], 2.0, shares=[0.5, 1.0]) for _ in range(3)]
        other = transfer([0], 1.0, shares=[1.0])
        apart = simulate(build([*equal, other], num_links=2))
        joined = simulate(build([transfer([0, 1], 2.0, shares=[1.5, 3.0]), other], num_links=2))
        np.testing.assert_allclose(joined.finish_s, apart.finish_s[[0, 3]], rtol=1e-12)
        np.testing.assert_allclose(joined.link_busy_s, apart.link_busy_s, rtol=1e-12)

    def test_max_min_fair_with_two_bottlenecks(self) -> None:
        # Link 1 carries B, C, D (a third each); A takes the two thirds B leaves on link 0.
        tasks = [transfer([0], 3.0), transfer([0, 1], 3.0), transfer([1], 3.0), transfer([1], 3.0)]
        result = simulate(build(tasks, num_links=2))
        np.testing.assert_allclose(result.finish_s, [4.5, 9.0, 9.0, 9.0])
        np.testing.assert_allclose(result.link_busy_s, [6.0, 9.0])

    def test_latency_is_paid_before_the_bytes(self) -> None:
        # Task 0 waits 1 s of latency while task 1 has the link to itself.
        tasks = [transfer([0], 2.0, latency_s=1.0), transfer([0], 1.0)]
        result = simulate(build(tasks, num_links=1))
        np.testing.assert_allclose(result.finish_s, [2.0, 1.0])
        np.testing.assert_allclose(result.link_busy_s, [2.0])

    def test_shares_below_one(self) -> None:
        two = simulate(build([transfer([0], 1.0, shares=[0.5])] * 2, num_links=1))
        np.testing.assert_allclose(two.finish_s, [1.0, 1.0])
        three = simulate(build([transfer([0], 1.0, shares=[0.5])] * 3, num_links=1))
        np.testing.assert_allclose(three.finish_s, [1.5, 1.5, 1.5])
        np.testing.assert_allclose(three.link_busy_s, [1.5])

    def test_collectives_of_one_communicator_run_one_at_a_time(self) -> None:
        tasks = [collective([0, 1], 2.0), collective([0, 1], 2.0), transfer([1], 2.0)]
        result = simulate(build(tasks, num_links=2))
        # The first collective shares link 1 with the transfer, the second waits for it.
        np.testing.assert_allclose(result.start_s, [0.0, 4.0, 0.0])
        np.testing.assert_allclose(result.finish_s, [4.0, 6.0, 4.0])

    def test_a_link_with_traffic_is_never_idle(self) -> None:
        # Flows of random sizes arrive at random times (each after a compute task on its
        # own device) over link 0, and over links they cannot fill. Link 0 works whenever
        # it has traffic, so the last flow ends at max_i (a_i + the work arriving from a_i).
        rng = np.random.default_rng(5)
        for _ in range(20):
            k = int(rng.integers(2, 12))
            work = rng.uniform(0.1, 2.0, k)
            arrival = rng.uniform(0.0, 3.0, k)
            gates = [compute(i, float(a)) for i, a in enumerate(arrival)]
            flows = [
                transfer([0, 1 + i % 3], float(w), shares=[1.0, 0.5 / k])
                for i, w in enumerate(work)
            ]
            tg = build(gates + flows, [(i, k + i) for i in range(k)], num_devices=k, num_links=4)
            result = simulate(tg)
            expected = max(a + work[arrival >= a].sum() for a in arrival)
            assert result.step_time_s == pytest.approx(expected, rel=1e-9)
            assert result.link_busy_s[0] == pytest.approx(work.sum(), rel=1e-9)

    def test_routes_coming_and_going_match_per_flow_max_min(self) -> None:
        # Flows over random link sets (few distinct routes, so routes gain and lose flows
        # again and again) arrive after compute tasks and after each other; every finish
        # must match an event loop that shares the links among single flows.
        rng = np.random.default_rng(11)
        for _ in range(15):
            num_links, k = 5, int(rng.integers(8, 30))
            routes = []
            for _ in range(4):
                links = sorted(rng.choice(num_links, int(rng.integers(1, 4)), replace=False))
                routes.append(([int(x) for x in links], rng.uniform(0.2, 1.5, len(links))))
            gates = [compute(0, float(a)) for a in rng.uniform(0.0, 2.0, k)]
            picked = rng.integers(len(routes), size=k)
            work = rng.uniform(0.1, 1.5, k)
            flows = [
                transfer(routes[r][0], float(w), shares=routes[r][1].tolist())
                for r, w in zip(picked, work, strict=True)
            ]
            edges = [(i, k + i) for i in range(k)]
            edges += [(k + i, k + i + 3) for i in range(0, k - 3, 4)]  # chains of flows
            result = simulate(build(gates + flows, edges, num_devices=1, num_links=num_links))
            expected = _per_flow_max_min(
                result.finish_s[:k], [routes[r] for r in picked], work, edges, k
            )
            np.testing.assert_allclose(result.finish_s[k:], expected, rtol=1e-9)

    def test_compute_tasks_still_queue_for_their_device(self) -> None:
        tasks = [compute(0, 2.0), compute(0, 1.0, priority=5.0), transfer([0], 1.0)]
        fifo = simulate(build(tasks, num_links=1))
        ranked = simulate(build(tasks, num_links=1), use_priority=True)
        np.testing.assert_array_equal(fifo.start_s, [0.0, 2.0, 0.0])
        np.testing.assert_array_equal(ranked.start_s, [1.0, 0.0, 0.0])

    def test_unknown_link_model(self) -> None:
        with pytest.raises(InvalidInput, match="link model"):
            simulate(build([transfer([0], 1.0)], num_links=1), link_model="fair")  # type: ignore[arg-type]


class TestTrafficPatterns:
    def test_incast(self, cluster: Cluster) -> None:
        # GPU 0 of machines 1..7 each send 100 MB to GPU 0 of machine 0.
        layout, nbytes = LinkLayout(cluster), 100 * MB
        tasks = [_send(layout, 8 * m, 0, nbytes) for m in range(1, 8)]
        result = simulate(_graph(layout, tasks))
        analytic = 7 * nbytes / NETWORK_BYTES_PER_S
        assert result.step_time_s == pytest.approx(analytic, rel=0.05)
        assert result.step_time_s == pytest.approx(analytic + cluster.latency_s[8, 0], rel=1e-9)
        downlink = layout.names.index("m0/downlink")
        assert result.link_busy_s[downlink] == pytest.approx(analytic, rel=1e-9)

    @pytest.mark.parametrize("machines", [2, 4, 8])
    def test_all_to_all(self, cluster: Cluster, machines: int) -> None:
        # GPU 0 of each machine sends 50 MB to GPU 0 of every other machine.
        layout, nbytes = LinkLayout(cluster), 50 * MB
        tasks = [
            _send(layout, 8 * a, 8 * b, nbytes)
            for a in range(machines)
            for b in range(machines)
            if a != b
        ]
        result = simulate(_graph(layout, tasks))
        analytic = (machines - 1) * nbytes / NETWORK_BYTES_PER_S
        assert result.step_time_s == pytest.approx(analytic, rel=0.05)
        assert result.step_time_s == pytest.approx(analytic + cluster.latency_s[0, 8], rel=1e-9)

    def test_ring_allreduce_alone_keeps_its_formula(self, cluster: Cluster) -> None:
        layout, nbytes = LinkLayout(cluster), 100 * MB
        members = tuple(range(cluster.num_devices))
        seconds = float(ring_allreduce_time_s(cluster, members, nbytes))
        route = layout.ring(members)
        bandwidth_s = ring_bytes_per_link(len(members), nbytes) / route.rate_bytes_per_s
        task = collective(
            route.links,
            seconds,
            shares=route.shares,
            latency_s=latency_part_s(seconds, bandwidth_s),
        )
        result = simulate(_graph(layout, [task]))
        assert result.step_time_s == pytest.approx(seconds, rel=1e-12)
        uplink = layout.names.index("m3/uplink")
        assert result.link_busy_s[uplink] == pytest.approx(bandwidth_s, rel=1e-12)

    def test_parameter_server_push_and_pull(self, cluster: Cluster) -> None:
        # Every GPU pushes a 20 MB gradient to the server (GPU 0 of machine 0), which sums
        # them and sends the parameter back: the server machine's downlink, then uplink,
        # carry 56 copies each.
        layout, nbytes, add_s = LinkLayout(cluster), 20 * MB, 1e-3
        workers = range(1, cluster.num_devices)
        pushes = [_send(layout, w, 0, nbytes) for w in workers]
        pulls = [_send(layout, 0, w, nbytes) for w in workers]
        tasks = [*pushes, compute(0, add_s), *pulls]
        addn = len(pushes)
        edges = [(i, addn) for i in range(addn)] + [(addn, addn + 1 + i) for i in range(addn)]
        result = simulate(_graph(layout, tasks, edges))
        analytic = 2 * 56 * nbytes / NETWORK_BYTES_PER_S
        assert result.step_time_s == pytest.approx(analytic, rel=0.05)
        # Exactly: the pushes, then the pulls, serialized on the server machine's NIC, each
        # direction paying one network latency as its copies pipeline.
        remote = 8  # a GPU of another machine
        nic_s = 56 * nbytes / cluster.bandwidth_bytes_per_s[remote, 0]
        one_way_s = nic_s + cluster.latency_s[remote, 0]
        assert result.step_time_s == pytest.approx(2 * one_way_s + add_s, rel=1e-9)
        for name in ("m0/downlink", "m0/uplink"):
            busy = result.link_busy_s[layout.names.index(name)]
            assert busy == pytest.approx(56 * nbytes / NETWORK_BYTES_PER_S, rel=1e-9)


def _per_flow_max_min(
    gate_finish_s: np.ndarray,
    routes: list[tuple[list[int], np.ndarray]],
    work: np.ndarray,
    edges: list[tuple[int, int]],
    k: int,
) -> np.ndarray:
    """Finish times of flows ``k .. 2k-1`` (flow ``i`` over ``routes[i]`` with ``work[i]``
    seconds alone), each starting when its gate and flow predecessors have finished, the
    links shared max-min fairly among single flows by progressive filling."""
    preds: dict[int, list[int]] = {i: [] for i in range(k)}
    for a, b in edges:
        preds[b - k].append(a)
    finish = {i: float(t) for i, t in enumerate(gate_finish_s)}
    left = {i: float(w) for i, w in enumerate(work)}
    active: set[int] = set()
    t, done = 0.0, np.zeros(k)
    while left:
        for i in list(left):
            if i not in active and all(p in finish and finish[p] <= t for p in preds[i]):
                active.add(i)
        if not active:
            t = min(finish[p] for i in left for p in preds[i] if p in finish and finish[p] > t)
            continue
        speed = dict.fromkeys(active, 0.0)
        frozen: set[int] = set()
        room = dict.fromkeys(range(8), 1.0)
        level = 0.0
        while len(frozen) < len(active):
            load = {
                link: sum(
                    routes[i][1][j]
                    for i in active - frozen
                    for j, x in enumerate(routes[i][0])
                    if x == link
                )
                for link in room
            }
            step = min([1.0 - level] + [room[x] / load[x] for x in room if load[x] > 0])
            level += step
            for x in room:
                room[x] -= step * load[x]
            full = {x for x in room if load[x] > 0 and room[x] <= 1e-12}
            for i in active - frozen:
                if level >= 1.0 - 1e-15 or full & set(routes[i][0]):
                    frozen.add(i)
                    speed[i] = level
        dt = min(left[i] / speed[i] for i in active)
        waiting = [
            finish[p] - t
            for i in left
            if i not in active
            for p in preds[i]
            if p in finish and finish[p] > t
        ]
        dt = min([dt, *waiting])
        t += dt
        for i in list(active):
            left[i] -= speed[i] * dt
            if left[i] <= 1e-12:
                active.remove(i)
                del left[i]
                finish[k + i] = done[i] = t
    return done
