"""Move a cached strategy to another numbering of the same cluster (docs/design.md §9).

Two clusters with one canonical fingerprint differ only in machine names, machine order
and GPU numbering; :class:`~tagplan.planner.topology.CanonicalOrder` relates each to the
canonical numbering, so device group ``g`` of the source is group
``target.canonical_to_group[source.group_to_canonical[g]]`` of the target, and likewise for
devices. :func:`~tagplan.planner.strategy_remap.remap_strategy` rewrites every device group
index and device name of the strategy that way.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from tagplan.planner.errors import InvalidInput
from tagplan.planner.strategy import load_strategy
from tagplan.planner.strategy_remap import remap_strategy
from tagplan.planner.topology import CanonicalOrder, Cluster, canonical_order, parse_cluster_spec

__all__ = ["ClusterMapping", "cluster_from_spec_json"]


@lru_cache(maxsize=256)
def cluster_from_spec_json(spec_json: str) -> tuple[Cluster, CanonicalOrder]:
    """A cluster and its canonical order from its stored spec (cached: cheap repeat GETs)."""
    cluster = Cluster.from_spec(parse_cluster_spec(json.loads(spec_json)))
    return cluster, canonical_order(cluster)


class ClusterMapping:
    """Group and device correspondence from a ``source`` cluster to an isomorphic ``target``."""

    def __init__(
        self, source: tuple[Cluster, CanonicalOrder], target: tuple[Cluster, CanonicalOrder]
    ) -> None:
        (src, a), (dst, b) = source, target
        if a.fingerprint != b.fingerprint:
            raise InvalidInput("the clusters differ; a strategy cannot be remapped between them")
        self.groups: list[int] = b.canonical_to_group[a.group_to_canonical].tolist()
        devices = b.canonical_to_device[a.device_to_canonical]
        self.device_names = {
            src.device_names[i]: dst.device_names[int(devices[i])] for i in range(len(devices))
        }

    def strategy(self, document: dict[str, Any]) -> dict[str, Any]:
        """A strategy JSON document with every group index and device name rewritten."""
        strategy = remap_strategy(
            load_strategy(document), device_groups=self.groups, devices=self.device_names
        )
        return strategy.model_dump(mode="json", exclude_none=True)

    def per_device(self, values: dict[str, Any]) -> dict[str, Any]:
        """A mapping keyed by device name (e.g. peak memory) in the target's names."""
        return {self.device_names.get(name, name): value for name, value in values.items()}
