"""The GNN prior's training run as BENCHMARKS.md reports it: for each round, how long
generation and fitting took on this machine, the examples, and the held-out metrics
(``tagplan train`` records them in the run directory's ``run.json``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.report import write_section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a tagplan train directory")
    args = parser.parse_args()
    record = json.loads((args.run / "run.json").read_text())
    options = record["options"]
    lines = [
        "| round | prior of the searches | cases | training / held-out states | generate s | "
        "fit s | held-out CE (uniform's) | favourite = most visited | prior on most visited |",
        "| ---: | --- |" + " ---: |" * 7,
    ]
    for r in record["rounds"]:
        m = r["metrics"]
        lines.append(
            f"| {r['round']} | {r['prior']} | {len(r['cases'])} | {r['train_examples']} / "
            f"{r['validation_examples']} | {r['generate_s']:.0f} | {r['fit_s']:.0f} | "
            f"{m['val_cross_entropy']:.2f} ({m['val_uniform_cross_entropy']:.2f}) | "
            f"{100 * m['val_top1_agreement']:.0f}% | {m['val_prior_on_most_visited']:.2f} |"
        )
    body = "\n".join(
        [
            __doc__.replace("\n", " ").strip(),
            "",
            f"Options: {len(options['models'])} zoo models ({', '.join(options['models'])}), "
            f"{options['clusters_per_model']} clusters each, {options['iterations']} search "
            f"iterations a case, targets at vertices visited {options['min_visits']}+ times, "
            f"{options['epochs']} epochs, seed {options['seed']}, {options['workers']} "
            "generating processes.",
            "",
            *lines,
        ]
    )
    write_section(
        "gnn-training",
        "Training the GNN prior",
        f"tagplan train --out {args.run.name}; python -m bench.gnn_training --run {args.run.name}",
        body,
    )


if __name__ == "__main__":
    main()
