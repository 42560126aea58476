"""Clusters of stored specs with their canonical order, cached for repeat GETs of the
strategy cache (the remapping itself: :class:`~tagplan.planner.strategy_remap.ClusterMapping`).
"""

from __future__ import annotations

import json
from functools import lru_cache

from tagplan.planner.topology import CanonicalOrder, Cluster, canonical_order, parse_cluster_spec

__all__ = ["cluster_from_spec_json"]


@lru_cache(maxsize=256)
def cluster_from_spec_json(spec_json: str) -> tuple[Cluster, CanonicalOrder]:
    """A cluster and its canonical order from its stored spec (cached: cheap repeat GETs)."""
    cluster = Cluster.from_spec(parse_cluster_spec(json.loads(spec_json)))
    return cluster, canonical_order(cluster)
