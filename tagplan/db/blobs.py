"""Content-addressed blob store in the database: API and workers share it with no volume."""

from __future__ import annotations

import hashlib
import zlib

from sqlalchemy import select
from sqlalchemy.orm import Session

from tagplan.db.models import Blob
from tagplan.db.session import add_once

__all__ = ["digest_of", "get_blob", "put_blob"]


def digest_of(data: bytes) -> str:
    """Hex SHA-256: the blob's key."""
    return hashlib.sha256(data).hexdigest()


def put_blob(session: Session, data: bytes) -> str:
    """Store ``data`` once and return its digest (storing it again is a no-op)."""
    digest = digest_of(data)
    if session.get(Blob, digest) is None:
        add_once(session, Blob(digest=digest, size_bytes=len(data), data=zlib.compress(data, 3)))
    return digest


def get_blob(session: Session, digest: str) -> bytes:
    """The bytes stored under ``digest``; KeyError when absent."""
    data = session.scalar(select(Blob.data).where(Blob.digest == digest))
    if data is None:
        raise KeyError(digest)
    return zlib.decompress(data)
