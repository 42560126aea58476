"""The checkpoint registry: which GNN checkpoint guides the searches of new jobs.

Operators make one checkpoint active for the whole service; with none active, jobs use the
checkpoint the package ships. A job records the choice when it is submitted
(``options["prior"]``, :mod:`tagplan.workers.priors`), so a switch changes the searches of
jobs submitted afterwards and never the shards of a job already running. The API has no
torch and imports nothing of :mod:`tagplan.gnn`: it names the shipped checkpoint from the
JSON record packaged beside it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

from sqlalchemy import delete
from sqlalchemy.orm import Session

from tagplan.db.models import PRIOR_SLOT, ActiveCheckpoint, utcnow
from tagplan.db.session import insert_or_find
from tagplan.workers.priors import SHIPPED, checkpoint_reference

__all__ = [
    "activate",
    "active_checkpoint",
    "deactivate",
    "new_job_prior",
    "prior_reference",
    "shipped_prior",
]


@lru_cache(maxsize=1)
def shipped_prior() -> str:
    """The name of the shipped checkpoint's prior, ``gnn:<first 12 hex digits of its
    weights' sha256>``, as a worker with torch reports it (``tagplan.gnn.prior_name``),
    read from its JSON record: the API loads nothing of the planner's search or GNN."""
    record = resources.files("tagplan").joinpath("gnn", "checkpoints", "prior.json")
    return f"gnn:{json.loads(record.read_text())['state_sha256'][:12]}"


def active_checkpoint(session: Session) -> ActiveCheckpoint | None:
    """The registry's row: the active checkpoint, or None."""
    return session.get(ActiveCheckpoint, PRIOR_SLOT)


def prior_reference(row: ActiveCheckpoint | None) -> str:
    """What a job records as its prior while ``row`` is the registry's (None: empty)."""
    return SHIPPED if row is None else checkpoint_reference(row.checkpoint_id)


def new_job_prior(session: Session) -> str:
    """What a job submitted now records as its prior: the active checkpoint, else the
    shipped one."""
    return prior_reference(active_checkpoint(session))


def activate(session: Session, checkpoint_id: str, key_id: str | None) -> ActiveCheckpoint:
    """Make the stored checkpoint ``checkpoint_id`` the active one (by the key
    ``key_id``)."""
    fields = {"checkpoint_id": checkpoint_id, "activated_by": key_id, "activated_at": utcnow()}
    row, existed = insert_or_find(
        session, ActiveCheckpoint(slot=PRIOR_SLOT, **fields), lambda: active_checkpoint(session)
    )
    if existed:
        for name, value in fields.items():
            setattr(row, name, value)
    return row


def deactivate(session: Session) -> None:
    """Make no checkpoint active: new jobs use the shipped one."""
    session.execute(delete(ActiveCheckpoint))
