"""Requests per API key and minute: a sliding one-minute window per key.

Behind a load balancer several API processes serve one key, so the window lives in Redis
(:class:`RedisRateLimiter`, one sorted set of request times per key, updated by one Lua
script so that concurrent processes cannot both take the last request; Redis's clock
stamps them). The embedded service has no Redis and one process: it counts in memory
(:class:`LocalRateLimiter`). Either raises 429 with ``Retry-After``.

When Redis cannot be reached the limiter lets requests through and logs it: the limit
protects the planner from one noisy key, and refusing every request while Redis restarts
would take down the strategy cache it protects.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
import uuid
from collections import deque
from typing import Any, Protocol

from tagplan.service.problems import Problem
from tagplan.settings import Settings

__all__ = ["LocalRateLimiter", "RateLimiter", "RedisRateLimiter", "rate_limiter_for"]

log = logging.getLogger(__name__)

WINDOW_S = 60.0
_KEY_PREFIX = "tagplan:rate:"
# KEYS[1]: the key's window; ARGV: limit, window seconds, a unique member for this request.
# Returns nil when the request is admitted, else the seconds until the oldest one leaves.
_SLIDING_WINDOW = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return tostring(window - (now - tonumber(oldest[2])))
end
redis.call('ZADD', KEYS[1], now, ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000))
return false
"""


class RateLimiter(Protocol):
    async def check(self, key_id: str, limit: int) -> None:
        """Count a request of ``key_id``; 429 when it is over ``limit`` per minute."""


def _too_many(limit: int, retry_s: float) -> Problem:
    problem = Problem(429, f"rate limit of {limit} requests per minute exceeded for this key")
    problem.headers["Retry-After"] = str(max(1, math.ceil(retry_s)))
    return problem


class LocalRateLimiter:
    """The window in this process's memory (the embedded service: one process)."""

    def __init__(self) -> None:
        self._hits: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    async def check(self, key_id: str, limit: int) -> None:
        now = time.monotonic()
        with self._lock:
            hits = self._hits.setdefault(key_id, deque())
            while hits and now - hits[0] >= WINDOW_S:
                hits.popleft()
            if len(hits) >= limit:
                raise _too_many(limit, WINDOW_S - (now - hits[0]))
            hits.append(now)


class RedisRateLimiter:
    """The window in Redis, shared by every API process that uses the same Redis."""

    def __init__(self, url: str, *, timeout_s: float = 0.5) -> None:
        self._url = url
        self._timeout_s = timeout_s
        self._client: Any = None
        self._script: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._warned_at = -math.inf

    def _bound(self) -> Any:
        """The script on a client of the running event loop (a client serves one loop)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            import redis.asyncio

            self._client = redis.asyncio.Redis.from_url(
                self._url,
                socket_timeout=self._timeout_s,
                socket_connect_timeout=self._timeout_s,
            )
            self._script = self._client.register_script(_SLIDING_WINDOW)
            self._loop = loop
        return self._script

    async def check(self, key_id: str, limit: int) -> None:
        from redis.exceptions import RedisError

        member = uuid.uuid4().hex
        try:
            retry = await self._bound()(keys=[_KEY_PREFIX + key_id], args=[limit, WINDOW_S, member])
        except (RedisError, OSError) as exc:
            now = time.monotonic()
            if now - self._warned_at > WINDOW_S:  # once a minute, not once a request
                log.warning("rate limit not enforced: Redis at %s: %s", self._url, exc)
                self._warned_at = now
            return
        if retry is not None:
            raise _too_many(limit, float(retry))


def rate_limiter_for(settings: Settings) -> RateLimiter:
    """Redis when one is configured (``rate_limit_url``, else a Redis broker); otherwise
    this process's memory."""
    url = settings.rate_limit_url
    if url is None and settings.broker_url and settings.broker_url.startswith("redis"):
        url = settings.broker_url
    return RedisRateLimiter(url) if url else LocalRateLimiter()
