"""``/v1/checkpoints``: GNN prior checkpoints (``state_dict`` files) managed by operators.

The API stores, lists and serves them without loading them: it has no torch.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from tagplan.db.blobs import get_blob, put_blob
from tagplan.db.models import Checkpoint, Holding
from tagplan.db.session import add_once, session_scope
from tagplan.service.deps import OperateKey, ReadKey, SessionDep
from tagplan.service.problems import Problem
from tagplan.service.schemas import CheckpointPublic
from tagplan.service.tenancy import find_held, hold, list_held
from tagplan.service.uploads import BINARY_BODY, upload_body

router = APIRouter(prefix="/v1/checkpoints", tags=["checkpoints"])


def _public(row: Checkpoint, mine: Holding | None) -> CheckpointPublic:
    """The checkpoint as its tenant knows it: its own name and upload time."""
    public = CheckpointPublic.model_validate(row, from_attributes=True)
    if mine is None:
        return public
    return public.model_copy(update={"name": mine.label, "created_at": mine.created_at})


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
            return _public(row, hold(session, caller.tenant, "checkpoint", digest, name))

    return await run_in_threadpool(store)


@router.get("", response_model=list[CheckpointPublic])
def list_checkpoints(session: SessionDep, caller: ReadKey) -> list[CheckpointPublic]:
    """The tenant's checkpoints (every tenant's for operators), newest first."""
    query = list_held(caller, Checkpoint, "checkpoint")
    return [_public(row, mine) for row, mine in session.execute(query)]


@router.get("/{checkpoint_id}", response_class=Response)
def get_checkpoint(checkpoint_id: str, session: SessionDep, caller: ReadKey) -> Response:
    """The checkpoint file as uploaded."""
    row, _ = find_held(session, caller, Checkpoint, "checkpoint", checkpoint_id)
    return Response(get_blob(session, row.blob_digest), media_type="application/octet-stream")
