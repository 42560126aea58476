"""``/v1/profiles``: measured op-time and communication profiles uploaded by operators."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from fastapi.responses import Response
from sqlalchemy import select

from tagplan.db.blobs import get_blob, put_blob
from tagplan.db.models import Profile
from tagplan.planner.cost.comm_profiler import COMM_PROFILE_FORMAT, parse_comm_profile
from tagplan.planner.cost.profile import PROFILE_FORMAT, load_profile
from tagplan.planner.errors import InvalidInput
from tagplan.service.deps import OperateKey, ReadKey, SessionDep
from tagplan.service.problems import Problem
from tagplan.service.schemas import ProfilePublic

router = APIRouter(prefix="/v1/profiles", tags=["profiles"])


def _validate(document: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The profile's kind and a few facts for listings; InvalidInput names the problem."""
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


@router.post("", status_code=201, response_model=ProfilePublic)
def upload_profile(
    session: SessionDep,
    _: OperateKey,
    document: Annotated[dict[str, Any], Body(description="from tagplan profile/profile-comm")],
    name: str = Query(default="", max_length=200),
) -> ProfilePublic:
    """Store a profile after validating it strictly."""
    kind, meta = _validate(document)
    data = json.dumps(document, sort_keys=True).encode()
    digest = put_blob(session, data)
    row = session.get(Profile, digest)
    if row is None:
        row = Profile(id=digest, name=name, kind=kind, blob_digest=digest, meta=meta)
        session.add(row)
        session.flush()
    return ProfilePublic.model_validate(row, from_attributes=True)


@router.get("", response_model=list[ProfilePublic])
def list_profiles(session: SessionDep, _: ReadKey, kind: str | None = None) -> list[ProfilePublic]:
    """Stored profiles, newest first."""
    query = select(Profile).order_by(Profile.created_at.desc())
    if kind:
        query = query.where(Profile.kind == kind)
    return [ProfilePublic.model_validate(r, from_attributes=True) for r in session.scalars(query)]


@router.get("/{profile_id}", response_class=Response)
def get_profile(profile_id: str, session: SessionDep, _: ReadKey) -> Response:
    """The profile file as uploaded (JSON)."""
    row = session.get(Profile, profile_id)
    if row is None:
        raise Problem(404, f"profile {profile_id} does not exist")
    return Response(get_blob(session, row.blob_digest), media_type="application/json")
