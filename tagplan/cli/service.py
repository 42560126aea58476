"""Service commands: ``serve`` (API + embedded worker), ``worker``, ``submit``, ``demo``."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from tagplan.cli.common import EXIT_BAD_INPUT, console, error_console, print_json
from tagplan.service.client import ServiceUnreachable, TagplanClient, TagplanError
from tagplan.settings import get_settings

LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")

ServerOption = Annotated[
    str, typer.Option("--server", envvar="TAGPLAN_SERVER", help="tagplan service URL.")
]
ApiKeyOption = Annotated[
    str | None, typer.Option("--api-key", envvar="TAGPLAN_API_KEY", help="API key (tpk_...).")
]


def _embedded_env(data_dir: Path | None, anonymous: bool) -> None:
    """Point this process's settings at an embedded service (no broker, SQLite)."""
    if data_dir is not None:
        os.environ["TAGPLAN_DATA_DIR"] = str(data_dir)
    if anonymous:
        os.environ["TAGPLAN_ALLOW_ANONYMOUS_LOOPBACK"] = "true"
    get_settings.cache_clear()


def _http_options() -> dict[str, Any]:
    """uvicorn's h11 parser with the head limit: httptools, uvicorn's other parser, buffers
    headers of any size."""
    return {"http": "h11", "h11_max_incomplete_event_size": get_settings().max_header_bytes}


def serve_command(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    data_dir: Annotated[
        Path | None, typer.Option(help="Embedded database directory (TAGPLAN_DATA_DIR).")
    ] = None,
    allow_anonymous_loopback: Annotated[
        bool,
        typer.Option(help="Accept requests without a key from this machine (demos only)."),
    ] = False,
    access_log: Annotated[
        bool, typer.Option(help="Log every request (costs CPU on the hot path).")
    ] = False,
) -> None:
    """Run the REST API. Without TAGPLAN_BROKER_URL it is self-contained: SQLite under the
    data directory and the Celery tasks in-process; with it, workers run apart."""
    import uvicorn

    from tagplan.service.app import create_app

    if allow_anonymous_loopback and host not in LOOPBACK_HOSTS:
        error_console.print("error: --allow-anonymous-loopback needs a loopback --host")
        raise typer.Exit(EXIT_BAD_INPUT)
    _embedded_env(data_dir, allow_anonymous_loopback)
    uvicorn.run(
        create_app(),
        host=host,
        port=port,
        log_level="info",
        access_log=access_log,
        **_http_options(),
    )


def worker_command(
    concurrency: Annotated[int | None, typer.Option(help="Worker processes.")] = None,
    pool: Annotated[str, typer.Option(help="Celery pool: prefork or solo.")] = "prefork",
    hostname: Annotated[str | None, typer.Option(help="Celery node name.")] = None,
) -> None:
    """Run a Celery worker against TAGPLAN_BROKER_URL (Redis) and TAGPLAN_DATABASE_URL."""
    from tagplan.workers.app import QUEUE, app

    settings = get_settings()
    if settings.embedded:
        error_console.print("error: set TAGPLAN_BROKER_URL (e.g. redis://localhost:6379/0)")
        raise typer.Exit(EXIT_BAD_INPUT)
    argv = ["worker", "--loglevel", "INFO", "-Q", QUEUE, "--pool", pool]
    argv += ["--concurrency", str(concurrency or settings.worker_concurrency)]
    if hostname:
        argv += ["--hostname", hostname]
    app.worker_main(argv)


def format_summary(job: dict[str, Any], result: dict[str, Any] | None) -> str:
    """A few lines a person reads: status, predicted step, speedup, baselines, memory."""
    lines = [f"job {job['id']}: {job['status']}"]
    if job.get("error"):
        lines.append(f"  error: {job['error']}")
    if result is None:
        return "\n".join(lines)
    ms = 1e3
    speedup, best = result.get("speedup_vs_best_data_parallel"), result.get("best_data_parallel")
    lines += [
        f"  predicted step time  {result['step_time_s'] * ms:.3f} ms"
        + (f"  ({speedup:.2f}x the best data-parallel baseline, {best})" if speedup else ""),
        f"  lower bound          {result['lower_bound_s'] * ms:.3f} ms"
        + (
            f" ({result['comm_bound_s'] * ms:.3f} ms counting communication)"
            if result.get("comm_bound_s")
            else ""
        ),
        f"  chosen from          {result.get('chosen_from', 'search')}"
        + (f" (the plan of job {result['cached_from']})" if result.get("cached_from") else "")
        + ("  [incomplete: answered at the deadline]" if not result.get("complete", True) else ""),
        "  baselines            "
        + ", ".join(
            f"{name} {'OOM' if t is None else f'{t * ms:.3f} ms'}"
            for name, t in result["baselines"].items()
        ),
        f"  search prior         {result.get('prior', 'uniform')}"
        + (f" ({result['prior_note']})" if result.get("prior_note") else ""),
        f"  peak memory per GPU  max {max(result['peak_memory_bytes'].values()) / 2**30:.2f} GiB"
        f" over {len(result['peak_memory_bytes'])} GPUs",
        f"  estimated            {result['estimated']}",
    ]
    return "\n".join(lines)


def _wait_and_print(client: TagplanClient, job: dict[str, Any], as_json: bool) -> None:
    last = None
    while job["status"] not in ("succeeded", "failed", "cancelled"):
        line = f"{job['status']} {job['phase'] or ''} {job['progress']['iterations']} iterations"
        if line != last and not as_json:
            error_console.print(line, highlight=False)
            last = line
        job = client.job(job["id"], wait_s=1.0)  # answers at once when the job finishes
    result = client.result(job["id"]) if job["status"] == "succeeded" else None
    if as_json:
        print_json({"job": job, "result": result})
    else:
        console.print(format_summary(job, result), highlight=False, soft_wrap=True)
    if job["status"] != "succeeded":
        raise typer.Exit(1)


EXIT_SERVICE_ERROR = 1
"""The service failed (5xx)."""
EXIT_UNREACHABLE = 3
"""No answer from the service: not running, wrong address, timed out."""


def _exit_code(exc: TagplanError) -> int:
    if isinstance(exc, ServiceUnreachable):
        return EXIT_UNREACHABLE
    return EXIT_BAD_INPUT if exc.status < 500 else EXIT_SERVICE_ERROR


def submit_command(
    graph: Annotated[str, typer.Argument(help="Graph file (GraphDef or JSON) or zoo:NAME.")],
    cluster: Annotated[
        str, typer.Option("--cluster", "-c", help="Named cluster or .yaml/.json spec file.")
    ],
    server: ServerOption = "http://127.0.0.1:8000",
    api_key: ApiKeyOption = None,
    batch_size: Annotated[int | None, typer.Option("--batch-size", "-b")] = None,
    budget_s: Annotated[float, typer.Option("--budget-s", help="Search budget.")] = 60.0,
    seed: Annotated[int, typer.Option(help="Search seed.")] = 0,
    shards: Annotated[int, typer.Option(help="Root-parallel search trees.")] = 1,
    sfb: Annotated[bool, typer.Option("--sfb/--no-sfb")] = True,
    pipeline: Annotated[bool, typer.Option("--pipeline/--no-pipeline")] = True,
    every_baseline: Annotated[
        bool, typer.Option("--every-baseline", help="Simulate the baselines a bound rules out too.")
    ] = False,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Search even when a cached plan answers the job.")
    ] = False,
    deadline_s: Annotated[
        float | None,
        typer.Option("--deadline-s", help="Anytime: answer with the best plan by then."),
    ] = None,
    refine_s: Annotated[
        float | None,
        typer.Option("--refine-s", help="With --deadline-s: search on this long afterwards."),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait and print the result.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", help="Show the traceback of a failure.")
    ] = False,
) -> None:
    """Submit a planning job to a tagplan service. Exit codes: 0 done, 2 refused (bad
    input, key, scope), 3 no answer from the service, 1 the service failed."""
    options = {
        "budget_s": budget_s,
        "seed": seed,
        "shards": shards,
        "sfb": sfb,
        "pipeline": pipeline,
        "every_baseline": every_baseline,
        "fresh": fresh,
        "deadline_s": deadline_s,
        "refine_s": refine_s,
    }
    with TagplanClient(server, api_key) as client:
        try:
            job = client.submit(graph, cluster=cluster, batch_size=batch_size, options=options)
            if wait:
                _wait_and_print(client, job, as_json)
            elif as_json:
                print_json(job)
            else:
                link = server.rstrip("/") + job["links"]["self"]
                console.print(f"job {job['id']}: {job['status']}  {link}", highlight=False)
        except (TagplanError, OSError) as exc:
            if verbose:
                raise
            code = _exit_code(exc) if isinstance(exc, TagplanError) else EXIT_BAD_INPUT
            error_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(code) from None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _serve_until_interrupted(server: Any, thread: threading.Thread) -> None:
    """Wait while ``server`` runs in ``thread``; Ctrl-C (or SIGTERM) asks it to stop and
    its shutdown (the in-process worker included) runs to the end, instead of an exception
    raised wherever the main thread happens to be."""

    def stop(*_: object) -> None:
        console.print("stopping", highlight=False)
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    console.print("serving until Ctrl-C", highlight=False)
    try:
        while thread.is_alive():
            thread.join(0.5)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def demo_command(
    model: Annotated[str, typer.Option(help="Model-zoo graph.")] = "vgg19",
    cluster: Annotated[str, typer.Option("--cluster", "-c")] = "testbed",
    budget_s: Annotated[float, typer.Option("--budget-s")] = 10.0,
    keep: Annotated[
        bool, typer.Option("--keep", help="Keep the service up (and its page) until Ctrl-C.")
    ] = False,
) -> None:
    """Start the embedded service on loopback, submit a zoo model, print the result and the
    dashboard's address, stop (with --keep: serve until Ctrl-C)."""
    import uvicorn

    from tagplan.service.app import create_app

    for name in ("TAGPLAN_BROKER_URL", "TAGPLAN_DATABASE_URL"):
        os.environ.pop(name, None)
    with tempfile.TemporaryDirectory(prefix="tagplan-demo-") as data_dir:
        _embedded_env(Path(data_dir), anonymous=True)
        port = _free_port()
        config = uvicorn.Config(
            create_app(), host="127.0.0.1", port=port, log_level="warning", **_http_options()
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started and thread.is_alive():
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        console.print(f"tagplan service on {url} (embedded); planning zoo:{model} on {cluster}")
        try:
            with TagplanClient(url) as client:
                job = client.submit(f"zoo:{model}", cluster=cluster, options={"budget_s": budget_s})
                _wait_and_print(client, job, as_json=False)
            console.print(f"dashboard: {url}/ui/#/jobs/{job['id']}", highlight=False)
            if keep:
                _serve_until_interrupted(server, thread)
        except KeyboardInterrupt:
            console.print("stopping", highlight=False)
        finally:
            server.should_exit = True
            thread.join(30)
