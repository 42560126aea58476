"""Request-size limit as ASGI middleware: 413 before a large body is read into memory.

A declared ``Content-Length`` over the limit is refused at once; a chunked body is counted
as it streams and cut off when it passes the limit.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tagplan.service.problems import PROBLEM_JSON, TYPE_BASE

__all__ = ["BodySizeLimit"]


class _TooLarge(Exception):
    pass


class BodySizeLimit:
    """Refuse request bodies over ``max_bytes`` with 413 problem+json."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send)
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
                await self._reject(send)

    async def _reject(self, send: Send) -> None:
        body: dict[str, Any] = {
            "type": TYPE_BASE + "request-too-large",
            "title": "Content Too Large",
            "status": 413,
            "detail": f"the request body exceeds the limit of {self.max_bytes} bytes",
        }
        payload = json.dumps(body).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", PROBLEM_JSON.encode()),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
