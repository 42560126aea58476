"""Communication times over a :class:`~tagplan.planner.topology.Cluster` (docs/design.md §3).

Closed forms, in seconds, for the transfers the compiler prices as one task:
point-to-point copies and ring, hierarchical or tree AllReduce. Fitted segmented-linear models
(TAG §4.1.2, measured by :mod:`.comm_profiler`) replace them through :class:`CommModel`
where a profile covers the case. Parameter-server pushes and pulls and the broadcasts of
sufficient factors are compiled into point-to-point copies, which the simulator runs
with their contention on shared links (docs/design.md §3).

Conventions:

- sizes ``nbytes`` in bytes, a number or an array (the result then has its shape);
  zero bytes cost zero seconds (nothing is sent);
- a device list given as a sequence is used in its order (the ring order); a ``set`` or
  ``frozenset`` is put in canonical order, by device index;
- ``B`` is a path's bottleneck bandwidth (bytes/s) and ``α`` its latency (s), both read
  from ``cluster.bandwidth_bytes_per_s`` and ``cluster.latency_s``.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from ..errors import InvalidInput
from ..topology import Cluster
from .fit import Seconds, SegmentedLinear, as_seconds, as_sizes

if TYPE_CHECKING:
    from .comm_profile import CommProfile

__all__ = [
    "AllReduceAlgorithm",
    "CommEstimate",
    "CommModel",
    "DeviceList",
    "allreduce_time_s",
    "hierarchical_allreduce_time_s",
    "p2p_time_s",
    "ring_allreduce_time_s",
    "tree_allreduce_time_s",
]

DeviceList = Sequence[int] | Set[int] | npt.NDArray[np.integer]
"""Devices by index: a sequence (kept in order) or a set (sorted by index)."""
AllReduceAlgorithm = Literal["ring", "hierarchical", "tree", "nccl", "auto"]

_ALGORITHMS = ("ring", "hierarchical", "tree", "nccl", "auto")


# --------------------------------------------------------------------------- input checks


def _device(cluster: Cluster, device: int, what: str) -> int:
    if isinstance(device, bool) or not isinstance(device, int | np.integer):
        raise InvalidInput(f"{what} must be a device index, got {device!r}")
    if not 0 <= device < cluster.num_devices:
        raise InvalidInput(
            f"{what} {device} is not a device of this cluster (0..{cluster.num_devices - 1})"
        )
    return int(device)


def _devices(cluster: Cluster, devices: DeviceList, what: str) -> npt.NDArray[np.int64]:
    """Validated device indices; sets in canonical (index) order, sequences as given."""
    idx = np.asarray(sorted(devices) if isinstance(devices, Set) else devices)
    if idx.size == 0:
        return np.zeros(0, dtype=np.int64)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise InvalidInput(f"{what} must be a list of device indices, got {devices!r}")
    outside = idx[(idx < 0) | (idx >= cluster.num_devices)]
    if outside.size:
        raise InvalidInput(
            f"{what}: {outside[0]} is not a device of this cluster (0..{cluster.num_devices - 1})"
        )
    if np.unique(idx).size != idx.size:
        raise InvalidInput(f"{what} lists a device twice: {idx.tolist()}")
    return idx.astype(np.int64)


# --------------------------------------------------------------------------- closed forms


def _ring_links(cluster: Cluster, ring: npt.NDArray[np.int64]) -> tuple[float, float]:
    """(B_min, α_max) over the links between ring neighbours ``ring[i] -> ring[i+1]``."""
    nxt = np.roll(ring, -1)
    return (
        float(cluster.bandwidth_bytes_per_s[ring, nxt].min()),
        float(cluster.latency_s[ring, nxt].max()),
    )


def _chain_links(cluster: Cluster, chain: npt.NDArray[np.int64]) -> tuple[float, float]:
    """(B_min, α_max) over the links ``chain[i] -> chain[i+1]`` (no wrap-around)."""
    return (
        float(cluster.bandwidth_bytes_per_s[chain[:-1], chain[1:]].min()),
        float(cluster.latency_s[chain[:-1], chain[1:]].max()),
    )


def _ring(cluster: Cluster, ring: npt.NDArray[np.int64], sizes: np.ndarray) -> np.ndarray:
    k = ring.size
    if k < 2:
        return np.zeros_like(sizes)
    bandwidth, latency = _ring_links(cluster, ring)
    seconds = 2.0 * (k - 1) / k * sizes / bandwidth + 2.0 * (k - 1) * latency
    return np.where(sizes > 0, seconds, 0.0)


def _machine_chains(
    cluster: Cluster, devices: DeviceList
) -> tuple[npt.NDArray[np.int64], list[npt.NDArray[np.int64]]]:
    """The devices grouped by machine for the hierarchical and tree algorithms: each
    machine's devices as a chain in index order, and the chains' heads (lowest index)."""
    idx = np.sort(_devices(cluster, devices, "devices"))
    if idx.size == 0:
        raise InvalidInput("an AllReduce needs at least one device")
    machines = cluster.device_machine[idx]
    chains = [idx[machines == m] for m in np.unique(machines)]
    return np.array([chain[0] for chain in chains], dtype=np.int64), chains


def p2p_time_s(cluster: Cluster, src: int, dst: int, nbytes: npt.ArrayLike) -> Seconds:
    """Point-to-point copy of ``nbytes`` from device ``src`` to ``dst``, in seconds.

    .. math:: t = α_{src,dst} + S / B_{src,dst}

    with ``B`` the bottleneck bandwidth of the path (intra-machine bus or network link,
    docs/design.md §3); ``0`` when ``src == dst`` (the tensor stays on its GPU).
    """
    src = _device(cluster, src, "src")
    dst = _device(cluster, dst, "dst")
    sizes, scalar = as_sizes(nbytes)
    if src == dst:
        return as_seconds(np.zeros_like(sizes), scalar)
    seconds = cluster.latency_s[src, dst] + sizes / cluster.bandwidth_bytes_per_s[src, dst]
    return as_seconds(np.where(sizes > 0, seconds, 0.0), scalar)


def ring_allreduce_time_s(cluster: Cluster, devices: DeviceList, nbytes: npt.ArrayLike) -> Seconds:
    """Ring AllReduce of a ``nbytes`` gradient among ``devices``, in seconds.

    .. math:: t = \\frac{2(k-1)}{k} \\frac{S}{B_{min}} + 2(k-1)\\,α_{max}

    ``S`` is the *full* gradient size, ``k`` the number of devices, ``B_min`` the slowest
    and ``α_max`` the highest-latency link between ring neighbours (``devices[i]`` and
    ``devices[i+1 mod k]``): reduce-scatter then all-gather, ``k-1`` steps each moving
    ``S/k`` bytes per link (TAG §4.2.3 uses ``2(D-1)/D · L/τ``). ``0`` for ``k = 1``.
    """
    ring = _devices(cluster, devices, "devices")
    if ring.size == 0:
        raise InvalidInput("an AllReduce needs at least one device")
    sizes, scalar = as_sizes(nbytes)
    return as_seconds(_ring(cluster, ring, sizes), scalar)


def hierarchical_allreduce_time_s(
    cluster: Cluster, devices: DeviceList, nbytes: npt.ArrayLike
) -> Seconds:
    """Hierarchical AllReduce (reduce in machines, ring among leaders, broadcast), in seconds.

    The devices are grouped by machine; the lowest-indexed device of each machine is its
    *leader*. Three phases, each waiting for the previous one:

    1. **reduce** inside every machine to its leader, a pipelined chain through the
       machine's devices in index order: :math:`S / B_m + (k_m - 1) α_m`;
    2. **ring AllReduce** of the full gradient among the ``M`` leaders over the network
       (:func:`ring_allreduce_time_s`, leaders in index order);
    3. **broadcast** from each leader down the same chain, the cost of phase 1.

    .. math:: t = 2 \\max_m \\left(\\frac{S}{B_m} + (k_m-1) α_m\\right)
              + \\frac{2(M-1)}{M} \\frac{S}{B_{min}} + 2(M-1)\\,α_{max}

    ``k_m`` devices on machine ``m`` (its term is ``0`` when ``k_m = 1``); ``B_m``, ``α_m``
    the slowest link and highest latency along machine ``m``'s chain; ``B_min``,
    ``α_max`` those of the leader ring. With one device per machine this is the ring.
    """
    leaders, chains = _machine_chains(cluster, devices)
    sizes, scalar = as_sizes(nbytes)
    local = np.zeros_like(sizes)
    for chain in chains:
        if chain.size > 1:
            bandwidth, latency = _chain_links(cluster, chain)
            local = np.maximum(local, sizes / bandwidth + (chain.size - 1) * latency)
    seconds = 2.0 * local + _ring(cluster, leaders, sizes)
    return as_seconds(np.where(sizes > 0, seconds, 0.0), scalar)


def tree_allreduce_time_s(cluster: Cluster, devices: DeviceList, nbytes: npt.ArrayLike) -> Seconds:
    """NCCL's tree AllReduce (a chain inside each machine, double binary trees across
    machines, pipelined), in seconds.

    The devices are grouped by machine; each machine's devices form a chain in index
    order whose head (the lowest index) joins the trees among the ``M`` machines. The
    reduction flows up the chains and trees and the result back down, both pipelined in
    chunks, and each of the two binary trees carries half of the data. A device is an
    inner vertex of at most one tree, so each phase sends and receives at most ``S``
    bytes per device and link, and a chunk crosses ``k_m - 1`` chain hops and
    ``⌈log2 M⌉`` tree levels each way:

    .. math:: t = \\frac{2S}{B_{min}}
              + 2\\left(\\max_m (k_m-1)\\, α_{chain} + ⌈\\log_2 M⌉\\, α_{net}\\right)

    ``B_min`` is the slowest link of any chain or between any two chain heads, ``α_chain``
    the highest latency along a chain, ``α_net`` the highest between two heads. The
    latency grows with ``log M`` where the ring's grows with ``k``, for twice the ring's
    bytes per link at large ``k``: the tree wins on small messages across many machines,
    the ring on large ones and inside one machine, where the tree is one chain (as NCCL
    itself never runs a tree inside one machine). The crossover, solving ring = tree, is in
    docs/design.md §3.
    """
    heads, chains = _machine_chains(cluster, devices)
    sizes, scalar = as_sizes(nbytes)
    if sum(chain.size for chain in chains) < 2:
        return as_seconds(np.zeros_like(sizes), scalar)
    bandwidth, chain_depth_s = np.inf, 0.0
    for chain in chains:
        if chain.size > 1:
            chain_bandwidth, chain_latency = _chain_links(cluster, chain)
            bandwidth = min(bandwidth, chain_bandwidth)
            chain_depth_s = max(chain_depth_s, (chain.size - 1) * chain_latency)
    tree_depth_s = 0.0
    if heads.size > 1:
        pairs = ~np.eye(heads.size, dtype=bool)
        bandwidth = min(
            bandwidth, float(cluster.bandwidth_bytes_per_s[np.ix_(heads, heads)][pairs].min())
        )
        levels = int(np.ceil(np.log2(heads.size)))
        tree_depth_s = levels * float(cluster.latency_s[np.ix_(heads, heads)][pairs].max())
    seconds = 2.0 * sizes / bandwidth + 2.0 * (chain_depth_s + tree_depth_s)
    return as_seconds(np.where(sizes > 0, seconds, 0.0), scalar)


_CLOSED_FORMS = {
    "ring": ring_allreduce_time_s,
    "hierarchical": hierarchical_allreduce_time_s,
    "tree": tree_allreduce_time_s,
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "nccl": ("ring", "tree"),
    "auto": ("ring", "hierarchical", "tree"),
}


def allreduce_time_s(
    cluster: Cluster,
    devices: DeviceList,
    nbytes: npt.ArrayLike,
    algorithm: AllReduceAlgorithm = "ring",
) -> Seconds:
    """AllReduce time in seconds with ``algorithm``: ``ring``, ``hierarchical``, ``tree``,
    ``nccl`` or ``auto``.

    ``nccl`` is what NCCL's tuner picks per call, the faster of ring and tree for each
    size; ``auto`` is the fastest of ring, hierarchical and tree (element-wise minimum).
    """
    if algorithm in _CLOSED_FORMS:
        return _CLOSED_FORMS[algorithm](cluster, devices, nbytes)
    if algorithm in _CHOICES:
        times = [_CLOSED_FORMS[name](cluster, devices, nbytes) for name in _CHOICES[algorithm]]
        return as_seconds(np.minimum.reduce([np.asarray(t) for t in times]), np.ndim(times[0]) == 0)
    raise InvalidInput(
        f"unknown AllReduce algorithm {algorithm!r}; expected one of {', '.join(_ALGORITHMS)}"
    )


# --------------------------------------------------------------------------- measured or not


class CommEstimate(NamedTuple):
    """A communication time and where it came from."""

    seconds: Seconds
    measured: bool
    """``True`` when a fitted model of the profile produced it, ``False`` for a closed form."""


class CommModel:
    """Communication times from a measured profile where it applies, closed forms elsewhere.

    A :class:`~tagplan.planner.cost.comm_profile.CommProfile` applies to transfers
    among devices whose GPU type is its ``device_kind`` (compared ignoring case):

    - **p2p**: the ``p2p.intra`` / ``p2p.inter`` model of the path's kind;
    - **AllReduce** among ``k`` devices of one machine: ``allreduce["k"]`` (the
      algorithm the library picked when measuring; unless ``hierarchical`` or ``tree`` is
      asked).

    Anything else — another device type, a link kind or ``k`` the profile lacks,
    AllReduce across machines — uses the closed forms of this module. Each ``*_detail``
    method returns a :class:`CommEstimate` saying which was used (all or nothing); the
    ``*_time_s`` methods return the seconds alone.
    """

    def __init__(self, cluster: Cluster, profile: CommProfile | None = None) -> None:
        self.cluster = cluster
        self.profile = profile
        covered = np.zeros(cluster.num_devices, dtype=bool)
        if profile is not None:
            kind = profile.device_kind.casefold()
            types = [t for t, name in enumerate(cluster.type_names) if name.casefold() == kind]
            covered = np.isin(cluster.device_type, types)
        self._covered = covered

    def __repr__(self) -> str:
        kind = "no profile" if self.profile is None else f"profile of {self.profile.device_kind}"
        return f"CommModel({self.cluster!r}, {kind})"

    def _p2p_model(self, kind: str) -> SegmentedLinear | None:
        if self.profile is None:
            return None
        return self.profile.p2p.intra if kind == "intra" else self.profile.p2p.inter

    def p2p_detail(self, src: int, dst: int, nbytes: npt.ArrayLike) -> CommEstimate:
        """:func:`p2p_time_s`, or the profile's p2p model for the path's kind."""
        analytic = p2p_time_s(self.cluster, src, dst, nbytes)
        path = self.cluster.path(src, dst)
        model = self._p2p_model(path.kind)
        if model is None or not self._covered[[src, dst]].all():
            return CommEstimate(analytic, False)
        sizes, scalar = as_sizes(nbytes)
        return CommEstimate(as_seconds(self._predict(model, sizes), scalar), True)

    def allreduce_detail(
        self, devices: DeviceList, nbytes: npt.ArrayLike, algorithm: AllReduceAlgorithm = "auto"
    ) -> CommEstimate:
        """:func:`allreduce_time_s`, or the profile's model for ``k`` devices of one machine."""
        analytic = allreduce_time_s(self.cluster, devices, nbytes, algorithm)
        idx = _devices(self.cluster, devices, "devices")
        if self.profile is None or idx.size < 2 or algorithm in ("hierarchical", "tree"):
            return CommEstimate(analytic, False)
        model = self.profile.allreduce.get(str(idx.size))
        one_machine = np.unique(self.cluster.device_machine[idx]).size == 1
        if model is None or not one_machine or not self._covered[idx].all():
            return CommEstimate(analytic, False)
        sizes, scalar = as_sizes(nbytes)
        return CommEstimate(as_seconds(self._predict(model, sizes), scalar), True)

    @staticmethod
    def _predict(model: SegmentedLinear, sizes: np.ndarray) -> np.ndarray:
        return np.where(sizes > 0, np.asarray(model.predict(sizes)), 0.0)

    def p2p_time_s(self, src: int, dst: int, nbytes: npt.ArrayLike) -> Seconds:
        """Seconds of :meth:`p2p_detail`."""
        return self.p2p_detail(src, dst, nbytes).seconds

    def p2p_closed_form(self, src: int, dst: int) -> tuple[float, float] | None:
        """``(α, B)`` of the path from ``src`` to ``dst`` in seconds and bytes per second
        where :meth:`p2p_time_s` prices it by :func:`p2p_time_s`'s closed form
        (``α + S / B`` for ``S > 0`` bytes between two GPUs, else 0), ``None`` where a
        profile's model does: a compiler pricing thousands of sizes per path computes the
        line itself rather than through arrays."""
        model = self._p2p_model(self.cluster.path(src, dst).kind)
        if model is not None and self._covered[[src, dst]].all():
            return None
        cluster = self.cluster
        return float(cluster.latency_s[src, dst]), float(cluster.bandwidth_bytes_per_s[src, dst])

    def allreduce_time_s(
        self, devices: DeviceList, nbytes: npt.ArrayLike, algorithm: AllReduceAlgorithm = "auto"
    ) -> Seconds:
        """Seconds of :meth:`allreduce_detail`."""
        return self.allreduce_detail(devices, nbytes, algorithm).seconds
