"""Request limits as ASGI middleware: 431 for a large head, 413 before a large body is
read into memory, 400 for a NUL character in the URL.

The HTTP parser has read the head (request line and headers) before the app sees it:
``tagplan serve`` runs uvicorn's h11 parser, which buffers at most ``max_header_bytes`` of
an unfinished head; a longer head that came in one read is refused here, so the limit
holds whatever the packets. A declared ``Content-Length`` over the body limit is refused
at once; a chunked body is counted as it streams and cut off when it passes the limit.
No text column stores a NUL character, so a path or query naming one is refused before a
route looks it up (the schemas refuse it in bodies).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tagplan.service.problems import PROBLEM_JSON, TYPE_BASE

__all__ = ["RequestSizeLimit"]


class _TooLarge(Exception):
    pass


def _head_bytes(scope: Scope) -> int:
    """The size of the request's head as sent: request line and ``name: value`` lines."""
    target = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 1
    line = len(scope["method"]) + target + len("HTTP/1.1") + 4
    return line + sum(len(name) + len(value) + 4 for name, value in scope.get("headers") or [])


def _url_has_nul(scope: Scope) -> bool:
    """True when the decoded path or the query string holds a NUL character."""
    query = (scope.get("query_string") or b"").lower()
    return "\x00" in scope["path"] or b"%00" in query or b"\x00" in query


class RequestSizeLimit:
    """Refuse heads over ``max_header_bytes`` (431), bodies over ``max_bytes`` (413) and
    URLs with a NUL character (400)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, max_header_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _head_bytes(scope) > self.max_header_bytes:
            detail = (
                f"the request line and headers exceed the limit of {self.max_header_bytes} bytes"
            )
            await _reject(send, 431, "headers-too-large", detail)
            return
        if _url_has_nul(scope):
            await _reject(send, 400, "bad-request", "the URL contains a NUL character (%00)")
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(send)
            return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._too_large(send)

    async def _too_large(self, send: Send) -> None:
        detail = f"the request body exceeds the limit of {self.max_bytes} bytes"
        await _reject(send, 413, "request-too-large", detail)


async def _reject(send: Send, status: int, kind: str, detail: str) -> None:
    """Answer with a problem document and close the connection."""
    body: dict[str, Any] = {
        "type": TYPE_BASE + kind,
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
    }
    payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
