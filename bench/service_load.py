"""Service under a burst of jobs: 200 small plans submitted at once to the real stack.

Production shape on this machine, started by the worker tests' helpers: ``tagplan serve``
and two ``tagplan worker`` processes (solo pool) on PostgreSQL and Redis. After a
warm-up job per worker, 200 jobs (zoo:mlp on testbed, a short budget, each its own seed so none is
deduplicated) are submitted from 32 threads; the queue depth (jobs not yet started, as
``GET /v1/jobs?status=queued`` counts them) and the broker's backlog of tasks are sampled
every half second until all have finished. Reported: submission time, both over time and
their maxima, the queue wait of each job (``started_at - created_at``: p50, p95, max), the
drain time, and the resident memory of the API and of each worker before the bursts and
after each (memory that keeps growing from one burst to the next would show there).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np
import redis

from bench.report import write_section
from tagplan.db.keys import create_key
from tagplan.db.migrate import upgrade
from tagplan.db.session import session_scope
from tagplan.service.client import TagplanClient
from tagplan.workers.app import QUEUE
from tests.backends import environment_without_settings, fresh_postgres_database
from tests.workers.conftest import Stack, _free_port, _wait_ready

COMMAND = "python -m bench.service_load"
FINISHED = ("succeeded", "failed", "cancelled")


def rss_mib(pid: int) -> float:
    """Resident memory of a process and its children (MiB), from /proc."""
    total_kib = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            total_kib += int(line.split()[1])
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            total_kib += round(rss_mib(int(child)) * 1024)
    return total_kib / 1024


def _memory(stack: Stack) -> list[float]:
    """RSS of the API, then of each worker (MiB)."""
    return [rss_mib(p.pid) for p in stack.processes]


def _count(http: httpx.Client, status: str) -> int:
    return http.get("/v1/jobs", params={"status": status, "limit": 1}).json()["count"]


def _broker_backlog(broker: redis.Redis) -> int:
    """Tasks waiting in the broker: a job's later steps queue there behind other jobs."""
    return sum(
        broker.llen(key) for key in broker.scan_iter(f"{QUEUE}*") if broker.type(key) == b"list"
    )


def _burst(http: httpx.Client, jobs: int, budget_s: float, seed: int) -> tuple[list[str], float]:
    """Submit ``jobs`` jobs at once; their ids and the seconds the submissions took."""

    def submit(i: int) -> str:
        body = {
            "graph": {"zoo": "mlp"},
            "cluster": "testbed",
            "options": {"budget_s": budget_s, "seed": seed + i},
        }
        response = http.post("/v1/jobs", json=body)
        assert response.status_code == 202, response.text
        return response.json()["id"]

    start = time.perf_counter()
    with ThreadPoolExecutor(32) as pool:
        ids = list(pool.map(submit, range(jobs)))
    return ids, time.perf_counter() - start


def _drain(
    http: httpx.Client, broker: redis.Redis, ids: list[str], timeout_s: float
) -> tuple[list[dict], list[tuple[float, int, int]]]:
    """Sample the queue depth until no job is queued or running; the burst's jobs and the
    samples ``(seconds, jobs queued, broker backlog)``."""
    start = time.monotonic()
    samples: list[tuple[float, int, int]] = []
    while True:
        queued = _count(http, "queued")
        samples.append((time.monotonic() - start, queued, _broker_backlog(broker)))
        if queued == 0 and _count(http, "running") == 0:
            break
        assert samples[-1][0] < timeout_s, f"{queued} jobs still queued after {timeout_s} s"
        time.sleep(0.5)
    listed = http.get("/v1/jobs", params={"limit": 500}).json()["data"]
    wanted = set(ids)
    return [job for job in listed if job["id"] in wanted], samples


def _waits(jobs: list[dict]) -> np.ndarray:
    def at(text: str) -> datetime:
        return datetime.fromisoformat(text)

    return np.array([(at(j["started_at"]) - at(j["created_at"])).total_seconds() for j in jobs])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--budget", type=float, default=1.0, help="each job's budget_s")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2, help="bursts, one after another")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/11")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per burst")
    parser.add_argument("--no-write", action="store_true", help="print, leave BENCHMARKS.md")
    args = parser.parse_args()

    broker = redis.Redis.from_url(args.redis)
    broker.flushdb()
    logs = Path(tempfile.mkdtemp(prefix="tagplan-load-"))
    with ExitStack() as cleanup:
        database_url = cleanup.enter_context(fresh_postgres_database())
        upgrade(database_url)
        with session_scope(database_url) as session:
            _, token = create_key(session, scopes=["admin"], name="bench", rate_limit=10**7)
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        env = {
            **environment_without_settings(),
            "TAGPLAN_DATABASE_URL": database_url,
            "TAGPLAN_BROKER_URL": args.redis,
            "TAGPLAN_DATA_DIR": str(logs),
        }
        stack = Stack(env, logs, database_url, url, token, TagplanClient(url, token))
        cleanup.callback(stack.stop_all)
        cleanup.callback(stack.client.close)
        stack.spawn("api", "serve", "--port", str(port))
        for index in range(args.workers):
            stack.start_worker(f"worker{index + 1}")
        _wait_ready(url, logs)
        http = cleanup.enter_context(
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        )
        # Warm up every worker (each compiles the simulator when it starts) and the API.
        warm, _ = _burst(http, args.workers, args.budget, seed=10**6)
        _drain(http, broker, warm, args.timeout)
        memory = [_memory(stack)]
        rows, depth_rows = [], []
        for round_ in range(args.rounds):
            ids, submit_s = _burst(http, args.jobs, args.budget, seed=round_ * args.jobs)
            jobs, samples = _drain(http, broker, ids, args.timeout)
            memory.append(_memory(stack))
            statuses = {status: sum(j["status"] == status for j in jobs) for status in FINISHED}
            assert statuses["succeeded"] == args.jobs, statuses
            waits = _waits(jobs)
            p50, p95 = np.percentile(waits, [50, 95])
            drain_s = samples[-1][0]
            rows.append(
                f"| {round_ + 1} | {args.jobs} | {submit_s:.1f} | {max(s[1] for s in samples)} | "
                f"{max(s[2] for s in samples)} | "
                f"{p50:.1f} | {p95:.1f} | {waits.max():.1f} | {drain_s:.0f} | "
                f"{args.jobs / drain_s:.2f} | {statuses['succeeded']} |"
            )
            every = max(1, len(samples) // 12)
            depth_rows.append(
                f"| {round_ + 1} | "
                + ", ".join(f"{t:.1f} s: {d}/{b}" for t, d, b in samples[::every] + samples[-1:])
                + " |"
            )
            print(rows[-1], flush=True)
    names = ["API", *(f"worker {i + 1}" for i in range(args.workers))]
    base = memory[1] if args.rounds > 1 else memory[0]
    memory_rows = [
        f"| {name} | "
        + " | ".join(f"{m[i]:.0f}" for m in memory)
        + f" | {memory[-1][i] - base[i]:+.0f} |"
        for i, name in enumerate(names)
    ]
    after = " | ".join(f"after burst {r + 1}" for r in range(args.rounds))
    since = "the first burst" if args.rounds > 1 else "before"
    body = "\n".join(
        [
            f"{args.jobs} jobs per burst (zoo:mlp on testbed, budget_s {args.budget:g}, each "
            f"its own seed), submitted from 32 threads to one `tagplan serve` and "
            f"{args.workers} `tagplan worker --pool solo` processes on PostgreSQL and Redis "
            "on the same machine, after one warm-up job per worker. Queue wait: a job's "
            "`started_at - created_at`. Queue depth: jobs not yet started (the service's "
            "`tagplan_queue_depth`); broker backlog: tasks waiting in Redis, where a started "
            "job's later steps queue behind other jobs; both sampled every 0.5 s.",
            "",
            "| burst | jobs | submit (s) | max queue depth | max broker backlog "
            "| queue wait p50 (s) | p95 (s) | max (s) | drained in (s) | jobs/s | succeeded |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
            "| burst | queue depth / broker backlog over time |",
            "| --- | --- |",
            *depth_rows,
            "",
            f"| process | RSS before (MiB) | {after} | last - after {since} (MiB) |",
            "| --- | ---: | " + "---: | " * args.rounds + "---: |",
            *memory_rows,
        ]
    )
    if args.no_write:
        print(body)
    else:
        write_section("service-load", "Service under a burst of jobs", COMMAND, body)


if __name__ == "__main__":
    main()
