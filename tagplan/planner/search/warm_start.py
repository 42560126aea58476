"""Start a search from a strategy found before: a cached plan of the same graph, on the
same cluster at another batch size or on a cluster a machine larger or smaller
(docs/design.md §9, "Repeat jobs and warm starts").

Two steps bring the old strategy to the new search:

* :func:`adapt_strategy` rewrites its device groups for the new cluster. Device groups
  (one GPU type on one machine) are paired by GPU type name, same size first, in canonical
  order; a group of the old cluster without a partner is dropped from every decision, and
  a group of the new cluster without one joins every decision across machines that used
  all the old groups of its GPU type (all groups, one type, all but a straggler of another
  type); a decision inside one machine stays inside it.
  Batch weights and per-device details are dropped: the search's action recomputes them.
* :func:`start_actions` gives every op group of the search the candidate action nearest
  to what the strategy decided for most of the group's compute: the same option when the
  space offers it on those device groups, else the action with the largest overlap of
  device groups (Jaccard), the same option first.

The search evaluates that start first and keeps it as its incumbent without touching the
tree (:meth:`~.mcts.StrategySearch.run`): it never returns anything slower than the start,
and whatever a cold search would find it finds one iteration later at most.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from tagplan.planner.search.actions import Action
from tagplan.planner.search.mcts import StrategySearch
from tagplan.planner.strategy import GroupDecision, Strategy
from tagplan.planner.topology import Cluster, canonical_order

__all__ = ["adapt_strategy", "pair_device_groups", "start_actions"]


def pair_device_groups(source: Cluster, target: Cluster) -> dict[int, int]:
    """Source device group -> target device group with the same GPU type, groups of equal
    size first, both walked in canonical order; unpaired groups are left out."""
    source_order = np.argsort(canonical_order(source).group_to_canonical, kind="stable")
    target_order = np.argsort(canonical_order(target).group_to_canonical, kind="stable")
    free = [int(g) for g in target_order]
    pairs: dict[int, int] = {}
    for same_size in (True, False):
        for g in (int(g) for g in source_order):
            if g in pairs:
                continue
            for t in free:
                if source.group_type_name(g) != target.group_type_name(t):
                    continue
                if same_size and source.group_size[g] != target.group_size[t]:
                    continue
                pairs[g] = t
                free.remove(t)
                break
    return pairs


def _adapt_groups(
    groups: list[int], pairs: dict[int, int], source: Cluster, target: Cluster
) -> list[int]:
    used = set(groups)
    adapted = {pairs[g] for g in groups if g in pairs}
    if len({int(source.group_machine[g]) for g in groups}) < 2:
        return sorted(adapted)  # a placement inside one machine stays there
    paired_targets = set(pairs.values())
    for t in range(target.num_groups):
        if t in paired_targets:
            continue
        name = target.group_type_name(t)
        of_type = [g for g in range(source.num_groups) if source.group_type_name(g) == name]
        if of_type and used.issuperset(of_type):
            adapted.add(t)
    return sorted(adapted)


def adapt_strategy(strategy: Strategy, source: Cluster, target: Cluster) -> Strategy | None:
    """``strategy`` (for ``source``) with device groups rewritten for ``target`` (module
    docstring); None when no decision keeps a device group."""
    pairs = pair_device_groups(source, target)

    def adapt(decision: GroupDecision) -> GroupDecision | None:
        groups = _adapt_groups(decision.device_groups, pairs, source, target)
        if not groups:
            return None
        return GroupDecision(device_groups=groups, option=decision.option)

    kept = []
    for group in strategy.groups:
        decision = adapt(group.decision)
        if decision is None:
            return None
        kept.append(group.model_copy(update={"decision": decision}))
    default = None if strategy.default is None else adapt(strategy.default)
    if strategy.default is not None and default is None:
        return None
    return Strategy(name=strategy.name, groups=kept, default=default)


def _nearest(decision: GroupDecision, actions: tuple[Action, ...]) -> int:
    wanted = set(decision.device_groups)

    def closeness(index: int) -> tuple[float, bool, int]:
        action = actions[index]
        have = set(action.device_groups)
        jaccard = len(wanted & have) / len(wanted | have)
        return (jaccard, action.option == decision.option, -index)

    return max(range(len(actions)), key=closeness)


def start_actions(
    strategy: Strategy, search: StrategySearch, op_time_s: np.ndarray
) -> tuple[int, ...]:
    """The action of every op group of ``search`` (by group id) nearest to ``strategy``
    (module docstring), weighing its ops by ``op_time_s``; ``strategy`` names the search
    cluster's device groups."""
    ir, grouping = search.evaluator.ir, search.grouping
    decisions = [group.decision for group in strategy.groups]
    default = len(decisions) if strategy.default is not None else None
    if strategy.default is not None:
        decisions.append(strategy.default)
    decision_of_op = {op: k for k, group in enumerate(strategy.groups) for op in group.ops}
    nearest: dict[int, int] = {}
    key = []
    for g in range(grouping.num_groups):
        weight: Counter[int] = Counter()
        for op in grouping.ops(g):
            found = decision_of_op.get(ir.op_names[op], default)
            if found is not None:
                weight[found] += float(op_time_s[op]) + 1e-12
        if not weight:
            key.append(0)
            continue
        chosen = weight.most_common(1)[0][0]
        if chosen not in nearest:
            nearest[chosen] = _nearest(decisions[chosen], search.space.actions)
        key.append(nearest[chosen])
    return tuple(key)
