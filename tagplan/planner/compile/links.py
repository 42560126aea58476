"""The links a task graph models on a cluster, and each transfer's share of them
(docs/design.md §3 and §6; the sharing rule is :mod:`~tagplan.planner.sim.engine`'s).

Links, numbered for ``D`` devices and ``M`` machines:

* ``d`` and ``D + d``: device ``d``'s out-port and in-port into its machine's interconnect,
  each of the machine's intra-machine bandwidth;
* ``2D + m`` and ``2D + M + m``: machine ``m``'s network uplink and downlink, each of the
  fastest network bandwidth from ``m`` to another machine.

A transfer from ``src`` to ``dst`` crosses the two ports and, between machines, the
sender's uplink and the receiver's downlink. Uncontended it moves at its path's bandwidth
``R`` (:attr:`Cluster.bandwidth_bytes_per_s`), using a share ``min(1, R / c_l)`` of each
link ``l`` of bandwidth ``c_l``: all of its bottleneck, a tenth of a 100 Gbps port for a
10 Gbps network path. A ring AllReduce crosses every participant's ports and, across
machines, every participating machine's uplink and downlink; it moves ``2(k-1)S/k`` bytes
over each at the rate ``R`` of the ring's slowest path.

A task's duration comes from the cost model (:class:`~tagplan.planner.cost.comm.CommModel`,
which may use a measured profile); its *bandwidth part* is the time its bytes take at
``R``, capped at the duration, and its *latency part* the rest: the path's latency for
a closed-form point-to-point copy, ``2(k-1)`` latencies for a ring. Every AllReduce is
split by the ring's bytes, whichever algorithm priced it: a tree moves ``2S`` per link
rather than ``2(k-1)S/k``, so ``2S/(kR)`` of its bandwidth part counts as latency, a
small part where a tree is chosen at all (latency-bound messages).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tagplan.planner.topology import Cluster

__all__ = ["LinkLayout", "Route", "latency_part_s", "ring_bytes_per_link"]


class Route(NamedTuple):
    """The links a transfer or collective crosses, its share of each, and its rate."""

    links: list[int]
    shares: list[float]
    rate_bytes_per_s: float


def ring_bytes_per_link(num_devices: int, nbytes: int) -> float:
    """Bytes a ring AllReduce of ``nbytes`` among ``num_devices`` sends over each link."""
    return 2.0 * (num_devices - 1) / num_devices * nbytes


def latency_part_s(seconds: float, bandwidth_s: float) -> float:
    """The latency part of a duration whose bytes alone take ``bandwidth_s``."""
    return seconds - min(seconds, bandwidth_s)


class LinkLayout:
    """The modelled links of one cluster: names, bandwidths, and routes (remembered)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        d, m = cluster.num_devices, cluster.num_machines
        self.num_links = 2 * d + 2 * m
        self.names = (
            [f"{n}/out" for n in cluster.device_names]
            + [f"{n}/in" for n in cluster.device_names]
            + [f"{n}/uplink" for n in cluster.machine_names]
            + [f"{n}/downlink" for n in cluster.machine_names]
        )
        network = cluster.machine_bandwidth_bytes_per_s.copy()
        np.fill_diagonal(network, 0.0)
        nic = network.max(axis=1) if m > 1 else cluster.machine_intra_bandwidth_bytes_per_s
        port = cluster.machine_intra_bandwidth_bytes_per_s[cluster.device_machine]
        self.bandwidth_bytes_per_s = np.concatenate([port, port, nic, nic])
        self._bandwidth = self.bandwidth_bytes_per_s.tolist()
        self._machine = cluster.device_machine.tolist()
        self._paths: dict[tuple[int, int], Route] = {}
        self._rings: dict[tuple[int, ...], Route] = {}

    def _route(self, links: list[int], rate_bytes_per_s: float) -> Route:
        bandwidth = self._bandwidth
        shares = [min(1.0, rate_bytes_per_s / bandwidth[link]) for link in links]
        return Route(links, shares, rate_bytes_per_s)

    def path(self, src: int, dst: int) -> Route:
        """The route of a point-to-point copy from device ``src`` to device ``dst``."""
        found = self._paths.get((src, dst))
        if found is None:
            d, m = self.cluster.num_devices, self.cluster.num_machines
            machine = self._machine
            links = [src, d + dst]
            if machine[src] != machine[dst]:
                links += [2 * d + machine[src], 2 * d + m + machine[dst]]
            rate = float(self.cluster.bandwidth_bytes_per_s[src, dst])
            found = self._paths[(src, dst)] = self._route(links, rate)
        return found

    def ring(self, devices: tuple[int, ...]) -> Route:
        """The route of a ring AllReduce among ``devices`` (in ring order)."""
        found = self._rings.get(devices)
        if found is None:
            d, m = self.cluster.num_devices, self.cluster.num_machines
            links = list(devices) + [d + x for x in devices]
            machines = sorted({self._machine[x] for x in devices})
            if len(machines) > 1:
                links += [2 * d + x for x in machines] + [2 * d + m + x for x in machines]
            ring = np.asarray(devices)
            rate = float(self.cluster.bandwidth_bytes_per_s[ring, np.roll(ring, -1)].min())
            found = self._rings[devices] = self._route(links, rate)
        return found
