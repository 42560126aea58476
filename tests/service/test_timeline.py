"""The dashboard's timeline: a plan's trace read into lanes, windowed, and aggregated into
busy runs that keep the busy time of the tasks they stand for."""

from __future__ import annotations

import numpy as np
import pytest

from tagplan.planner.evaluate import Evaluator
from tagplan.planner.search.baselines import baseline_strategy
from tagplan.planner.sim.trace import chrome_trace
from tagplan.planner.topology import load_cluster
from tagplan.planner.trace_lanes import dumps_lanes, lanes_from_trace, loads_lanes
from tagplan.service.timeline import Timeline
from tests.planner.zoo_graphs import zoo_ir


@pytest.fixture(scope="module")
def traced():
    ir, cluster = zoo_ir("vgg19"), load_cluster("testbed")
    evaluator = Evaluator(ir, cluster)
    evaluation = evaluator.evaluate(baseline_strategy("dp-nccl", ir, cluster, evaluator.costs))
    trace = chrome_trace(evaluation.compiled.task_graph, evaluation.result)
    return trace, cluster, evaluation.result


def _busy(trace: dict, lane: str, lo: float, hi: float) -> float:
    """Seconds of tasks on ``lane`` inside ``[lo, hi]``, from the raw trace."""
    pid = next(
        e["pid"] for e in trace["traceEvents"] if e["ph"] == "M" and e["args"].get("name") == lane
    )
    total = 0.0
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["pid"] == pid:
            start, end = e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6
            total += max(0.0, min(end, hi) - max(start, lo))
    return total


def test_every_gpu_and_link_is_a_lane(traced) -> None:
    trace, cluster, result = traced
    window = Timeline(lanes_from_trace(trace)).window()
    devices = [lane["name"] for lane in window["lanes"] if lane["kind"] == "device"]
    assert devices == list(cluster.device_names)
    assert window["span_s"] == pytest.approx(result.step_time_s, rel=1e-6)


def test_aggregated_runs_keep_the_busy_time(traced) -> None:
    trace, cluster, _ = traced
    window = Timeline(lanes_from_trace(trace)).window(bins=50)
    lane = next(lane for lane in window["lanes"] if lane["name"] == cluster.device_names[0])
    assert lane["tasks"] > 50 and all(isinstance(bar[3], float) for bar in lane["bars"])
    kept = sum((end - start) * share for start, end, _, share in lane["bars"])
    assert kept == pytest.approx(_busy(trace, lane["name"], 0.0, window["end_s"]), rel=1e-6)


def test_a_narrow_window_gives_the_tasks_themselves(traced) -> None:
    trace, cluster, result = traced
    timeline = Timeline(lanes_from_trace(trace))
    lo, hi = result.step_time_s * 0.40, result.step_time_s * 0.41
    window = timeline.window(lo, hi, bins=4000)
    lane = next(lane for lane in window["lanes"] if lane["name"] == cluster.device_names[0])
    assert all(isinstance(bar[3], str) for bar in lane["bars"])
    assert all(end > lo and start < hi for start, end, _, _ in lane["bars"])
    clipped = sum(min(end, hi) - max(start, lo) for start, end, _, _ in lane["bars"])
    assert clipped == pytest.approx(_busy(trace, lane["name"], lo, hi), rel=1e-6)
    assert np.isclose(window["start_s"], lo) and np.isclose(window["end_s"], hi)


def test_stored_lanes_load_as_they_were(traced) -> None:
    trace, _, _ = traced
    lanes = lanes_from_trace(trace)
    loaded = loads_lanes(dumps_lanes(lanes))
    assert loaded.names == lanes.names and loaded.kinds == lanes.kinds
    assert loaded.labels == lanes.labels and loaded.step_time_s == lanes.step_time_s
    for field in ("ptr", "start_s", "end_s", "task_kind", "label"):
        assert np.array_equal(getattr(loaded, field), getattr(lanes, field))
    assert Timeline(loaded).window(bins=300) == Timeline(lanes).window(bins=300)
