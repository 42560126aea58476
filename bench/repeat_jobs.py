"""Time to answer, first jobs against repeats, as a scheduler sees it.

A scheduler allocates GPUs, POSTs the job and waits until it succeeds. For every zoo model
the first job runs on a fragmented three-machine allocation (GPUs picked from slots of
their boxes); each repeat then comes on the same allocation as a scheduler hands it out
again: machines renamed, listed in another order, other GPU slots. Time to answer counts
from the POST to the answer of ``GET /v1/jobs/{id}?wait_s=10`` that says ``succeeded``
(the service answers a waiting request within 50 ms of the job's end), and each repeat is
checked to be a cache answer of that model's first job. Two stacks: the production shape
(``tagplan serve`` on PostgreSQL and Redis with two ``tagplan worker`` processes) and the
embedded default (``tagplan serve`` alone: SQLite, the worker in-process).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench.report import write_section
from bench.stack import free_port, fresh_database, spawn, stop, wait_ready
from tagplan.db.keys import create_key
from tagplan.db.migrate import upgrade
from tagplan.db.session import session_scope
from tagplan.planner.zoo import catalog

COMMAND = "python -m bench.repeat_jobs"
BOXES = [("V100-16GB", 3, 120.0), ("T4", 2, 30.0), ("P100", 1, 40.0)]


def allocation(rng: random.Random) -> dict:
    """The benchmark's allocation with machine names, machine order and GPU slots drawn
    from ``rng``: every draw is the same cluster up to renumbering."""
    machines = []
    for kind, count, gbps in BOXES:
        slots = sorted(rng.sample(range(8), count))
        machines.append(
            {
                "name": f"node-{rng.randrange(10**6):06d}",
                "gpus": [{"index": i, "type": kind} for i in slots],
                "intra_bandwidth_gbps": gbps,
            }
        )
    rng.shuffle(machines)
    return {"machines": machines, "network": {"bandwidth_gbps": 25, "latency_us": 5}}


def _answer(http: httpx.Client, body: dict, timeout_s: float) -> tuple[float, dict]:
    """Seconds from the POST to the waiting GET that sees the job succeed, and its result."""
    started = time.perf_counter()
    job = http.post("/v1/jobs", json=body).json()
    deadline = started + timeout_s
    wait = {"wait_s": 10}
    while (status := http.get(f"/v1/jobs/{job['id']}", params=wait).json()["status"]) not in (
        "succeeded",
        "failed",
        "cancelled",
    ):
        if time.perf_counter() > deadline:
            raise TimeoutError(f"job {job['id']} still {status} after {timeout_s} s")
    elapsed = time.perf_counter() - started
    if status != "succeeded":
        detail = http.get(f"/v1/jobs/{job['id']}").json()
        raise RuntimeError(f"job {job['id']} {status}: {detail}")
    return elapsed, {"id": job["id"], **http.get(f"/v1/jobs/{job['id']}/result").json()}


def run_stack(
    name: str, env: dict[str, str], workers: int, models: list[str], repeats: int, budget_s: float
) -> list[tuple[str, float, list[float]]]:
    """Per model: the first job's time to answer and every repeat's."""
    logs = Path(tempfile.mkdtemp(prefix=f"tagplan-bench-{name}-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    processes = [spawn(["serve", "--port", str(port)], env, logs / "api.log")]
    processes += [
        spawn(["worker", "--pool", "solo", "--hostname", f"w{k}@bench"], env, logs / f"w{k}.log")
        for k in range(workers)
    ]
    with session_scope(env["TAGPLAN_DATABASE_URL"]) as session:
        _, token = create_key(session, scopes=["admin"], name="bench", rate_limit=10**7)
    rows = []
    try:
        wait_ready(f"{url}/readyz", logs, timeout_s=120)
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        rng = random.Random(0)
        for model in models:
            options = {"budget_s": budget_s}
            body = {"graph": {"zoo": model}, "options": options}
            first_s, first = _answer(http, {**body, "cluster": allocation(rng)}, 20 * budget_s)
            times = []
            for _ in range(repeats):
                seconds, answer = _answer(http, {**body, "cluster": allocation(rng)}, 60)
                if answer["source"] != "cache" or answer["cached_from"] != first["id"]:
                    raise RuntimeError(f"{model}: a repeat was not answered from the cache")
                times.append(seconds)
            rows.append((model, first_s, times))
            print(
                f"{name} {model}: first {first_s:.2f} s, repeats p50 "
                f"{statistics.median(times):.2f} s, max {max(times):.2f} s",
                flush=True,
            )
    finally:
        for process in processes:
            stop(process)
    return rows


def _table(name: str, rows: list[tuple[str, float, list[float]]]) -> list[str]:
    every = np.array([t for _, _, times in rows for t in times])
    lines = [
        f"**{name}**: repeats p50 {np.percentile(every, 50):.2f} s, "
        f"p99 {np.percentile(every, 99):.2f} s over {len(every)} repeats "
        f"(bar: p50 < 1 s, p99 < 2 s); first jobs p50 "
        f"{statistics.median(f for _, f, _ in rows):.1f} s.",
        "",
        "| model | first job (s) | repeat p50 (s) | repeat max (s) |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {model} | {first:.2f} | {statistics.median(times):.2f} | {max(times):.2f} |"
        for model, first, times in rows
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/test")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--models", nargs="*", default=[m.name for m in catalog.list_models()])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=10.0, help="every job's budget")
    parser.add_argument("--stacks", nargs="*", default=["production", "embedded"])
    parser.add_argument("--no-write", action="store_true", help="print, leave BENCHMARKS.md")
    args = parser.parse_args()

    import redis

    sections = []
    for stack in args.stacks:
        base = {k: v for k, v in os.environ.items() if not k.startswith("TAGPLAN_")}
        if stack == "production":
            redis.Redis.from_url(args.redis).flushdb()
            database_url = fresh_database(args.postgres)
            env = {**base, "TAGPLAN_DATABASE_URL": database_url, "TAGPLAN_BROKER_URL": args.redis}
            workers = 2
        else:
            data = tempfile.mkdtemp(prefix="tagplan-bench-embedded-")
            database_url = f"sqlite:///{data}/tagplan.db"
            env = {**base, "TAGPLAN_DATABASE_URL": database_url, "TAGPLAN_DATA_DIR": data}
            workers = 0
        upgrade(database_url)
        rows = run_stack(stack, env, workers, args.models, args.repeats, args.budget_s)
        title = "PostgreSQL, Redis, two workers" if stack == "production" else "embedded (SQLite)"
        sections += [*_table(title, rows), ""]
    body = [
        __doc__.split("\n\n", 1)[1].replace("\n", " ").strip()
        + f" Every job's budget: {args.budget_s:g} s; {args.repeats} repeats per model.",
        "",
        *sections,
    ]
    text = "\n".join(body)
    print(text)
    if not args.no_write:
        write_section(
            "repeat_jobs", "Repeat jobs: time to answer from the strategy cache", COMMAND, text
        )


if __name__ == "__main__":
    main()
