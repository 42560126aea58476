"""Binary uploads (graphs, checkpoints): the raw request body or a multipart ``file`` field."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from tagplan.service.problems import Problem

__all__ = ["BINARY_BODY", "upload_body"]

BINARY_BODY: dict[str, Any] = {
    "requestBody": {
        "description": "The file as the binary body, or a multipart form with a `file` field.",
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


async def upload_body(request: Request) -> tuple[bytes, str]:
    """The uploaded bytes and a label (the multipart file name or the ``label`` query)."""
    if request.headers.get("content-type", "").startswith("multipart/form-data"):
        form = await request.form()
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise Problem(422, "the multipart form needs a 'file' field")
        return await upload.read(), upload.filename or ""
    return await request.body(), request.query_params.get("label", "")
