"""``/v1/profiles``: measured op-time and communication profiles uploaded by operators."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Query
from fastapi.responses import Response

from tagplan.db.blobs import get_blob, put_blob
from tagplan.db.models import Holding, Profile
from tagplan.db.session import add_once
from tagplan.planner.cost.comm_profile import COMM_PROFILE_FORMAT, parse_comm_profile
from tagplan.planner.cost.profile import PROFILE_FORMAT, load_profile
from tagplan.planner.errors import InvalidInput
from tagplan.service.deps import OperateKey, ReadKey, SessionDep
from tagplan.service.schemas import ProfilePublic
from tagplan.service.tenancy import find_held, hold, list_held

router = APIRouter(prefix="/v1/profiles", tags=["profiles"])


def _validate(document: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The profile's kind and a few facts for listings; InvalidInput names the problem."""
    try:
        json.dumps(document, ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:
        lone = exc.object[exc.start : exc.end]
        raise InvalidInput(f"the profile is not valid Unicode: it has {lone!r}") from None
    kind = document.get("format")
    if kind == PROFILE_FORMAT:
        profile = load_profile(document)
        meta = {
            "gpu_type": profile.device.gpu_type,
            "graph": profile.source.graph,
            "batch_sizes": profile.batch_sizes,
            "ops": len(profile.ops),
        }
        return "op", meta
    if kind == COMM_PROFILE_FORMAT:
        comm = parse_comm_profile(document)
        return "comm", {"device_kind": comm.device_kind}
    raise InvalidInput(
        f"unknown profile format {kind!r}: expected {PROFILE_FORMAT!r} (tagplan profile) "
        f"or {COMM_PROFILE_FORMAT!r} (tagplan profile-comm)"
    )


def _public(row: Profile, mine: Holding | None) -> ProfilePublic:
    """The profile as its tenant knows it: its own name and upload time."""
    public = ProfilePublic.model_validate(row, from_attributes=True)
    if mine is None:
        return public
    return public.model_copy(update={"name": mine.label, "created_at": mine.created_at})


@router.post("", status_code=201, response_model=ProfilePublic)
def upload_profile(
    session: SessionDep,
    caller: OperateKey,
    document: Annotated[dict[str, Any], Body(description="from tagplan profile/profile-comm")],
    name: str = Query(default="", max_length=200),
) -> ProfilePublic:
    """Store a profile after validating it strictly; the caller's tenant holds it, and its
    jobs can name it."""
    kind, meta = _validate(document)
    data = json.dumps(document, sort_keys=True).encode()
    digest = put_blob(session, data)
    row = add_once(session, Profile(id=digest, name=name, kind=kind, blob_digest=digest, meta=meta))
    return _public(row, hold(session, caller.tenant, "profile", digest, name))


@router.get("", response_model=list[ProfilePublic])
def list_profiles(
    session: SessionDep, caller: ReadKey, kind: Literal["op", "comm"] | None = None
) -> list[ProfilePublic]:
    """The tenant's profiles (every tenant's for operators), newest first."""
    query = list_held(caller, Profile, "profile")
    if kind:
        query = query.where(Profile.kind == kind)
    return [_public(row, mine) for row, mine in session.execute(query)]


@router.get("/{profile_id}", response_class=Response)
def get_profile(profile_id: str, session: SessionDep, caller: ReadKey) -> Response:
    """The profile file as uploaded (JSON)."""
    row, _ = find_held(session, caller, Profile, "profile", profile_id)
    return Response(get_blob(session, row.blob_digest), media_type="application/json")
