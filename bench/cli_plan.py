"""A short plan as a user runs it: ``tagplan plan`` in a new process with the default prior.

``tagplan plan zoo:MODEL -c CLUSTER --budget-s B --json`` counts in its budget what the
command does before the search: reading and analyzing the graph and loading the GNN prior
(its imports included), so on a 10 s budget those seconds are the search's. For each case
the command runs ``--runs`` times (a new process each time): the wall-clock seconds of the
command, its plan time, its search phase's seconds, the search's iterations and the
step, medians over the runs; and, apart, the seconds a new process takes to load the
shipped prior (``tagplan.gnn.default_prior()``, imports included).

``--json`` writes the rows for a later run of other code to print beside its own
(``--before``: its prior load, search seconds, iterations and step).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from bench.report import (
    add_comparison_arguments,
    before_note,
    kept_for_later,
    median,
    rows_before,
    write_table,
)

CASES = [("resnet101", "cloud"), ("bert_large", "cloud"), ("inception_v3", "testbed")]

_LOAD_PRIOR = """
import time
started = time.perf_counter()
from tagplan.gnn import default_prior
default_prior()
print(time.perf_counter() - started)
"""


def prior_load_s() -> float:
    """Seconds a new process takes to load the shipped prior."""
    done = subprocess.run(
        [sys.executable, "-c", _LOAD_PRIOR], capture_output=True, text=True, check=True
    )
    return float(done.stdout.strip().splitlines()[-1])


def one_plan(model: str, cluster: str, budget_s: float) -> dict:
    """The figures of one ``tagplan plan`` command."""
    command = [sys.executable, "-c", "from tagplan.cli import main; main()", "plan"]
    command += [f"zoo:{model}", "-c", cluster]
    command += ["--budget-s", str(budget_s), "--json"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{model} on {cluster}: {done.stderr.strip().splitlines()[-1]}")
    result = json.loads(done.stdout)
    return {
        "wall_s": wall_s,
        "plan_s": result["plan_time_s"],
        "search_s": result["phases"]["search"]["seconds"],
        "iterations": result["iterations"],
        "step_ms": result["step_time_s"] * 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget-s", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    add_comparison_arguments(parser)
    args = parser.parse_args()
    load_s = median([prior_load_s() for _ in range(args.runs)])
    rows = []
    for model, cluster in CASES:
        runs = [one_plan(model, cluster, args.budget_s) for _ in range(args.runs)]
        row = {key: median([run[key] for run in runs]) for key in runs[0]}
        row |= {"case": f"{model} {cluster}", "model": model, "cluster": cluster}
        row |= {"prior_load_s": load_s}
        print(row, flush=True)
        rows.append(row)
    if kept_for_later(args, rows):
        return
    before, label = rows_before(args), args.before_label
    extra = f" {label}: search (s) | {label}: iterations | {label}: step (ms) |" if before else ""
    lines = [
        "| model | cluster | command (s) | plan time (s) | search (s) | iterations | step (ms) "
        f"|{extra}",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |" + " ---: | ---: | ---: |" * bool(before),
    ]
    for r in rows:
        old = before.get(r["case"])
        cells = (
            f" {old['search_s']:.1f} | {old['iterations']:.0f} | {old['step_ms']:,.1f} |"
            if old
            else ""
        )
        lines.append(
            f"| {r['model']} | {r['cluster']} | {r['wall_s']:.1f} | {r['plan_s']:.1f} "
            f"| {r['search_s']:.1f} | {r['iterations']:.0f} | {r['step_ms']:,.1f} |" + cells
        )
    old_load = next(iter(before.values()))["prior_load_s"] if before else None
    load_note = f" ({label}: {old_load:.2f} s)" if old_load is not None else ""
    intro = (
        f"`tagplan plan zoo:MODEL -c CLUSTER --budget-s {args.budget_s:g} --json` in a new "
        f"process with the default prior, median of {args.runs} runs: the command's "
        "wall-clock seconds (the interpreter's start and the CLI's imports included), the "
        "plan's own time (from the request: the graph's reading and analysis and the "
        "prior's load count), the search phase's seconds, its iterations and the step. "
        f"Loading the shipped prior in a new process: {load_s:.2f} s{load_note}, median "
        f"of {args.runs}." + before_note(args, before)
    )
    write_table("cli-plan", "A short plan from the command line", "bench.cli_plan", intro, lines)


if __name__ == "__main__":
    main()
