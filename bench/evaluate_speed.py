"""Wall time of one ``Evaluator.evaluate`` (resolve + compile + simulate) per zoo model.

For each model on the ``testbed`` cluster and each strategy (DP-NCCL and Horovod by
default), one evaluation warms up the caches and the JIT, then ``--runs`` evaluations are
timed; the median is reported with the number of tasks in the compiled graph. The search
(MCTS) calls ``evaluate`` hundreds of times per plan, so this is its unit of cost.

``--before PATH`` also measures another checkout of the project (e.g. the commit before
a change, extracted with ``git archive``) in a subprocess that imports ``tagplan`` from
``PATH``; both columns then come from the same run on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

MODELS = [
    "mlp",
    "small_cnn",
    "vgg19",
    "resnet101",
    "inception_v3",
    "transformer",
    "bert_small",
    "bert_large",
]
STRATEGIES = ["dp-nccl", "horovod"]


def measure(model: str, strategies: list[str], runs: int) -> dict[str, dict[str, float]]:
    """Per strategy: median seconds of one evaluation, tasks and ops."""
    from tagplan.planner.evaluate import Evaluator
    from tagplan.planner.graph.analyzer import analyze
    from tagplan.planner.graph.source import load_graph_source
    from tagplan.planner.search.baselines import baseline_strategy
    from tagplan.planner.topology import load_cluster

    source = load_graph_source(f"zoo:{model}")
    ir = analyze(source.graph_def, batch_inputs=source.batch_inputs, loss=source.loss)
    evaluator = Evaluator(ir, load_cluster("testbed"))
    found = {}
    for name in strategies:
        strategy = baseline_strategy(name, ir, evaluator.cluster, evaluator.costs)
        evaluation = evaluator.evaluate(strategy)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            evaluator.evaluate(strategy)
            times.append(time.perf_counter() - start)
        found[name] = {
            "seconds": statistics.median(times),
            "tasks": evaluation.compiled.task_graph.num_tasks,
            "ops": ir.num_ops,
            "step_time_s": evaluation.step_time_s,
        }
    return found


def measure_elsewhere(
    tree: str, model: str, strategies: list[str], runs: int
) -> dict[str, dict[str, float]]:
    """:func:`measure` in a subprocess that imports ``tagplan`` from ``tree``."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    command = [sys.executable, os.path.abspath(__file__), "--worker", model, "--runs", str(runs)]
    done = subprocess.run(
        [*command, "--strategies", *strategies],
        env=env,
        cwd=os.path.abspath(tree),
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=MODELS)
    parser.add_argument("--strategies", nargs="*", default=STRATEGIES)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--before", help="another checkout to measure in the same run")
    parser.add_argument("--before-runs", type=int, default=3)
    parser.add_argument("--before-label", default="the --before checkout", help="e.g. its commit")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:  # inside measure_elsewhere: print the figures as JSON and stop
        print(json.dumps(measure(args.worker, args.strategies, args.runs)))
        return

    from bench.report import write_section

    lines = []
    for model in args.models:
        before = (
            measure_elsewhere(args.before, model, args.strategies, args.before_runs)
            if args.before
            else None
        )
        after = measure(model, args.strategies, args.runs)
        for name in args.strategies:
            row = after[name]
            cells = [model, f"{row['ops']:,}", name, f"{row['tasks']:,}"]
            if before is not None:
                old = before[name]
                if old["step_time_s"] != row["step_time_s"] or old["tasks"] != row["tasks"]:
                    raise SystemExit(f"{model} {name}: the two checkouts disagree: {old} {row}")
                cells += [f"{old['seconds']:.3f}", f"{row['seconds']:.3f}"]
                cells.append(f"{old['seconds'] / row['seconds']:.1f}x")
            else:
                cells.append(f"{row['seconds']:.3f}")
            lines.append("| " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    if args.before:
        header = "| model | ops | strategy | tasks | before (s) | after (s) | speedup |"
        rule = "| --- | ---: | --- | ---: | ---: | ---: | ---: |"
        where = (
            f"Before: {args.before_label}, measured in the same run (median of "
            f"{args.before_runs}); both give the same step times and task counts."
        )
    else:
        header = "| model | ops | strategy | tasks | seconds |"
        rule = "| --- | ---: | --- | ---: | ---: |"
        where = "Before the change: ResNet101 3.3 s, BERT-Large 5.0 s, VGG19 0.2 s (DP-NCCL)."
    body = "\n".join(
        [
            "Wall time of one `Evaluator.evaluate` (resolve + compile to tasks + simulate) on "
            "the 16-GPU `testbed`, median of "
            f"{args.runs} after one warm-up evaluation (a shared machine: compare ratios). "
            + where,
            "",
            header,
            rule,
            *lines,
        ]
    )
    command = "python -m bench.evaluate_speed"
    if args.before:
        command += f" --before CHECKOUT --before-label '{args.before_label}'"
    write_section("evaluate-speed", "Evaluation speed", command, body)


if __name__ == "__main__":
    main()
