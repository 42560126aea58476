"""Analyzed graphs kept in the database, so a job's steps and repeat jobs skip analysis.

Every step of a job (analyze, each search shard, finish) needs the analyzed graph, and a
repeat job answered from the strategy cache needs it to re-simulate: analysis costs up to
1.5 s on the zoo's largest graphs (BERT-Large), unpickling the stored result milliseconds.
The key is the digest of the graph's bytes, the batch inputs, the loss, the batch size and
the planner's version (:func:`~tagplan.planner.version.planner_version`), so a planner
change analyzes afresh. Only workers write these rows; an entry that no longer loads
(written by other code) is analyzed again and replaced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING

from tagplan.db.blobs import get_blob, put_blob
from tagplan.db.models import Analysis
from tagplan.db.session import add_once, session_scope
from tagplan.planner.version import planner_version

if TYPE_CHECKING:
    from tagplan.planner.graph.ir import GraphIR

__all__ = ["analysis_key", "stored_analysis"]

log = logging.getLogger(__name__)


def analysis_key(
    graph_digest: str, batch_inputs: list[str] | None, loss: str | None, batch_size: int | None
) -> str:
    """The digest naming one analysis of one graph."""
    identity = [planner_version(), graph_digest, batch_inputs, loss, batch_size]
    return hashlib.sha256(json.dumps(identity).encode()).hexdigest()


def stored_analysis(url: str, key: str, analyze: Callable[[], GraphIR]) -> GraphIR:
    """The analysis stored under ``key``, else ``analyze()`` stored under it."""
    with session_scope(url) as session:
        row = session.get(Analysis, key)
        data = get_blob(session, row.blob_digest) if row is not None else None
    if data is not None:
        try:
            return pickle.loads(data)  # written by this module, in workers only
        except Exception:
            log.warning("stored analysis %s does not load; analyzing again", key)
    ir = analyze()
    with session_scope(url) as session:
        digest = put_blob(session, pickle.dumps(ir, protocol=pickle.HIGHEST_PROTOCOL))
        row = session.get(Analysis, key)
        if row is None:
            add_once(session, Analysis(key=key, blob_digest=digest))
        else:
            row.blob_digest = digest
    return ir
