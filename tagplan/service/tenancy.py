"""What a caller may see: its tenant's jobs and the content-addressed rows its tenant holds.

Keys with the ``operate`` scope (admin included) see every tenant's. Anyone else asking
for another tenant's job, graph, cluster, profile or checkpoint gets the 404 of a row
that does not exist, so ids and fingerprints reveal nothing. A row's label (a graph's
label, a profile's or checkpoint's name) is the caller's tenant's own.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from sqlalchemy import ColumnElement, Select, and_, func, select
from sqlalchemy.orm import Session

from tagplan.db.models import Holding, Job
from tagplan.db.session import add_once
from tagplan.service.auth import Principal
from tagplan.service.problems import Problem

__all__ = ["Kind", "find_held", "hold", "holds", "job_filter", "list_held", "owns_job"]

Kind = Literal["graph", "cluster", "profile", "checkpoint"]
RowT = TypeVar("RowT")


def hold(session: Session, tenant: str, kind: Kind, ref: str, label: str = "") -> Holding:
    """Record that ``tenant`` holds the row ``ref`` of ``kind`` (its first label stays)."""
    return add_once(session, Holding(tenant=tenant, kind=kind, ref=ref, label=label[:200]))


def holds(session: Session, caller: Principal, kind: Kind, ref: str) -> bool:
    """True when ``caller`` may use the row: its tenant holds it, or it sees every tenant's."""
    return caller.sees_all or session.get(Holding, (caller.tenant, kind, ref)) is not None


def find_held(
    session: Session, caller: Principal, model: type[RowT], kind: Kind, ref: str
) -> tuple[RowT, Holding | None]:
    """The row and the caller's tenant's holding of it; 404 when absent or not visible."""
    row = session.get(model, ref)
    mine = session.get(Holding, (caller.tenant, kind, ref)) if row is not None else None
    if row is None or (mine is None and not caller.sees_all):
        raise Problem(404, f"{kind} {ref} does not exist")
    return row, mine


def list_held(caller: Principal, model: Any, kind: Kind) -> Select[Any]:
    """``(row, holding or None)`` of the rows the caller sees, newest to it first."""
    on = and_(Holding.kind == kind, Holding.ref == model.id, Holding.tenant == caller.tenant)
    since = func.coalesce(Holding.created_at, model.created_at)
    return select(model, Holding).join(Holding, on, isouter=caller.sees_all).order_by(since.desc())


def job_filter(caller: Principal) -> list[ColumnElement[bool]]:
    """WHERE clauses limiting jobs (and their results) to the ones the caller sees."""
    return [] if caller.sees_all else [Job.tenant == caller.tenant]


def owns_job(caller: Principal, job: Job) -> bool:
    """True when the caller sees ``job``."""
    return caller.sees_all or job.tenant == caller.tenant
