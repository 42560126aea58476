"""A job's predicted step as a timeline a browser can draw: windowed and aggregated here.

A plan's Chrome trace holds one event per task on each device and link — hundreds of
thousands for BERT-Large on the cloud cluster, tens of megabytes of JSON — more than a
page should load or a browser should hold. :class:`Timeline` holds the trace's lanes (a
GPU or a link; :mod:`tagplan.planner.trace_lanes`, stored with the plan) and answers a
window ``[start_s, end_s]`` at a width of ``bins`` columns: a lane with few tasks in the
window (a task per four columns at most) gets them one by one, with their names; a busier
lane gets one bar per run of columns in which it was busy, each with the busy share and
the kind (compute, transfer, collective) that took most of its time. The page asks again
for the window the user zooms into.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from tagplan.planner.trace_lanes import KINDS, TraceLanes, lanes_from_trace, loads_lanes

__all__ = ["Timeline", "TimelineCache"]


class Timeline:
    """The lanes of one plan's trace (module docstring)."""

    def __init__(self, lanes: TraceLanes) -> None:
        self.lanes = lanes
        self.span_s = lanes.span_s

    @classmethod
    def from_trace_json(cls, data: bytes) -> Timeline:
        """From the Chrome trace itself (a plan stored before its lanes were)."""
        return cls(lanes_from_trace(json.loads(data)))

    @classmethod
    def from_lanes(cls, data: bytes) -> Timeline:
        return cls(loads_lanes(data))

    def window(
        self, start_s: float | None = None, end_s: float | None = None, bins: int = 800
    ) -> dict[str, Any]:
        """The lanes between ``start_s`` and ``end_s`` (default: the whole step) at ``bins``
        columns: ``{"span_s", "start_s", "end_s", "lanes": [{"name", "kind", "tasks",
        "bars": [[start_s, end_s, kind, label or busy share]]}]}``."""
        lo = 0.0 if start_s is None else max(0.0, start_s)
        hi = self.span_s if end_s is None else min(self.span_s, end_s)
        hi = max(hi, lo + 1e-12)
        bins = max(10, min(bins, 4000))
        all_lanes = self.lanes
        lanes = []
        for i, name in enumerate(all_lanes.names):
            a, b = int(all_lanes.ptr[i]), int(all_lanes.ptr[i + 1])
            start, end = all_lanes.start_s[a:b], all_lanes.end_s[a:b]
            inside = np.flatnonzero((end > lo) & (start < hi)) + a
            if inside.size <= bins // 4:  # a task per 4 columns at least: each drawn
                bars = [
                    [
                        float(all_lanes.start_s[t]),
                        float(all_lanes.end_s[t]),
                        KINDS[all_lanes.task_kind[t]],
                        all_lanes.labels[all_lanes.label[t]],
                    ]
                    for t in inside.tolist()
                ]
            else:
                bars = _binned(all_lanes, inside, lo, hi, bins)
            kind = all_lanes.kinds[i]
            lanes.append({"name": name, "kind": kind, "tasks": int(inside.size), "bars": bars})
        return {"span_s": self.span_s, "start_s": lo, "end_s": hi, "lanes": lanes}


def _binned(
    lanes: TraceLanes, inside: np.ndarray, lo: float, hi: float, bins: int
) -> list[list[Any]]:
    """Runs of busy columns: each with the share of the run's time busy and the kind
    that was busy longest."""
    edges = np.linspace(lo, hi, bins + 1)
    width = (hi - lo) / bins
    busy = np.zeros((len(KINDS), bins))
    starts = np.clip(lanes.start_s[inside], lo, hi)
    ends = np.clip(lanes.end_s[inside], lo, hi)
    kinds = lanes.task_kind[inside]
    first = np.minimum(((starts - lo) / width).astype(np.int64), bins - 1)
    last = np.minimum(((ends - lo) / width).astype(np.int64), bins - 1)
    within = first == last  # most tasks: one column, added at once
    np.add.at(busy, (kinds[within], first[within]), (ends - starts)[within])
    for i in np.flatnonzero(~within).tolist():
        s, e, k = starts[i], ends[i], kinds[i]
        for column in range(int(first[i]), int(last[i]) + 1):
            overlap = min(e, edges[column + 1]) - max(s, edges[column])
            if overlap > 0:
                busy[k, column] += overlap
    total = busy.sum(axis=0)
    bars: list[list[Any]] = []
    column = 0
    while column < bins:
        if total[column] <= 0:
            column += 1
            continue
        end = column
        while end + 1 < bins and total[end + 1] > 0:
            end += 1
        run = busy[:, column : end + 1].sum(axis=1)
        share = float(min(1.0, run.sum() / ((end + 1 - column) * width)))
        bars.append([float(edges[column]), float(edges[end + 1]), KINDS[int(run.argmax())], share])
        column = end + 1
    return bars


class TimelineCache:
    """The last few jobs' timelines, so zooming does not parse the trace again."""

    def __init__(self, max_items: int = 4) -> None:
        self.max_items = max_items
        self._items: OrderedDict[str, Timeline] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, load: Callable[[], Timeline]) -> Timeline:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                return found
        timeline = load()
        with self._lock:
            self._items[key] = timeline
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)
        return timeline
