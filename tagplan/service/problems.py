"""Errors as RFC 9457 ``application/problem+json``, from one place.

Routes and helpers raise :class:`Problem` (or let the planner's errors through); the
handlers installed by :func:`install_problem_handlers` render every error the same way,
so clients parse one shape: ``{"type", "title", "status", "detail", ...}``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from tagplan.planner.errors import Infeasible, InvalidInput, PlannerError
from tagplan.planner.validation import describe_errors, dotted_location

__all__ = [
    "DATABASE_RETRY_AFTER_S",
    "PROBLEM_JSON",
    "Problem",
    "install_problem_handlers",
    "problem_response",
]

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
TYPE_BASE = "https://tagplan.dev/problems/"
DATABASE_RETRY_AFTER_S = 5
"""The ``Retry-After`` of a request refused because the database is unreachable."""


class Problem(Exception):
    """An HTTP error with a problem type slug and a human-readable detail."""

    def __init__(self, status: int, detail: str, *, kind: str | None = None, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.kind = kind or HTTPStatus(status).phrase.lower().replace(" ", "-")
        self.extra = extra
        self.headers: dict[str, str] = {}


def problem_response(
    status: int, detail: str, *, kind: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    """The problem document for ``status`` with ``detail`` (a lone surrogate of the input it
    quotes written as its escape, so the document encodes as UTF-8)."""
    body = {
        "type": TYPE_BASE + kind,
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail.encode("utf-8", "backslashreplace").decode("utf-8"),
        **extra,
    }
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _request_location(loc: Sequence[Any]) -> str:
    """The location inside the request: ``options.budget_s`` for the body's fields (no
    ``body.`` prefix), ``query.limit`` for a query parameter."""
    parts = tuple(loc)
    return dotted_location(parts[1:] if parts[:1] == ("body",) else parts)


def _validation_detail(exc: RequestValidationError) -> str:
    """The request's problems in the wording of every validated input
    (:func:`~tagplan.planner.validation.describe_errors`)."""
    return describe_errors(exc.errors(), "request", location=_request_location)


def install_problem_handlers(app: FastAPI) -> None:
    """Render :class:`Problem`, planner errors, validation and HTTP errors as problems, and
    a database that cannot be reached as a 503 the client retries."""

    @app.exception_handler(Problem)
    async def _problem(_: Request, exc: Problem) -> JSONResponse:
        return problem_response(
            exc.status, exc.detail, kind=exc.kind, headers=exc.headers, **exc.extra
        )

    @app.exception_handler(InvalidInput)
    async def _invalid(_: Request, exc: InvalidInput) -> JSONResponse:
        return problem_response(422, str(exc), kind="invalid-input")

    @app.exception_handler(Infeasible)
    async def _infeasible(_: Request, exc: Infeasible) -> JSONResponse:
        return problem_response(422, str(exc), kind="infeasible", overflow_bytes=exc.overflow_bytes)

    @app.exception_handler(PlannerError)
    async def _planner(_: Request, exc: PlannerError) -> JSONResponse:
        return problem_response(422, str(exc), kind="planner-error")

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return problem_response(422, _validation_detail(exc), kind="invalid-request")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = HTTPStatus(exc.status_code).phrase.lower().replace(" ", "-")
        return problem_response(
            exc.status_code, str(exc.detail), kind=kind, headers=dict(exc.headers or {})
        )

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _database_unreachable(request: Request, exc: DBAPIError) -> JSONResponse:
        """The database is down, restarting or refused the connection (SQLAlchemy wraps the
        driver's connection errors in these two): nothing the request did is wrong, so a
        503 with ``Retry-After`` rather than a 500; the pool drops the broken connections."""
        reason = str(exc.orig if exc.orig is not None else exc).strip()
        log.warning(
            "%s %s: the database is unreachable: %s",
            request.method,
            request.url.path,
            reason.splitlines()[0] if reason else type(exc).__name__,
        )
        return problem_response(
            503,
            "the database is unreachable; retry later",
            kind="database-unavailable",
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
        )
