"""``/v1/graphs``: upload a training graph once, refer to it by id in jobs."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from tagplan.db.models import GraphRow
from tagplan.db.session import session_scope
from tagplan.service.deps import ReadKey, SessionDep, SubmitKey
from tagplan.service.intake import store_graph
from tagplan.service.problems import Problem
from tagplan.service.schemas import GraphPublic

router = APIRouter(prefix="/v1/graphs", tags=["graphs"])

_BODY = {
    "requestBody": {
        "description": "The graph as the binary body (GraphDef binary/text, gzip, or JSON), "
        "or a multipart form with a `file` field.",
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary"}},
                    "required": ["file"],
                }
            },
        },
        "required": True,
    }
}


async def _upload_bytes(request: Request) -> tuple[bytes, str]:
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        form = await request.form()
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise Problem(422, "the multipart form needs a 'file' field with the graph")
        return await upload.read(), upload.filename or ""
    return await request.body(), request.query_params.get("label", "")


def _public(row: GraphRow) -> GraphPublic:
    return GraphPublic.model_validate(row, from_attributes=True)


@router.post("", status_code=201, response_model=GraphPublic, openapi_extra=_BODY)
async def upload_graph(request: Request, _: SubmitKey) -> GraphPublic:
    """Store a graph (validated: parses, acyclic, within limits) and return its id."""
    data, label = await _upload_bytes(request)
    if not data:
        raise Problem(422, "the request body is empty; send the graph")
    settings = request.app.state.settings

    def store() -> GraphPublic:
        with session_scope(settings.sqlalchemy_url) as session:
            return _public(store_graph(session, settings, data, label=label))

    return await run_in_threadpool(store)


@router.get("/{graph_id}", response_model=GraphPublic)
def get_graph(graph_id: str, session: SessionDep, _: ReadKey) -> GraphPublic:
    """A stored graph's id, fingerprint and size."""
    row = session.get(GraphRow, graph_id)
    if row is None:
        raise Problem(404, f"graph {graph_id} does not exist")
    return _public(row)
