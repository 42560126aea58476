"""A job's predicted step as a timeline a browser can draw: windowed and aggregated here.

A plan's Chrome trace holds one event per task on each device and link — hundreds of
thousands for BERT-Large on the cloud cluster, tens of megabytes of JSON — more than a
page should load or a browser should hold. :class:`Timeline` reads the trace once into
arrays per lane (a GPU or a link) and answers a window ``[start_s, end_s]`` at a width of
``bins`` columns: a lane with few tasks in the window gets them one by one, with their
names; a busier lane gets one bar per run of columns in which it was busy, each with the
busy share and the kind (compute, transfer, collective) that took most of its time. The
page asks again for the window the user zooms into.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["KINDS", "Timeline", "TimelineCache"]

KINDS = ("compute", "transfer", "collective")
_KIND = {name: k for k, name in enumerate(KINDS)}


@dataclass(frozen=True)
class _Lane:
    name: str
    kind: str  # "device" or "link"
    start_s: np.ndarray
    end_s: np.ndarray
    task_kind: np.ndarray  # index into KINDS
    label: list[str]


class Timeline:
    """The lanes of one trace (module docstring)."""

    def __init__(self, trace: dict[str, Any]) -> None:
        names: dict[int, str] = {}
        order: dict[int, int] = {}
        threads: dict[int, str] = {}
        events: dict[int, list[tuple[float, float, int, str]]] = {}
        for event in trace.get("traceEvents", []):
            phase, pid = event.get("ph"), event.get("pid")
            if phase == "M":
                args = event.get("args", {})
                if event["name"] == "process_name":
                    names[pid] = str(args.get("name", pid))
                elif event["name"] == "process_sort_index":
                    order[pid] = int(args.get("sort_index", pid))
                elif event["name"] == "thread_name":
                    threads[pid] = str(args.get("name", ""))
            elif phase == "X":
                start = float(event["ts"]) * 1e-6
                kind = _KIND.get(str(event.get("cat")), 0)
                entry = (start, start + float(event["dur"]) * 1e-6, kind, str(event["name"]))
                events.setdefault(pid, []).append(entry)
        self.step_time_s = float(trace.get("otherData", {}).get("step_time_s") or 0.0)
        self.lanes: list[_Lane] = []
        for pid in sorted(names, key=lambda p: (order.get(p, p), p)):
            found = sorted(events.get(pid, []))
            self.lanes.append(
                _Lane(
                    name=names[pid],
                    kind="device" if threads.get(pid) == "compute" else "link",
                    start_s=np.array([e[0] for e in found], dtype=np.float64),
                    end_s=np.array([e[1] for e in found], dtype=np.float64),
                    task_kind=np.array([e[2] for e in found], dtype=np.int8),
                    label=[e[3] for e in found],
                )
            )
        ends = [float(lane.end_s.max()) for lane in self.lanes if lane.end_s.size]
        self.span_s = max([self.step_time_s, *ends]) if ends or self.step_time_s else 0.0

    @classmethod
    def from_json(cls, data: bytes) -> Timeline:
        return cls(json.loads(data))

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
        lanes = []
        for lane in self.lanes:
            inside = np.flatnonzero((lane.end_s > lo) & (lane.start_s < hi))
            if inside.size <= bins:
                bars = [
                    [
                        float(lane.start_s[i]),
                        float(lane.end_s[i]),
                        KINDS[lane.task_kind[i]],
                        lane.label[i],
                    ]
                    for i in inside.tolist()
                ]
            else:
                bars = self._binned(lane, inside, lo, hi, bins)
            lanes.append(
                {"name": lane.name, "kind": lane.kind, "tasks": int(inside.size), "bars": bars}
            )
        return {"span_s": self.span_s, "start_s": lo, "end_s": hi, "lanes": lanes}

    @staticmethod
    def _binned(
        lane: _Lane, inside: np.ndarray, lo: float, hi: float, bins: int
    ) -> list[list[Any]]:
        """Runs of busy columns: each with the share of the run's time busy and the kind
        that was busy longest."""
        edges = np.linspace(lo, hi, bins + 1)
        width = (hi - lo) / bins
        busy = np.zeros((len(KINDS), bins))
        starts = np.clip(lane.start_s[inside], lo, hi)
        ends = np.clip(lane.end_s[inside], lo, hi)
        kinds = lane.task_kind[inside]
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
            bars.append(
                [float(edges[column]), float(edges[end + 1]), KINDS[int(run.argmax())], share]
            )
            column = end + 1
        return bars


class TimelineCache:
    """The last few jobs' timelines, so zooming does not parse the trace again."""

    def __init__(self, max_items: int = 4) -> None:
        self.max_items = max_items
        self._items: OrderedDict[str, Timeline] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str, load: Callable[[], bytes]) -> Timeline:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
                return found
        timeline = Timeline.from_json(load())
        with self._lock:
            self._items[key] = timeline
            while len(self._items) > self.max_items:
                self._items.popitem(last=False)
        return timeline
