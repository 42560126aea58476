"""API keys: ``tpk_<id>_<secret>``; only the SHA-256 of the secret is stored.

The secret is 32 random bytes, so a plain hash is enough (no password stretching: nobody
can guess it); the id makes lookup one primary-key read. Every key belongs to a tenant: a
name shared by the keys of one team, or ``key:<id>`` (a tenant of its own) when none is
given. Names cannot contain ``:``, so they never meet such a tenant or
:data:`ANONYMOUS_TENANT`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable

from sqlalchemy.orm import Session

from tagplan.db.models import ApiKey

__all__ = ["ANONYMOUS_TENANT", "SCOPES", "create_key", "expand_scopes", "verify_key"]

SCOPES = ("submit", "read", "operate", "admin")
_IMPLIED = {"admin": set(SCOPES), "operate": {"operate", "read"}, "submit": {"submit", "read"}}
_PREFIX = "tpk"
_TENANT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ANONYMOUS_TENANT = "anonymous:loopback"
"""The tenant of requests without a key (the embedded demo's loopback exception)."""


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def expand_scopes(scopes: Iterable[str]) -> frozenset[str]:
    """Scopes with what they imply: admin is everything; submit and operate can read."""
    out: set[str] = set()
    for scope in scopes:
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}; scopes are {', '.join(SCOPES)}")
        out |= _IMPLIED.get(scope, {scope})
    return frozenset(out)


def create_key(
    session: Session,
    *,
    scopes: Iterable[str],
    name: str = "",
    rate_limit: int | None = None,
    tenant: str | None = None,
) -> tuple[ApiKey, str]:
    """Store a new key of ``tenant`` (None: a tenant of its own) and return it with its
    token (shown once, never stored)."""
    scope_list = sorted(set(scopes))
    expand_scopes(scope_list)
    if not scope_list:
        raise ValueError(f"a key needs at least one scope of {', '.join(SCOPES)}")
    if tenant is not None and not _TENANT_RE.match(tenant):
        raise ValueError(
            f"tenant {tenant!r} must be 1 to 64 letters, digits and . _ -, "
            "starting with a letter or digit"
        )
    key_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
    row = ApiKey(
        id=key_id,
        name=name,
        secret_hash=_hash(secret),
        scopes=" ".join(scope_list),
        rate_limit_per_minute=rate_limit,
        tenant=tenant or f"key:{key_id}",
    )
    session.add(row)
    session.flush()
    return row, f"{_PREFIX}_{key_id}_{secret}"


def verify_key(session: Session, token: str) -> ApiKey | None:
    """The live key ``token`` belongs to, or None."""
    prefix, _, rest = token.partition("_")
    key_id, _, secret = rest.partition("_")
    if prefix != _PREFIX or not key_id or not secret:
        return None
    row = session.get(ApiKey, key_id)
    if row is None or row.revoked_at is not None:
        return None
    return row if hmac.compare_digest(row.secret_hash, _hash(secret)) else None
