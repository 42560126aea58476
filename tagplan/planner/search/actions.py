"""The actions of the search (TAG §4.2.2): one (P_i, O_i) slice for one op group.

An action names the device groups an op group uses (a row of TAG's placement matrix P)
and one of the four replication options (a row of O). Enumerating every subset of
device groups is 2^M × 4 actions, hopeless on a cluster of 32 device groups, so
:func:`candidate_actions` generates a capped list of the subsets that make sense for a
heterogeneous allocation (docs/design.md §7):

* all device groups; each single device group;
* the k fastest (by the group's aggregate speed on this model), for every k;
* the k best connected: grown from the fastest group by adding the group with the
  highest bandwidth to the set so far (stays inside a machine, then a rack);
* all groups of one machine; all groups of one GPU type;
* all but one group (drop a straggler).

On a placement of more than one GPU every option is offered; on a single GPU the four
options are the same deployment and only ``replicate-allreduce`` is kept. Replicas on
GPUs of different types get batch shares proportional to their speed on the model
(HeteroG §3.4), which is what makes replication over mixed GPUs worth it. Gradient
AllReduces are bucketed (Horovod's tensor fusion, what every data-parallel runtime does):
those over the same GPUs are fused across op groups into buckets that overlap the
backward pass, instead of hundreds of small collectives paying their latency one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tagplan.planner.cost.op_time import OpCostModel
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.options import DEFAULT_MAX_ACTIONS
from tagplan.planner.strategy import GradientSync, GroupDecision, Option
from tagplan.planner.topology import Cluster

__all__ = ["DEFAULT_MAX_ACTIONS", "Action", "ActionSpace", "candidate_actions"]


@dataclass(frozen=True, order=True)
class Action:
    """Device groups (sorted) and a replication option for one op group."""

    device_groups: tuple[int, ...]
    option: Option


class ActionSpace:
    """Candidate actions for a cluster and the decisions they turn into.

    ``device_speed[d]`` is GPU ``d``'s speed on the whole model (1 / its step time at
    an even share of the batch); batch shares of mixed-type replicas follow it.
    """

    def __init__(
        self,
        ir: GraphIR,
        cluster: Cluster,
        costs: OpCostModel,
        *,
        max_actions: int = DEFAULT_MAX_ACTIONS,
    ) -> None:
        self.cluster = cluster
        local = max(1, ir.batch_size // cluster.num_devices)
        # each op's seconds on one GPU of each type at an even share of the batch
        self.type_op_time_s: dict[int, np.ndarray] = {
            t: costs.op_times(t, local).seconds for t in sorted(set(cluster.device_type.tolist()))
        }
        type_speed = {
            t: 1.0 / max(float(seconds.sum()), 1e-12) for t, seconds in self.type_op_time_s.items()
        }
        self.device_speed = np.array([type_speed[int(t)] for t in cluster.device_type])
        self.group_speed = np.array(
            [self.device_speed[cluster.group_devices(g)].sum() for g in range(cluster.num_groups)]
        )
        self.actions: tuple[Action, ...] = tuple(
            candidate_actions(cluster, self.group_speed, max_actions=max_actions)
        )
        self._decisions: dict[Action, GroupDecision] = {}

    def __len__(self) -> int:
        return len(self.actions)

    def decision(self, action: Action) -> GroupDecision:
        """The strategy decision of ``action`` (cached: the search asks again and again)."""
        found = self._decisions.get(action)
        if found is None:
            found = self._decisions[action] = self._make_decision(action)
        return found

    def _make_decision(self, action: Action) -> GroupDecision:
        cluster = self.cluster
        devices = np.concatenate([cluster.group_devices(g) for g in action.device_groups])
        mixed = len(set(cluster.device_type[devices].tolist())) > 1
        weights = None
        if mixed and action.option in (Option.REPLICATE_ALLREDUCE, Option.REPLICATE_PS):
            weights = {str(cluster.device_names[d]): float(self.device_speed[d]) for d in devices}
        return GroupDecision(
            device_groups=list(action.device_groups),
            option=action.option,
            batch_weights=weights,
            gradient_sync=GradientSync.BUCKETED,
        )


def _best_connected_sets(cluster: Cluster, start: int) -> list[tuple[int, ...]]:
    """Prefixes of a greedy walk from ``start`` that always adds the group with the highest
    bandwidth to the groups taken so far (ties: the lower index)."""
    taken = [start]
    sets = [(start,)]
    rest = set(range(cluster.num_groups)) - {start}
    bandwidth = cluster.group_bandwidth_bytes_per_s
    while rest:
        nxt = max(sorted(rest), key=lambda g: min(bandwidth[g, t] for t in taken))
        taken.append(nxt)
        rest.remove(nxt)
        sets.append(tuple(sorted(taken)))
    return sets


def candidate_actions(
    cluster: Cluster, group_speed: np.ndarray, *, max_actions: int = DEFAULT_MAX_ACTIONS
) -> list[Action]:
    """The capped candidate list of the module docstring, most promising placements first,
    taking one placement of each kind in turn.

    ``group_speed[g]`` ranks the device groups (aggregate speed on the model).
    """
    m = cluster.num_groups
    by_speed = sorted(range(m), key=lambda g: (-group_speed[g], g))
    kinds: list[list[tuple[int, ...]]] = [
        [tuple(range(m))],
        [tuple(sorted(by_speed[:k])) for k in range(m - 1, 0, -1)],
        _best_connected_sets(cluster, by_speed[0]),
        [(g,) for g in by_speed],
        [
            tuple(np.flatnonzero(cluster.group_machine == i).tolist())
            for i in range(cluster.num_machines)
        ],
        [tuple(np.flatnonzero(cluster.group_type == t).tolist()) for t in range(cluster.num_types)],
        [tuple(g for g in range(m) if g != drop) for drop in by_speed[::-1]] if m > 2 else [],
    ]
    # round-robin over the kinds, so the cap leaves every kind represented
    placements = [kind[i] for i in range(max(map(len, kinds))) for kind in kinds if i < len(kind)]
    actions: list[Action] = []
    seen: set[Action] = set()
    for placement in placements:
        if not placement:
            continue
        single_gpu = int(cluster.group_size[list(placement)].sum()) == 1
        options = [Option.REPLICATE_ALLREDUCE] if single_gpu else list(Option)
        for option in options:
            action = Action(placement, option)
            if action not in seen:
                seen.add(action)
                actions.append(action)
    return actions[:max_actions]
