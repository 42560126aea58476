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
from tagplan.service.uploads import BINARY_BODY, upload_body

router = APIRouter(prefix="/v1/graphs", tags=["graphs"])


def _public(row: GraphRow) -> GraphPublic:
    return GraphPublic.model_validate(row, from_attributes=True)


@router.post("", status_code=201, response_model=GraphPublic, openapi_extra=BINARY_BODY)
async def upload_graph(request: Request, _: SubmitKey) -> GraphPublic:
    """Store a graph (validated: parses, acyclic, within limits) and return its id."""
    data, label = await upload_body(request)
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
