"""A simulated step as a Chrome trace, for Perfetto or ``chrome://tracing`` (docs/design.md §6).

The Trace Event Format (JSON object form, ``{"traceEvents": [...]}``) with:

* one *process* per device (``pid = 1 + device``, thread 0 "compute") and one per link
  (``pid = 1 + num_devices + link``, thread 0 "transfers"), named by metadata events
  (``"ph": "M"``); a last process holds communication tasks that hold no link;
* one complete event (``"ph": "X"``, ``ts`` and ``dur`` in microseconds) per task on each
  resource it holds — a compute task on its device, a transfer or collective on every link
  it holds — named by ``tg.task_names`` when present, with ``args`` ``task``, ``kind``,
  ``group`` and ``bytes``;
* a counter (``"ph": "C"``) ``memory`` per device with the bytes in use over time,
  persistent bytes and framework reserve included, as in ``SimResult.peak_memory_bytes``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np

from tagplan.planner.sim.memory import memory_profile
from tagplan.planner.sim.simulate import SimResult
from tagplan.planner.sim.taskgraph import COMPUTE, TaskGraph

__all__ = ["chrome_trace", "dump_chrome_trace"]

_KIND_NAMES = ("compute", "transfer", "collective")


def _metadata(pid: int, name: str, thread: str, sort_index: int) -> list[dict[str, Any]]:
    return [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}},
        {
            "name": "process_sort_index",
            "ph": "M",
            "pid": pid,
            "tid": 0,
            "args": {"sort_index": sort_index},
        },
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": thread}},
    ]


def chrome_trace(tg: TaskGraph, result: SimResult) -> dict[str, Any]:
    """The Trace Event Format object of the schedule in ``result`` of ``tg``."""
    num_devices, num_links = tg.num_devices, tg.num_links
    unlinked_pid = 1 + num_devices + num_links
    events: list[dict[str, Any]] = []
    for d in range(num_devices):
        name = tg.device_names[d] if d < len(tg.device_names) else f"device {d}"
        events += _metadata(1 + d, name, "compute", d)
    for link in range(num_links):
        name = tg.link_names[link] if link < len(tg.link_names) else f"link {link}"
        events += _metadata(1 + num_devices + link, name, "transfers", num_devices + link)
    kind = tg.task_kind.tolist()
    device = tg.task_device.tolist()
    group = tg.task_group.tolist()
    nbytes = tg.task_bytes.tolist()
    link_ptr = tg.link_ptr.tolist()
    link_index = tg.link_index.tolist()
    ts = (result.start_s * 1e6).tolist()
    dur = ((result.finish_s - result.start_s) * 1e6).tolist()
    names = tg.task_names
    any_unlinked = False
    for x in range(tg.num_tasks):
        pids = [1 + num_devices + link for link in link_index[link_ptr[x] : link_ptr[x + 1]]]
        if kind[x] == COMPUTE:
            pids.insert(0, 1 + device[x])
        if not pids:
            pids = [unlinked_pid]
            any_unlinked = True
        kind_name = _KIND_NAMES[kind[x]]
        event = {
            "name": names[x] if x < len(names) else f"{kind_name} {x}",
            "cat": kind_name,
            "ph": "X",
            "ts": ts[x],
            "dur": dur[x],
            "tid": 0,
            "args": {"task": x, "kind": kind_name, "group": group[x], "bytes": nbytes[x]},
        }
        for pid in pids:
            events.append({**event, "pid": pid})
    if any_unlinked:
        events += _metadata(
            unlinked_pid, "communication without links", "transfers", num_devices + num_links
        )
    memory = memory_profile(tg, result.start_s, result.finish_s, timeline=True)
    assert memory.timeline_ptr is not None and memory.timeline_time_s is not None
    assert memory.timeline_bytes is not None
    times = (memory.timeline_time_s * 1e6).tolist()
    usage = (memory.timeline_bytes + np.int64(result.reserve_bytes)).tolist()
    ptr = memory.timeline_ptr.tolist()
    for d in range(num_devices):
        for i in range(ptr[d], ptr[d + 1]):
            events.append(
                {
                    "name": "memory",
                    "ph": "C",
                    "ts": times[i],
                    "pid": 1 + d,
                    "tid": 0,
                    "args": {"bytes": usage[i]},
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"step_time_s": result.step_time_s, "oom": result.oom},
    }


def dump_chrome_trace(path: str | Path, tg: TaskGraph, result: SimResult) -> None:
    """Write :func:`chrome_trace` as JSON to ``path``, gzip-compressed if it ends in ``.gz``."""
    path = Path(path)
    text = json.dumps(chrome_trace(tg, result), separators=(",", ":"))
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as stream:
            stream.write(text)
    else:
        path.write_text(text, encoding="utf-8")
