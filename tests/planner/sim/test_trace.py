"""The Chrome trace of a simulated step (Trace Event Format, opened by Perfetto)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tagplan.planner.sim.simulate import simulate
from tagplan.planner.sim.taskgraph import TaskGraph
from tagplan.planner.sim.trace import chrome_trace, dump_chrome_trace
from tests.planner.sim.builders import Buffer, build, collective, compute, transfer


def _graph() -> TaskGraph:
    tasks = [
        compute(0, 2.0, group=0, name="fwd"),
        transfer([0], 1.0, nbytes=512, group=0, name="send"),
        compute(1, 1.0, group=1, name="bwd"),
    ]
    buffers = [Buffer(0, 512, 0, (1,)), Buffer(1, 512, 1, (2,))]
    return build(
        tasks,
        [(0, 1), (1, 2)],
        num_devices=2,
        num_links=1,
        buffers=buffers,
        persistent_bytes=[100, 200],
    )


def test_one_complete_event_per_task_with_required_fields() -> None:
    tg = _graph()
    result = simulate(tg, reserve_bytes=1)
    trace = chrome_trace(tg, result)
    json.dumps(trace)
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["name"] for e in complete] == ["fwd", "send", "bwd"]
    for event in complete:
        assert {"name", "ph", "ts", "dur", "pid", "tid", "args"} <= event.keys()
        assert {"bytes", "group", "kind", "task"} <= event["args"].keys()
    send = complete[1]
    assert (send["ts"], send["dur"]) == (2e6, 1e6)
    assert send["pid"] == 1 + tg.num_devices  # link 0
    assert send["args"] == {"task": 1, "kind": "transfer", "group": 0, "bytes": 512}
    assert [e["pid"] for e in complete] == [1, 3, 2]


def test_processes_are_named() -> None:
    tg = _graph()
    trace = chrome_trace(tg, simulate(tg))
    names = {
        e["pid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name"
    }
    assert names == {1: "device 0", 2: "device 1", 3: "link 0"}


def test_memory_counters_per_device() -> None:
    tg = _graph()
    trace = chrome_trace(tg, simulate(tg, reserve_bytes=1))
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    device0 = [(e["ts"], e["args"]["bytes"]) for e in counters if e["pid"] == 1]
    # Persistent + reserve, then the 512-byte buffer from 0 until the transfer ends at 3.
    assert device0 == [(0.0, 101), (0.0, 613), (3e6, 101)]
    assert max(e["args"]["bytes"] for e in counters if e["pid"] == 2) == 200 + 1 + 512


def test_collective_appears_on_each_link_and_linkless_transfer_gets_a_track() -> None:
    tg = build([collective([0, 1], 1.0), transfer([], 1.0)], num_devices=0, num_links=2)
    trace = chrome_trace(tg, simulate(tg))
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["pid"]) for e in complete] == [
        ("collective 0", 1),
        ("collective 0", 2),
        ("transfer 1", 3),
    ]


@pytest.mark.parametrize("name", ["step.json", "step.json.gz"])
def test_write_round_trips(tmp_path: Path, name: str) -> None:
    tg = _graph()
    result = simulate(tg)
    path = tmp_path / name
    dump_chrome_trace(path, tg, result)
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as stream:
        assert json.load(stream) == json.loads(json.dumps(chrome_trace(tg, result)))
