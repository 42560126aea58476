"""Dependencies the routes share: the session, the settings, the caller (docs/design.md §9)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from tagplan.db.session import session_scope
from tagplan.service.auth import Principal, require
from tagplan.settings import Settings

__all__ = [
    "AdminKey",
    "OperateKey",
    "ReadKey",
    "SessionDep",
    "SettingsDep",
    "SubmitKey",
]


async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    """A session committed when the route returns, before its response is sent
    (``scope="function"`` below): a client that sends its next request on the answer,
    as the dashboard does after a change, reads what the change wrote."""
    with session_scope(request.app.state.settings.sqlalchemy_url) as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SubmitKey = Annotated[Principal, Depends(require("submit"))]
ReadKey = Annotated[Principal, Depends(require("read"))]
OperateKey = Annotated[Principal, Depends(require("operate"))]
AdminKey = Annotated[Principal, Depends(require("admin"))]
