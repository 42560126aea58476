"""``/v1/graphs``: upload a training graph once, refer to it by id in jobs."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from tagplan.db.models import GraphRow, Holding
from tagplan.db.session import session_scope
from tagplan.service.deps import ReadKey, SessionDep, SubmitKey
from tagplan.service.intake import store_graph
from tagplan.service.problems import Problem
from tagplan.service.schemas import GraphPublic
from tagplan.service.tenancy import find_held
from tagplan.service.uploads import BINARY_BODY, upload_body

router = APIRouter(prefix="/v1/graphs", tags=["graphs"])


def _public(row: GraphRow, mine: Holding | None) -> GraphPublic:
    """The graph as its tenant knows it: its own label and upload time."""
    public = GraphPublic.model_validate(row, from_attributes=True)
    if mine is None:
        return public
    return public.model_copy(update={"label": mine.label, "created_at": mine.created_at})


@router.post("", status_code=201, response_model=GraphPublic, openapi_extra=BINARY_BODY)
async def upload_graph(request: Request, caller: SubmitKey) -> GraphPublic:
    """Store a graph (validated: parses, acyclic, within limits) and return its id; the
    caller's tenant holds it (one stored copy however many tenants upload it)."""
    data, label = await upload_body(request)
    if not data:
        raise Problem(422, "the request body is empty; send the graph")
    settings = request.app.state.settings

    def store() -> GraphPublic:
        with session_scope(settings.sqlalchemy_url) as session:
            row, mine = store_graph(session, settings, data, tenant=caller.tenant, label=label)
            return _public(row, mine)

    return await run_in_threadpool(store)


@router.get("/{graph_id}", response_model=GraphPublic)
def get_graph(graph_id: str, session: SessionDep, caller: ReadKey) -> GraphPublic:
    """A stored graph's id, fingerprint and size (404 unless the caller's tenant holds it)."""
    return _public(*find_held(session, caller, GraphRow, "graph", graph_id))
