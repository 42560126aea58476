"""Who is calling: API keys with scopes, a per-key rate limit (:mod:`.rate_limit`), and the
loopback exception.

Every route except the health probes depends on :func:`require` with a scope. A key is
sent as ``Authorization: Bearer <token>`` or ``X-API-Key: <token>``. With
``allow_anonymous_loopback`` (the embedded demo) a request from 127.0.0.1/::1 without a key
gets every scope; nothing else is anonymous. The principal carries the key's tenant, which
owns what its requests store (:mod:`.tenancy`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from tagplan.db.keys import ANONYMOUS_TENANT, SCOPES, expand_scopes, verify_key
from tagplan.db.session import session_scope
from tagplan.service.problems import Problem
from tagplan.settings import Settings

__all__ = ["KeyCache", "Principal", "require"]

LOOPBACK = frozenset({"127.0.0.1", "::1"})
KEY_CACHE_TTL_S = 10.0
"""A revoked key stops working within this long (keys are cached to keep GETs fast)."""


@dataclass(frozen=True)
class Principal:
    """The caller: a key id (None for anonymous loopback), its scopes, rate limit and
    tenant."""

    key_id: str | None
    scopes: frozenset[str]
    rate_limit_per_minute: int | None
    tenant: str

    @property
    def sees_all(self) -> bool:
        """Operators (operate, admin) see every tenant's jobs and uploads."""
        return "operate" in self.scopes


class KeyCache:
    """Token -> principal for ``KEY_CACHE_TTL_S`` seconds (one database read per key per TTL)."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[float, Principal | None]] = {}
        self._lock = threading.Lock()

    async def lookup(self, url: str, token: str) -> Principal | None:
        """From memory when fresh; otherwise one database read in a worker thread."""
        now = time.monotonic()
        with self._lock:
            hit = self._entries.get(token)
        if hit is not None and now - hit[0] < KEY_CACHE_TTL_S:
            return hit[1]
        principal = await run_in_threadpool(self._read, url, token)
        with self._lock:
            self._entries[token] = (now, principal)
        return principal

    @staticmethod
    def _read(url: str, token: str) -> Principal | None:
        with session_scope(url) as session:
            row = verify_key(session, token)
            if row is None:
                return None
            scopes = expand_scopes(row.scopes.split())
            return Principal(row.id, scopes, row.rate_limit_per_minute, row.tenant)


def _token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return request.headers.get("x-api-key") or None


async def authenticate(request: Request) -> Principal:
    """The request's principal; 401 without a valid key (unless anonymous loopback)."""
    settings: Settings = request.app.state.settings
    token = _token(request)
    if token is None:
        client = request.client.host if request.client else ""
        if settings.allow_anonymous_loopback and client in LOOPBACK:
            return Principal(None, frozenset(SCOPES), None, ANONYMOUS_TENANT)
        raise _unauthorized("an API key is required (Authorization: Bearer <key>)")
    principal = await request.app.state.key_cache.lookup(settings.sqlalchemy_url, token)
    if principal is None:
        raise _unauthorized("the API key is unknown or revoked")
    limit = principal.rate_limit_per_minute or settings.rate_limit_per_minute
    await request.app.state.rate_limiter.check(principal.key_id, limit)
    return principal


def _unauthorized(detail: str) -> Problem:
    problem = Problem(401, detail)
    problem.headers["WWW-Authenticate"] = "Bearer"
    return problem


def require(scope: str) -> Callable[[Request], Awaitable[Principal]]:
    """A dependency that admits callers holding ``scope`` (403 for other keys).

    Async, so the common path (a cached key) costs no trip through the thread pool.
    """
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")

    async def dependency(request: Request) -> Principal:
        principal = await authenticate(request)
        if scope not in principal.scopes:
            held = ", ".join(sorted(principal.scopes))
            raise Problem(403, f"this key lacks the {scope!r} scope (it has: {held})")
        return principal

    return dependency
