"""``/v1/checkpoints``: GNN prior checkpoints (``state_dict`` files) managed by operators.

The API stores, lists and serves them without loading them: it has no torch.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from tagplan.db.blobs import get_blob, put_blob
from tagplan.db.models import Checkpoint
from tagplan.db.session import session_scope
from tagplan.service.deps import OperateKey, ReadKey, SessionDep
from tagplan.service.problems import Problem
from tagplan.service.schemas import CheckpointPublic
from tagplan.service.uploads import BINARY_BODY, upload_body

router = APIRouter(prefix="/v1/checkpoints", tags=["checkpoints"])


def _public(row: Checkpoint) -> CheckpointPublic:
    return CheckpointPublic.model_validate(row, from_attributes=True)


@router.post("", status_code=201, response_model=CheckpointPublic, openapi_extra=BINARY_BODY)
async def upload_checkpoint(
    request: Request, _: OperateKey, name: str = Query(min_length=1, max_length=200)
) -> CheckpointPublic:
    """Store a checkpoint file under ``name`` (content-addressed: same bytes, same id)."""
    data, filename = await upload_body(request)
    if not data:
        raise Problem(422, "the request body is empty; send the checkpoint file")
    url = request.app.state.settings.sqlalchemy_url

    def store() -> CheckpointPublic:
        with session_scope(url) as session:
            digest = put_blob(session, data)
            row = session.get(Checkpoint, digest)
            if row is None:
                meta = {"size_bytes": len(data), "filename": filename}
                row = Checkpoint(id=digest, name=name, blob_digest=digest, meta=meta)
                session.add(row)
                session.flush()
            return _public(row)

    return await run_in_threadpool(store)


@router.get("", response_model=list[CheckpointPublic])
def list_checkpoints(session: SessionDep, _: ReadKey) -> list[CheckpointPublic]:
    """Stored checkpoints, newest first."""
    rows = session.scalars(select(Checkpoint).order_by(Checkpoint.created_at.desc()))
    return [_public(row) for row in rows]


@router.get("/{checkpoint_id}", response_class=Response)
def get_checkpoint(checkpoint_id: str, session: SessionDep, _: ReadKey) -> Response:
    """The checkpoint file as uploaded."""
    row = session.get(Checkpoint, checkpoint_id)
    if row is None:
        raise Problem(404, f"checkpoint {checkpoint_id} does not exist")
    return Response(get_blob(session, row.blob_digest), media_type="application/octet-stream")
