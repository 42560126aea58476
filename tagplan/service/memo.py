"""A small time-to-live cache for hot, read-only answers (the strategy cache GET).

Stored results never change, so the only staleness is a result stored in the last
``ttl_s`` seconds not showing yet. Bounded: the oldest entries go first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

__all__ = ["TtlCache"]


class TtlCache:
    """Thread-safe mapping whose entries expire ``ttl_s`` after being stored."""

    def __init__(self, ttl_s: float, *, max_entries: int = 4096) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        """The live value under ``key``, or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] < time.monotonic():
                return None
            return entry[1]

    def put(self, key: Hashable, value: Any) -> None:
        """Store ``value`` (nothing when the TTL is 0)."""
        if self.ttl_s <= 0:
            return
        with self._lock:
            self._entries[key] = (time.monotonic() + self.ttl_s, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
