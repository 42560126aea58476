"""The dashboard's job page on a large plan: load time and browser memory.

The embedded service (``tagplan serve``) plans BERT-Large on the cloud cluster; Debian's
chromium (Playwright, headless) opens the job page with a key and waits until every card
is drawn, the timeline included. Reported: the median over runs of the time from
navigation to the drawn timeline, the page's JavaScript heap, and the memory of the
page's renderer and of every chromium process together (proportional set size: shared
pages split between the processes that map them). The server side of the timeline is
timed apart on the heaviest trace of the same model and cluster, DP-NCCL's (one task per
op on each of the cluster's GPUs): building its lanes (done once, when a plan is stored),
loading them, and answering a window.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from bench.report import write_section
from bench.stack import free_port, spawn, stop, wait_ready
from tagplan.db.keys import create_key
from tagplan.db.migrate import upgrade
from tagplan.db.session import session_scope
from tests.backends import CHROMIUM_ARGS

COMMAND = "python -m bench.dashboard_weight"


def _chromium_pss_bytes() -> tuple[int, int]:
    """Proportional memory (shared pages split between their users) of every chromium
    process together, and of its renderers (where pages run)."""
    total = renderers = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            if b"chromium" not in command:
                continue
            for line in (entry / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
                    total += pss
                    renderers += pss if b"--type=renderer" in command else 0
        except OSError:
            continue
    return total, renderers


def _server_side(model: str, cluster_name: str) -> dict[str, float]:
    """Seconds to build, load and window the lanes of DP-NCCL's trace, its size."""
    from tagplan.planner.evaluate import Evaluator
    from tagplan.planner.graph.analyzer import analyze
    from tagplan.planner.graph.source import load_graph_source
    from tagplan.planner.search.baselines import baseline_strategy
    from tagplan.planner.sim.trace import chrome_trace
    from tagplan.planner.topology import load_cluster
    from tagplan.planner.trace_lanes import dumps_lanes, lanes_from_trace
    from tagplan.service.timeline import Timeline

    source = load_graph_source(f"zoo:{model}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    cluster = load_cluster(cluster_name)
    evaluator = Evaluator(ir, cluster)
    evaluation = evaluator.evaluate(
        baseline_strategy("dp-nccl", ir, cluster, evaluator.costs), by_class=False
    )
    trace = chrome_trace(evaluation.compiled.task_graph, evaluation.result)
    trace_bytes = len(json.dumps(trace, separators=(",", ":")))
    started = time.perf_counter()
    stored = dumps_lanes(lanes_from_trace(trace))
    built = time.perf_counter()
    timeline = Timeline.from_lanes(stored)
    loaded = time.perf_counter()
    window = timeline.window(bins=1200)
    answered = time.perf_counter()
    return {
        "events": len(trace["traceEvents"]),
        "trace_mb": trace_bytes / 1e6,
        "lanes_mb": len(stored) / 1e6,
        "build_s": built - started,
        "load_s": loaded - built,
        "window_s": answered - loaded,
        "window_mb": len(json.dumps(window)) / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="bert_large")
    parser.add_argument("--cluster", default="cloud")
    parser.add_argument("--budget-s", type=float, default=60.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    data = Path(tempfile.mkdtemp(prefix="tagplan-bench-dashboard-"))
    database_url = f"sqlite:///{data}/tagplan.db"
    upgrade(database_url)
    with session_scope(database_url) as session:
        _, token = create_key(session, scopes=["admin"], name="bench")
    base = {k: v for k, v in os.environ.items() if not k.startswith("TAGPLAN_")}
    env = {**base, "TAGPLAN_DATABASE_URL": database_url, "TAGPLAN_DATA_DIR": str(data)}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    api = spawn(["serve", "--port", str(port)], env, data / "api.log")
    try:
        wait_ready(f"{url}/readyz", data, timeout_s=120)
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        body = {
            "graph": {"zoo": args.model},
            "cluster": args.cluster,
            "options": {"budget_s": args.budget_s},
        }
        job = http.post("/v1/jobs", json=body).json()
        while (status := http.get(f"/v1/jobs/{job['id']}").json()["status"]) not in (
            "succeeded",
            "failed",
        ):
            time.sleep(1)
        if status != "succeeded":
            raise RuntimeError(http.get(f"/v1/jobs/{job['id']}").json()["error"])
        trace_events = len(http.get(f"/v1/jobs/{job['id']}/trace").json()["traceEvents"])
        loads, heaps, pss, renderer_pss = [], [], [], []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
            )
            for _ in range(args.runs):
                context = browser.new_context(viewport={"width": 1400, "height": 1000})
                page = context.new_page()
                page.goto(f"{url}/ui/")
                page.evaluate(f"sessionStorage.setItem('tagplan.key', '{token}')")
                started = time.perf_counter()
                page.goto(f"{url}/ui/#/jobs/{job['id']}")
                page.wait_for_selector("#timeline-canvas[data-lanes]", timeout=60_000)
                page.wait_for_selector("#strategy tbody tr")
                loads.append(time.perf_counter() - started)
                cdp = context.new_cdp_session(page)
                cdp.send("Performance.enable")
                metrics = {
                    m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]
                }
                heaps.append(metrics["JSHeapUsedSize"])
                every, renderers = _chromium_pss_bytes()
                pss.append(every)
                renderer_pss.append(renderers)
                context.close()
            browser.close()
    finally:
        stop(api)
    server = _server_side(args.model, args.cluster)
    text = "\n".join(
        [
            __doc__.split("\n\n", 1)[1].replace("\n", " ").strip(),
            "",
            f"Plan: {args.model} on {args.cluster} with a {args.budget_s:g} s budget "
            f"({trace_events:,} trace events). Over {args.runs} page loads: load to a drawn "
            f"timeline p50 {statistics.median(loads):.2f} s (max {max(loads):.2f} s; bar 2 s); "
            f"JavaScript heap p50 {statistics.median(heaps) / 2**20:.1f} MiB; the page's "
            f"renderer p50 {statistics.median(renderer_pss) / 2**20:.0f} MiB (max "
            f"{max(renderer_pss) / 2**20:.0f} MiB; bar 300 MB); every chromium process "
            f"together (browser, GPU and network services included) p50 "
            f"{statistics.median(pss) / 2**20:.0f} MiB, proportional set size.",
            "",
            f"Server side on DP-NCCL's trace ({server['events']:,} events, "
            f"{server['trace_mb']:.1f} MB of JSON): lanes built in {server['build_s']:.2f} s "
            f"when the plan is stored ({server['lanes_mb']:.1f} MB), loaded in "
            f"{server['load_s']:.3f} s, a 1,200-column window answered in "
            f"{server['window_s']:.3f} s ({server['window_mb']:.2f} MB of JSON).",
        ]
    )
    print(text)
    if not args.no_write:
        write_section("dashboard_weight", "Dashboard: a large plan's job page", COMMAND, text)


if __name__ == "__main__":
    main()
