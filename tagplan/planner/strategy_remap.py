"""Renumber a strategy's device groups and devices (docs/design.md §9).

A strategy found for one numbering of a cluster runs on an isomorphic cluster once every
device group index and device name in it is rewritten. Which fields of a
:class:`~tagplan.planner.strategy.GroupDecision` name device groups or devices is written
down once, here, in :data:`DECISION_REMAPS`; every other field of the strategy models is
listed as device-free, and a test fails when a field is in neither list.

Two clusters with one canonical fingerprint differ only in machine names, machine order
and GPU numbering; :class:`~tagplan.planner.topology.CanonicalOrder` relates each to the
canonical numbering, so device group ``g`` of the source is group
``target.canonical_to_group[source.group_to_canonical[g]]`` of the target, and likewise for
devices: :class:`ClusterMapping` (the strategy cache's remapping, docs/design.md §9).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.ir import GraphIR
from tagplan.planner.strategy import (
    GroupDecision,
    Option,
    ResolvedStrategy,
    Strategy,
    load_strategy,
)
from tagplan.planner.topology import CanonicalOrder, Cluster

__all__ = [
    "DECISION_REMAPS",
    "DEVICE_FREE_DECISION_FIELDS",
    "DEVICE_FREE_GROUP_FIELDS",
    "DEVICE_FREE_STRATEGY_FIELDS",
    "ClusterMapping",
    "Renumbering",
    "pin_numbering",
    "remap_strategy",
]


class Renumbering:
    """Source device group ``g`` is target group ``device_groups[g]``; source device
    ``name`` is target device ``devices[name]``."""

    def __init__(
        self, device_groups: Sequence[int] | Mapping[int, int], devices: Mapping[str, str]
    ) -> None:
        self.device_groups = device_groups
        self.devices = devices

    def group(self, group: int) -> int:
        try:
            return int(self.device_groups[group])
        except (IndexError, KeyError):
            raise InvalidInput(f"device group {group} has no counterpart to remap to") from None

    def device(self, name: str) -> str:
        try:
            return self.devices[name]
        except KeyError:
            raise InvalidInput(f"device {name!r} has no counterpart to remap to") from None


def _groups(groups: list[int], to: Renumbering) -> list[int]:
    return sorted(to.group(group) for group in groups)


def _device_keys(by_device: dict[str, Any], to: Renumbering) -> dict[str, Any]:
    return {to.device(name): value for name, value in by_device.items()}


def _device_values(to_device: dict[str, str], to: Renumbering) -> dict[str, str]:
    return {key: to.device(name) for key, name in to_device.items()}


def _device(name: str, to: Renumbering) -> str:
    return to.device(name)


DECISION_REMAPS: dict[str, Callable[[Any, Renumbering], Any]] = {
    "device_groups": _groups,
    "replicas": _device_keys,
    "batch_weights": _device_keys,
    "ps_device": _device,
    "placement": _device_values,  # op name -> device name
}
"""The fields of a :class:`GroupDecision` that name device groups or devices, and how
each is rewritten (a field left ``None`` stays ``None``)."""
DEVICE_FREE_DECISION_FIELDS = frozenset({"option", "collective", "gradient_sync", "bucket_bytes"})
"""The fields of a :class:`GroupDecision` that name no device group or device."""
DEVICE_FREE_GROUP_FIELDS = frozenset({"ops"})
"""An :class:`~tagplan.planner.strategy.OpGroup`'s fields besides its ``decision``."""
DEVICE_FREE_STRATEGY_FIELDS = frozenset({"version", "name", "sfb", "pipeline"})
"""A :class:`Strategy`'s fields besides its decisions (``groups`` and ``default``); a
pipeline names op groups by index, never a device."""


def _remap_decision(decision: GroupDecision, to: Renumbering) -> GroupDecision:
    update = {
        name: remap(value, to)
        for name, remap in DECISION_REMAPS.items()
        if (value := getattr(decision, name)) is not None
    }
    return decision.model_copy(update=update)


def remap_strategy(
    strategy: Strategy,
    *,
    device_groups: Sequence[int] | Mapping[int, int],
    devices: Mapping[str, str],
) -> Strategy:
    """``strategy`` with every device group index and device name rewritten: group ``g``
    becomes ``device_groups[g]``, device ``name`` becomes ``devices[name]``.

    Raises :class:`~tagplan.planner.errors.InvalidInput` for a group or device that has no
    counterpart.
    """
    to = Renumbering(device_groups, devices)
    groups = [
        group.model_copy(update={"decision": _remap_decision(group.decision, to)})
        for group in strategy.groups
    ]
    default = None if strategy.default is None else _remap_decision(strategy.default, to)
    return strategy.model_copy(update={"groups": groups, "default": default})


def pin_numbering(resolved: ResolvedStrategy, ir: GraphIR, cluster: Cluster) -> Strategy:
    """``resolved``'s strategy with what the cluster's numbering decided for it written
    out: every model-parallel op's device (the default split runs over a group's GPUs in
    their numbering) and every parameter server left to the round-robin. The same
    strategy on the same cluster, and, once remapped, the same one on a renumbered
    cluster: without it a model-parallel group over several machines splits along
    another machine order there and steps differently."""
    names = cluster.device_names
    pinned: list[GroupDecision] = []
    for group, decision in enumerate(resolved.group_decisions):  # the default's last
        update: dict[str, Any] = {}
        if decision.option == Option.MODEL_PARALLEL:
            ops = np.flatnonzero(resolved.op_group == group)
            update["placement"] = {
                ir.op_names[op]: str(names[resolved.op_device[op]]) for op in ops.tolist()
            }
        if decision.option == Option.REPLICATE_PS and decision.ps_device is None:
            update["ps_device"] = str(names[resolved.group_ps_device[group]])
        pinned.append(decision.model_copy(update=update) if update else decision)
    strategy = resolved.strategy
    groups = [
        group.model_copy(update={"decision": decision})
        for group, decision in zip(strategy.groups, pinned, strict=False)
    ]
    # a default that covers no op has no decision of its own to pin
    default = pinned[-1] if len(pinned) > len(groups) else strategy.default
    return strategy.model_copy(update={"groups": groups, "default": default})


class ClusterMapping:
    """Group and device correspondence from a ``source`` cluster to an isomorphic ``target``."""

    def __init__(
        self, source: tuple[Cluster, CanonicalOrder], target: tuple[Cluster, CanonicalOrder]
    ) -> None:
        (src, a), (dst, b) = source, target
        if a.fingerprint != b.fingerprint:
            raise InvalidInput("the clusters differ; a strategy cannot be remapped between them")
        self.groups: list[int] = b.canonical_to_group[a.group_to_canonical].tolist()
        self.devices: np.ndarray = b.canonical_to_device[a.device_to_canonical]
        """Source device ``d`` is target device ``devices[d]``."""
        self.device_names = {
            src.device_names[i]: dst.device_names[int(to)] for i, to in enumerate(self.devices)
        }

    def remap(self, strategy: Strategy) -> Strategy:
        """``strategy`` with every group index and device name rewritten."""
        return remap_strategy(strategy, device_groups=self.groups, devices=self.device_names)

    def strategy(self, document: dict[str, Any]) -> dict[str, Any]:
        """A strategy JSON document with every group index and device name rewritten."""
        return self.remap(load_strategy(document)).model_dump(mode="json", exclude_none=True)

    def per_device(self, values: dict[str, Any]) -> dict[str, Any]:
        """A mapping keyed by device name (e.g. peak memory) in the target's names."""
        return {self.device_names.get(name, name): value for name, value in values.items()}
