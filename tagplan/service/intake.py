"""Graphs and clusters coming in: size limits, structural checks, content-addressed rows
and the holdings of the tenant storing them.

The API checks what it can cheaply and without TensorFlow (the graph parses, is acyclic,
is within the node and byte limits; the cluster validates and is within the GPU limit)
so bad input is a 4xx at once; the full analysis runs in the worker.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from tagplan.db.blobs import digest_of, put_blob
from tagplan.db.models import ClusterRow, GraphRow, Holding
from tagplan.db.session import add_once
from tagplan.planner.errors import InvalidInput
from tagplan.planner.graph.analyzer import graph_fingerprint
from tagplan.planner.graph.load import loads_graph_def
from tagplan.planner.graph.parsed import parse_graph
from tagplan.planner.topology import (
    Cluster,
    canonical_order,
    dumps_cluster_spec,
    named_cluster_spec,
    parse_cluster_spec,
)
from tagplan.service.problems import Problem
from tagplan.service.tenancy import hold
from tagplan.settings import Settings

__all__ = ["LoadedCluster", "cluster_from_input", "store_cluster", "store_graph", "zoo_graph"]

_GZIP_MAGIC = b"\x1f\x8b"


def _decompressed_size_ok(data: bytes, limit: int) -> None:
    """413 when the graph, after gunzip if compressed, is over ``limit`` bytes."""
    size = len(data)
    if data[:2] == _GZIP_MAGIC:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            size = len(inflater.decompress(data, limit + 1))
        except zlib.error as exc:
            raise InvalidInput(f"graph is not valid gzip: {exc}") from exc
    if size > limit:
        raise Problem(413, f"the graph exceeds the limit of {limit} bytes", kind="graph-too-large")


def store_graph(
    session: Session,
    settings: Settings,
    data: bytes,
    *,
    tenant: str,
    label: str = "",
) -> tuple[GraphRow, Holding]:
    """Validate a graph upload, store it once (its id is the digest of its bytes) and
    record that ``tenant`` holds it."""
    _decompressed_size_ok(data, settings.max_graph_bytes)
    graph_def = loads_graph_def(data, max_bytes=settings.max_graph_bytes)
    if len(graph_def.node) > settings.max_ops:
        raise Problem(
            422,
            f"the graph has {len(graph_def.node)} nodes; the limit is {settings.max_ops}",
            kind="too-many-ops",
        )
    parse_graph(graph_def)  # refuses cycles and malformed inputs with the reason
    graph_id = digest_of(data)
    row = session.get(GraphRow, graph_id)
    if row is None:
        row = GraphRow(
            id=graph_id,
            fingerprint=graph_fingerprint(graph_def),
            blob_digest=put_blob(session, data),
            num_nodes=len(graph_def.node),
            size_bytes=len(data),
            label=label[:200],
        )
        row = add_once(session, row)
    return row, hold(session, tenant, "graph", graph_id, label)


def zoo_graph(name: str) -> tuple[bytes, list[str], str | None]:
    """A model-zoo graph's bytes, batch inputs and loss node."""
    from tagplan.planner.zoo import catalog

    model = catalog.get_model(name)
    return (
        catalog.read_graph_bytes(model.name),
        [entry["name"] for entry in model.inputs],
        model.loss_node,
    )


@dataclass(frozen=True, eq=False)
class LoadedCluster:
    """A validated cluster with its spec, content id and canonical fingerprint."""

    id: str
    spec: dict[str, Any]
    cluster: Cluster
    fingerprint: str


def cluster_from_input(settings: Settings, value: str | dict[str, Any]) -> LoadedCluster:
    """A named cluster (``testbed``, ``cloud``, ``random:SEED``) or an inline spec."""
    spec = named_cluster_spec(value) if isinstance(value, str) else parse_cluster_spec(value)
    # Counted from the spec: building a cluster of too many GPUs is the cost to avoid.
    gpus = sum(
        len(machine.gpus) if isinstance(machine.gpus, list) else machine.gpus.count
        for machine in spec.machines
    )
    if gpus > settings.max_gpus:
        raise Problem(
            422,
            f"the cluster has {gpus} GPUs; the limit is {settings.max_gpus}",
            kind="too-many-gpus",
        )
    cluster = Cluster.from_spec(spec)
    document = json.loads(dumps_cluster_spec(spec, fmt="json"))
    cluster_id = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()
    return LoadedCluster(cluster_id, document, cluster, canonical_order(cluster).fingerprint)


def store_cluster(session: Session, loaded: LoadedCluster, *, tenant: str) -> ClusterRow:
    """Store a cluster once (by the digest of its spec) and record that ``tenant`` holds it."""
    row = add_once(
        session,
        ClusterRow(
            id=loaded.id,
            fingerprint=loaded.fingerprint,
            spec=loaded.spec,
            num_gpus=loaded.cluster.num_devices,
        ),
    )
    hold(session, tenant, "cluster", row.id)
    return row
