"""Twin machines: machines a strategy may trade for one another without changing its
simulation (docs/design.md §7, transpositions).

Two machines are *twins* when they hold the same GPU types in the same device order,
with the same intra-machine bandwidth and latency, and reach every other machine (and
each other, both ways) over links of the same bandwidth and latency (the fingerprint's
twins, :mod:`.canonical`, with the device order inside the machines equal as well). A
placement that runs on some machines of a twin class runs the same, task for task, on
other machines of that class: every transfer crosses links of the same bandwidths and
latencies, and every GPU is of the same type.

The compiler is not blind to GPU numbers, though: where several copies could serve a
reader it takes the lowest-numbered GPU's, a ring goes round its members in GPU order,
the first GPU of a placement runs the ops that need the whole batch. So
:meth:`TwinMachines.relabel` moves the machines a placement uses onto the lowest
machines of their twin classes only where that keeps the order of every used GPU: each
rule then picks the same instance, the compiler emits the same tasks in the same order
with the GPUs renamed, and the simulator gives the same step, the same peak memory on
the renamed GPUs and the same out-of-memory verdict (up to the order of floating-point
sums over links and GPUs). Two strategies whose relabeled placements agree are
simulated once by the search (:meth:`~tagplan.planner.evaluate.Evaluator.identity`).
"""

from __future__ import annotations

import numpy as np

from tagplan.planner.topology.cluster import Cluster

__all__ = ["TwinMachines"]


class TwinMachines:
    """The twin classes of one cluster's machines, and the relabeling of placements onto
    each class's lowest machines."""

    def __init__(self, cluster: Cluster) -> None:
        machine_of = cluster.device_machine
        m = cluster.num_machines
        self._first_device = np.searchsorted(machine_of, np.arange(m)).astype(np.int64)
        self._machine_of = machine_of.astype(np.int64)
        self._num_devices = cluster.num_devices
        contiguous = bool((np.diff(machine_of) >= 0).all())
        twin = np.arange(m, dtype=np.int64)
        if contiguous:
            for a in range(m):
                if twin[a] != a:
                    continue
                for b in range(a + 1, m):
                    if twin[b] == b and _twins(cluster, a, b):
                        twin[b] = a
        self.lowest_twin = twin  # per machine, the lowest machine of its twin class
        self.has_twins = bool((twin != np.arange(m)).any())

    def relabel(self, inst_device: np.ndarray) -> np.ndarray | None:
        """A device map (each device's new number) that moves the machines ``inst_device``
        uses onto the lowest machines of their twin classes, in order (the others of each
        class onto the rest of it, a GPU onto the GPU at its place in the new machine);
        ``None`` when that changes nothing or would change the order of the used machines
        (module docstring)."""
        if not self.has_twins or not len(inst_device):
            return None
        twin = self.lowest_twin
        used = np.bincount(self._machine_of[inst_device], minlength=len(twin)) > 0
        machine_map = np.arange(len(twin), dtype=np.int64)
        for root in np.unique(twin[used]).tolist():
            members = np.flatnonzero(twin == root)
            machine_map[np.concatenate([members[used[members]], members[~used[members]]])] = members
        kept = machine_map[used]
        if (kept == np.flatnonzero(used)).all() or (np.diff(kept) <= 0).any():
            return None
        position = np.arange(self._num_devices) - self._first_device[self._machine_of]
        return self._first_device[machine_map[self._machine_of]] + position


def _twins(cluster: Cluster, a: int, b: int) -> bool:
    """Whether machines ``a`` and ``b`` are twins (module docstring)."""
    types_a = cluster.device_type[cluster.device_machine == a]
    types_b = cluster.device_type[cluster.device_machine == b]
    if not np.array_equal(types_a, types_b):
        return False
    bandwidth, latency = cluster.machine_bandwidth_bytes_per_s, cluster.machine_latency_s
    others = np.setdiff1d(np.arange(cluster.num_machines), [a, b])
    return bool(
        bandwidth[a, a] == bandwidth[b, b]
        and latency[a, a] == latency[b, b]
        and bandwidth[a, b] == bandwidth[b, a]
        and latency[a, b] == latency[b, a]
        and np.array_equal(bandwidth[a, others], bandwidth[b, others])
        and np.array_equal(bandwidth[others, a], bandwidth[others, b])
        and np.array_equal(latency[a, others], latency[b, others])
        and np.array_equal(latency[others, a], latency[others, b])
    )
