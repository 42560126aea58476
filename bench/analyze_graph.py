"""Import + analyze time of zoo graphs (bar: BERT-Large <= 10 s, docs/design.md §10).

Each run is a fresh Python process doing what ``tagplan analyze`` does — import the
package, read and parse the gzip GraphDef, analyze — so interpreter and import costs
are included. Reported: the median wall time over the runs, and the in-process split
between parsing and analysis from the last run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from bench.report import median, write_section

_CHILD = """
import json, time
t0 = time.perf_counter()
from tagplan.planner.graph.analyzer import analyze
from tagplan.planner.graph.source import load_graph_source
t1 = time.perf_counter()
source = load_graph_source({spec!r})
t2 = time.perf_counter()
ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
t3 = time.perf_counter()
print(json.dumps({{"import_s": t1 - t0, "parse_s": t2 - t1, "analyze_s": t3 - t2,
                   "ops": ir.num_ops, "nodes": len(source.graph_def.node)}}))
"""


def run_once(model: str) -> tuple[float, dict]:
    start = time.perf_counter()
    output = subprocess.run(
        [sys.executable, "-c", _CHILD.format(spec=f"zoo:{model}")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return time.perf_counter() - start, json.loads(output.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="*", default=["bert_large", "vgg19", "resnet101"])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for model in args.models:
        walls, detail = [], {}
        for _ in range(args.runs):
            wall, detail = run_once(model)
            walls.append(wall)
        rows.append((model, detail, median(walls)))
        print(f"{model}: median {median(walls):.2f} s over {args.runs} runs {detail}")
    body = [
        "| model | graph nodes | IR ops | median wall (s) | import (s) | parse (s) | analyze (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for model, detail, wall in rows:
        body.append(
            f"| {model} | {detail['nodes']:,} | {detail['ops']:,} | {wall:.2f} | "
            f"{detail['import_s']:.2f} | {detail['parse_s']:.2f} | {detail['analyze_s']:.2f} |"
        )
    body.append("")
    body.append("Bar: import + analyze of BERT-Large <= 10 s (whole process, wall clock).")
    command = "python -m bench.analyze_graph " + " ".join(args.models) + f" --runs {args.runs}"
    write_section("analyze", "Import + analyze", command, "\n".join(body))


if __name__ == "__main__":
    main()
