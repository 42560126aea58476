"""``/v1/checkpoints``: GNN prior checkpoints (``state_dict`` files) managed by operators,
and the registry of the one that guides the searches of new jobs.

The API stores, lists and serves them without loading them: it has no torch. One
checkpoint is active for the whole service, for every tenant's jobs (the registry is the
operators'; :mod:`tagplan.service.registry`); with none active, jobs use the checkpoint the
package ships. A job records the choice at submission, and its result names the prior its
search used.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from tagplan.db.blobs import get_blob, put_blob
from tagplan.db.models import ActiveCheckpoint, Checkpoint, Holding
from tagplan.db.session import add_once, session_scope
from tagplan.service.auth import Principal
from tagplan.service.deps import OperateKey, ReadKey, SessionDep
from tagplan.service.problems import Problem
from tagplan.service.registry import (
    activate,
    active_checkpoint,
    deactivate,
    prior_reference,
    shipped_prior,
)
from tagplan.service.schemas import ActivePriorPublic, CheckpointPublic
from tagplan.service.tenancy import find_held, hold, list_held
from tagplan.service.uploads import BINARY_BODY, upload_body

router = APIRouter(prefix="/v1/checkpoints", tags=["checkpoints"])


def _public(row: Checkpoint, mine: Holding | None, active_id: str | None) -> CheckpointPublic:
    """The checkpoint as its tenant knows it: its own name and upload time (``active_id``:
    the active checkpoint's)."""
    public = CheckpointPublic.model_validate(row, from_attributes=True)
    public.active = row.id == active_id
    if mine is None:
        return public
    return public.model_copy(update={"name": mine.label, "created_at": mine.created_at})


def _active_view(
    session: Session, caller: Principal, row: ActiveCheckpoint | None
) -> ActivePriorPublic:
    """What new jobs use (``row``: the registry's), with the active checkpoint as the
    caller's tenant knows it, when it sees it."""
    view = ActivePriorPublic(prior=prior_reference(row), shipped=shipped_prior())
    if row is None:
        return view
    view.activated_at, view.activated_by = row.activated_at, row.activated_by
    mine = session.get(Holding, (caller.tenant, "checkpoint", row.checkpoint_id))
    if mine is not None or caller.sees_all:
        checkpoint = session.get(Checkpoint, row.checkpoint_id)
        view.checkpoint = _public(checkpoint, mine, row.checkpoint_id)
    return view


@router.post("", status_code=201, response_model=CheckpointPublic, openapi_extra=BINARY_BODY)
async def upload_checkpoint(
    request: Request, caller: OperateKey, name: str = Query(min_length=1, max_length=200)
) -> CheckpointPublic:
    """Store a checkpoint file under ``name`` (content-addressed: same bytes, same id); the
    caller's tenant holds it."""
    data, filename = await upload_body(request)
    if not data:
        raise Problem(422, "the request body is empty; send the checkpoint file")
    url = request.app.state.settings.sqlalchemy_url

    def store() -> CheckpointPublic:
        with session_scope(url) as session:
            digest = put_blob(session, data)
            meta = {"size_bytes": len(data), "filename": filename}
            row = add_once(session, Checkpoint(id=digest, name=name, blob_digest=digest, meta=meta))
            active = active_checkpoint(session)
            mine = hold(session, caller.tenant, "checkpoint", digest, name)
            return _public(row, mine, active.checkpoint_id if active else None)

    return await run_in_threadpool(store)


@router.get("", response_model=list[CheckpointPublic])
def list_checkpoints(session: SessionDep, caller: ReadKey) -> list[CheckpointPublic]:
    """The tenant's checkpoints (every tenant's for operators), newest first; ``active``
    marks the one guiding new jobs."""
    active = active_checkpoint(session)
    active_id = active.checkpoint_id if active else None
    query = list_held(caller, Checkpoint, "checkpoint")
    return [_public(row, mine, active_id) for row, mine in session.execute(query)]


@router.get("/active", response_model=ActivePriorPublic)
def get_active(session: SessionDep, caller: ReadKey) -> ActivePriorPublic:
    """The prior that guides the searches of jobs submitted now: the active checkpoint
    (one for the whole service), else the one the package ships."""
    return _active_view(session, caller, active_checkpoint(session))


@router.put("/{checkpoint_id}/active", response_model=ActivePriorPublic)
def activate_checkpoint(
    checkpoint_id: str, session: SessionDep, caller: OperateKey
) -> ActivePriorPublic:
    """Make the checkpoint the active one, for the whole service: every tenant's jobs
    submitted from now on search with it; jobs submitted before keep the prior they
    recorded. The API does not load it (it has no torch): a checkpoint the workers refuse
    (another feature schema, a file that is no checkpoint) fails the jobs that use it with
    the reason, until another is activated or the registry is cleared."""
    find_held(session, caller, Checkpoint, "checkpoint", checkpoint_id)
    return _active_view(session, caller, activate(session, checkpoint_id, caller.key_id))


@router.delete("/active", response_model=ActivePriorPublic)
def clear_active(session: SessionDep, caller: OperateKey) -> ActivePriorPublic:
    """Make no checkpoint active: jobs submitted from now on use the shipped one."""
    deactivate(session)
    return _active_view(session, caller, None)


@router.get("/{checkpoint_id}", response_class=Response)
def get_checkpoint(checkpoint_id: str, session: SessionDep, caller: ReadKey) -> Response:
    """The checkpoint file as uploaded."""
    row, _ = find_held(session, caller, Checkpoint, "checkpoint", checkpoint_id)
    return Response(get_blob(session, row.blob_digest), media_type="application/octet-stream")
