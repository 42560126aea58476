"""A plan's trace as columns per lane (a GPU or a link), stored beside the Chrome trace.

The Chrome trace of a large plan is tens of megabytes of JSON (DP-NCCL of BERT-Large on
the cloud cluster: 250,000 events, 46 MB) that take seconds to parse; the dashboard's
timeline needs it per lane, sorted by time. :func:`lanes_from_trace` turns the trace into
that once, where the plan is made, and :func:`dumps_lanes` stores it as a compressed
NumPy archive that loads in milliseconds (``tagplan.service.timeline`` windows it).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["KINDS", "TraceLanes", "dumps_lanes", "lanes_from_trace", "loads_lanes"]

KINDS = ("compute", "transfer", "collective")
_KIND = {name: k for k, name in enumerate(KINDS)}
_SEPARATOR = "\x00"  # never in a node name, a device name or a link name


@dataclass(frozen=True, eq=False)
class TraceLanes:
    """Lane ``i`` (``names[i]``, a ``"device"`` or a ``"link"``) holds tasks
    ``ptr[i]:ptr[i + 1]``, sorted by start; ``label[t]`` indexes ``labels``."""

    names: list[str]
    kinds: list[str]
    ptr: np.ndarray  # int64 (L + 1,)
    start_s: np.ndarray  # float64
    end_s: np.ndarray  # float64
    task_kind: np.ndarray  # int8: index into KINDS
    label: np.ndarray  # int32: index into labels
    labels: list[str]
    step_time_s: float

    @property
    def span_s(self) -> float:
        last = float(self.end_s.max()) if self.end_s.size else 0.0
        return max(self.step_time_s, last)


def lanes_from_trace(trace: dict[str, Any]) -> TraceLanes:
    """The lanes of a Chrome trace written by :func:`~tagplan.planner.sim.trace.chrome_trace`
    (or any trace with named processes and complete events), in the trace's lane order."""
    names: dict[int, str] = {}
    order: dict[int, int] = {}
    compute: set[int] = set()
    pids: list[int] = []
    starts: list[float] = []
    durations: list[float] = []
    kinds: list[int] = []
    labels: list[int] = []
    label_index: dict[str, int] = {}
    for event in trace.get("traceEvents", []):
        phase, pid = event.get("ph"), event.get("pid")
        if phase == "X":
            pids.append(pid)
            starts.append(event["ts"])
            durations.append(event["dur"])
            kinds.append(_KIND.get(event.get("cat"), 0))
            labels.append(label_index.setdefault(str(event["name"]), len(label_index)))
        elif phase == "M":
            args = event.get("args", {})
            if event["name"] == "process_name":
                names[pid] = str(args.get("name", pid))
            elif event["name"] == "process_sort_index":
                order[pid] = int(args.get("sort_index", pid))
            elif event["name"] == "thread_name" and args.get("name") == "compute":
                compute.add(pid)
    lane_pids = sorted(names, key=lambda p: (order.get(p, p), p))
    lane_of = {pid: i for i, pid in enumerate(lane_pids)}
    lane = np.array([lane_of.get(p, -1) for p in pids], dtype=np.int64)
    start = np.array(starts, dtype=np.float64) * 1e-6
    end = start + np.array(durations, dtype=np.float64) * 1e-6
    keep = np.flatnonzero(lane >= 0)
    sort = keep[np.lexsort((start[keep], lane[keep]))]
    counts = np.bincount(lane[sort], minlength=len(lane_pids))
    return TraceLanes(
        names=[names[p] for p in lane_pids],
        kinds=["device" if p in compute else "link" for p in lane_pids],
        ptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        start_s=start[sort],
        end_s=end[sort],
        task_kind=np.array(kinds, dtype=np.int8)[sort],
        label=np.array(labels, dtype=np.int32)[sort],
        labels=list(label_index),
        step_time_s=float(trace.get("otherData", {}).get("step_time_s") or 0.0),
    )


def dumps_lanes(lanes: TraceLanes) -> bytes:
    """A compressed NumPy archive of ``lanes`` (no pickled objects)."""
    buffer = io.BytesIO()
    text = {
        "names": _SEPARATOR.join(lanes.names),
        "kinds": _SEPARATOR.join(lanes.kinds),
        "labels": _SEPARATOR.join(lanes.labels),
    }
    np.savez_compressed(
        buffer,
        ptr=lanes.ptr,
        start_s=lanes.start_s,
        end_s=lanes.end_s,
        task_kind=lanes.task_kind,
        label=lanes.label,
        step_time_s=np.array(lanes.step_time_s),
        **{k: np.frombuffer(v.encode(), dtype=np.uint8) for k, v in text.items()},
    )
    return buffer.getvalue()


def loads_lanes(data: bytes) -> TraceLanes:
    """The lanes :func:`dumps_lanes` stored."""
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:

        def strings(key: str) -> list[str]:
            text = archive[key].tobytes().decode()
            return text.split(_SEPARATOR) if text else []

        return TraceLanes(
            names=strings("names"),
            kinds=strings("kinds"),
            ptr=archive["ptr"],
            start_s=archive["start_s"],
            end_s=archive["end_s"],
            task_kind=archive["task_kind"],
            label=archive["label"],
            labels=strings("labels"),
            step_time_s=float(archive["step_time_s"]),
        )
