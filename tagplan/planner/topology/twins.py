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
:meth:`TwinMachines.relabel` moves the machines a placement uses only in ways that keep
the order of every used GPU: from the lowest used machine up, each onto the lowest
machine of its twin class above where the one before it went. Each rule then picks the
same instance, the compiler emits the same tasks in the same order with the GPUs
renamed, and the simulator gives the same step, the same peak memory on the renamed GPUs
and the same out-of-memory verdict (up to the order of floating-point sums over links
and GPUs). The move depends only on the twin classes of the used machines in order, so
strategies one such move apart get the same image; the search simulates one of them
(:meth:`~tagplan.planner.evaluate.Evaluator.identity`).
"""

from __future__ import annotations

import numpy as np

from tagplan.planner.topology.canonical import twin_machines
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
        twin = np.arange(m, dtype=np.int64)
        if (np.diff(machine_of) >= 0).all():  # GPUs numbered machine by machine
            alike = twin_machines(cluster)  # the fingerprint's twins, then by GPU order
            types = [cluster.device_type[machine_of == x].tobytes() for x in range(m)]
            for x in range(m):
                twin[x] = next(
                    y for y in range(x + 1) if alike[y] == alike[x] and types[y] == types[x]
                )
        self.lowest_twin = twin  # per machine, the lowest machine of its twin class
        self.has_twins = bool((twin != np.arange(m)).any())
        self._members = {int(r): np.flatnonzero(twin == r) for r in np.unique(twin)}

    def relabel(self, inst_device: np.ndarray) -> np.ndarray | None:
        """A device map (each device's new number) that moves the machines ``inst_device``
        uses, from the lowest up, each onto the lowest machine of its twin class above
        where the one before it went (the lowest such map that keeps the used machines'
        order: strategies one such move apart get the same map's image), the other
        machines of each class onto the rest of it, and a GPU onto the GPU at its place
        in its new machine; ``None`` when no machine moves (module docstring)."""
        if not self.has_twins or not len(inst_device):
            return None
        twin = self.lowest_twin
        used = np.flatnonzero(np.bincount(self._machine_of[inst_device], minlength=len(twin)))
        target = np.empty(len(used), dtype=np.int64)
        below = -1
        for k, machine in enumerate(used.tolist()):
            members = self._members[twin[machine]]
            below = target[k] = members[np.searchsorted(members, below, side="right")]
        if (target == used).all():
            return None
        machine_map = np.arange(len(twin), dtype=np.int64)
        machine_map[used] = target
        for root in np.unique(twin[used]).tolist():
            members = self._members[root]
            machine_map[np.setdiff1d(members, used)] = np.setdiff1d(members, target)
        position = np.arange(self._num_devices) - self._first_device[self._machine_of]
        return self._first_device[machine_map[self._machine_of]] + position
