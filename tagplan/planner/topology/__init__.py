"""Cluster schema, GPU catalog, device groups and canonical fingerprint (docs/design.md §2).

A scheduler describes its allocation as a :class:`ClusterSpec` (JSON/YAML, units in
every field name); :func:`load_cluster` validates it and resolves it to a
:class:`Cluster` of numpy arrays in bytes, seconds and FLOP/s, with TAG's device groups
(§4.2: the GPUs of one type on one machine). :func:`fingerprint` identifies a cluster
independently of machine names, order and GPU numbering, and :func:`canonical_order`
gives the numbering that lets a cached strategy move between such clusters.

>>> cluster = load_cluster("testbed")
>>> cluster.num_machines, cluster.num_devices, cluster.num_groups
(7, 16, 7)
>>> cluster.group_names[0]
'v100-0/V100-32GB'
"""

from __future__ import annotations

from .canonical import (
    CanonicalOrder,
    canonical_order,
    fingerprint,
    map_devices,
    map_groups,
)
from .catalog import GpuTypeSpec, builtin_catalog, gpu_type_table
from .cluster import Cluster, PathInfo
from .loading import (
    ClusterSource,
    dumps_cluster_spec,
    load_cluster,
    load_cluster_spec,
    loads_cluster_spec,
    parse_cluster_spec,
)
from .named import (
    NamedCluster,
    list_named_clusters,
    named_cluster_spec,
    random_cluster_spec,
    tag_cloud_spec,
    tag_testbed_spec,
)
from .schema import (
    DEFAULT_INTRA_LATENCY_US,
    DEFAULT_NETWORK_LATENCY_US,
    ClusterSpec,
    GpuCount,
    GpuSlot,
    LinkSpec,
    MachineSpec,
    NetworkSpec,
)
from .summary import describe

__all__ = [
    "DEFAULT_INTRA_LATENCY_US",
    "DEFAULT_NETWORK_LATENCY_US",
    "CanonicalOrder",
    "Cluster",
    "ClusterSource",
    "ClusterSpec",
    "GpuCount",
    "GpuSlot",
    "GpuTypeSpec",
    "LinkSpec",
    "MachineSpec",
    "NamedCluster",
    "NetworkSpec",
    "PathInfo",
    "builtin_catalog",
    "canonical_order",
    "describe",
    "dumps_cluster_spec",
    "fingerprint",
    "gpu_type_table",
    "list_named_clusters",
    "load_cluster",
    "load_cluster_spec",
    "loads_cluster_spec",
    "map_devices",
    "map_groups",
    "named_cluster_spec",
    "parse_cluster_spec",
    "random_cluster_spec",
    "tag_cloud_spec",
    "tag_testbed_spec",
]
