"""Named leases in the database: one holder at a time, taken over once it expires.

A holder renews its lease by taking it again before it expires. Taking is one conditional
``UPDATE`` (the row is the holder's or has expired), so two processes racing for an expired
lease cannot both win; the first take of a name inserts its row, and the primary key lets
one of two concurrent inserts win.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import or_, update
from sqlalchemy.orm import Session

from tagplan.db.models import Lease, utcnow
from tagplan.db.session import insert_or_find

__all__ = ["take_lease"]


def take_lease(session: Session, *, name: str, holder: str, ttl_s: float) -> bool:
    """Take or renew lease ``name`` for ``holder`` until ``ttl_s`` from now; False while
    another holder's lease has not expired."""
    now = utcnow()
    expires_at = now + timedelta(seconds=ttl_s)
    taken = session.execute(
        update(Lease)
        .where(Lease.name == name, or_(Lease.holder == holder, Lease.expires_at < now))
        .values(holder=holder, expires_at=expires_at)
    ).rowcount
    if taken:
        return True
    _, existed = insert_or_find(
        session,
        Lease(name=name, holder=holder, expires_at=expires_at),
        lambda: session.get(Lease, name),
    )
    return not existed
