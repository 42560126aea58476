"""A time-to-live cache for hot, read-only answers (the strategy cache GET).

Stored results never change, so the only staleness is a result stored in the last
``ttl_s`` seconds not showing yet. Loads are single-flight: when an entry expires, the
first request refreshes it in the thread pool while the others keep getting the expired
value (or, for a key never loaded, wait for that one load) instead of all querying the
database at once. Bounded: the oldest entries go first. Used from the event loop only.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from starlette.concurrency import run_in_threadpool

__all__ = ["TtlCache"]


class TtlCache:
    """Values by key, refreshed ``ttl_s`` after they were loaded (0: always load)."""

    def __init__(self, ttl_s: float, *, max_entries: int = 4096) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._loading: dict[Hashable, asyncio.Future[Any]] = {}

    async def get(self, key: Hashable, load: Callable[[], Any]) -> Any:
        """The value under ``key``; ``load`` (blocking) runs in the thread pool when needed."""
        if self.ttl_s <= 0:
            return await run_in_threadpool(load)
        entry = self._entries.get(key)
        if entry is not None and entry[0] >= time.monotonic():
            return entry[1]
        pending = self._loading.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._load(key, load))
            self._loading[key] = pending
        if entry is not None:
            return entry[1]  # stale while the refresh runs
        return await asyncio.shield(pending)

    async def _load(self, key: Hashable, load: Callable[[], Any]) -> Any:
        try:
            value = await run_in_threadpool(load)
            self._entries[key] = (time.monotonic() + self.ttl_s, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return value
        finally:
            del self._loading[key]
