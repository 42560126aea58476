"""Verification matrix: ``tagplan verify`` on every zoo model under every kind of strategy.

Six zoo models (VGG19, ResNet-101, Inception-v3, Transformer, BERT-Small, BERT-Large) x
six strategy kinds, each verified by running the compiled distributed step and the
single-device step for one step in TensorFlow on virtual CPU devices (docs/design.md §5):

* ``dp-nccl``: the DP-NCCL baseline, every GPU, equal shares, AllReduce;
* ``dp-ps``: the DP-PS baseline, parameters spread over every GPU as parameter servers;
* ``dp-nccl-p``: data parallelism with unequal batch shares (machine b's GPU weighs 2:
  rows 1, 1, 2 of a batch of 4; on two GPUs it weighs 3: rows 1, 3);
* ``partial``: the model's head layer (forward, backward, update) replicated on machine
  a only, the rest on every GPU;
* ``model-parallel``: the default model-parallel split over both machines (three GPUs);
* ``duplicate``: the head layer computed whole on every GPU, the rest data-parallel.

The cluster has two machines: two T4s on machine a and one on b (``three``). Each
verification runs in its own subprocess (``python -m tagplan verify ... --json``), so
its memory is returned and one failure, timeout or kill does not stop the matrix;
its wall time and peak RSS (``wait4``) are recorded. A child over the memory budget is
killed and recorded as OOM. The machine is shared: a child of at least 2 GiB running
while the machine's available memory drops under 1 GiB is killed too; if it was under
the budget then, the same configuration is run once more when memory is back (others'
use is not the model's), and only a second such kill counts as OOM.

Memory decides the configuration: float64 copies of every variable and its two Adam
slots live once per mirror, with the gradients; the initial and updated values wait on
disk. ``tagplan verify --max-memory-gib`` refuses a step whose estimate
(``tagplan.planner.verify.memory``) exceeds the budget, and the next
configuration is tried:
float64 on three GPUs, float64 on one GPU per machine (``two``; not for model
parallelism, which needs three GPUs), then float32 at rtol 1e-3 and atol 1e-5. That
atol is 1% of Adam's first step (learning rate 1e-3 moves every parameter element by
about 1e-3 whatever its gradient): float32 sums taken in another order differ by about
1e-7 relatively, which Adam's division by ``|g|`` amplifies only where a gradient element
nearly cancels, while a wrong gradient moves elements by a whole step, a hundred times
the atol, and changes the slots and the loss. A run killed
for memory also moves on to the next configuration. The last configuration runs without
the budget's flag: only the machine's available memory can refuse it.

Batch 4 (every replica gets at least one row); ResNet-101 and Inception-v3 on the
smallest images whose last feature maps are 2 x 2 (64 and 107 pixels); BERT and the
Transformer at their zoo sequence lengths (the zoo builds no shorter sequence).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench.report import write_section
from tagplan.planner.verify.memory import GIB, available_bytes

MODELS = ["vgg19", "resnet101", "inception_v3", "transformer", "bert_small", "bert_large"]
KINDS = ["dp-nccl", "dp-ps", "dp-nccl-p", "partial", "model-parallel", "duplicate"]
# run the cheap models first: a deadline then cuts the heaviest
RUN_ORDER = ["bert_small", "inception_v3", "resnet101", "transformer", "vgg19", "bert_large"]
BATCH = 4
# the smallest images whose last feature maps are 2 x 2: every replica normalizes at
# least four values per channel in every batch norm
IMAGE_SIZE = {"resnet101": 64, "inception_v3": 107}
# the layer the partial-replication and duplicate strategies place apart
HEAD = {
    "vgg19": "predictions",
    "resnet101": "predictions",
    "inception_v3": "predictions",
    "transformer": "softmax",
    "bert_small": "cls",
    "bert_large": "cls",
}
_REFUSED = re.compile(r"needs about ([0-9.]+) GiB")
TITLE = "tagplan verify: every zoo model under every strategy kind"


def _cluster(gpus_a: int) -> dict:
    machine = {"gpus": {"type": "T4", "count": gpus_a}, "intra_bandwidth_gbps": 100}
    return {
        "machines": [
            {"name": "a", **machine},
            {"name": "b", "gpus": {"type": "T4", "count": 1}, "intra_bandwidth_gbps": 100},
        ],
        "network": {"bandwidth_gbps": 10},
    }


CLUSTERS = {"three": _cluster(2), "two": _cluster(1)}


@dataclass
class Outcome:
    """One row of the matrix: the configuration that decided it and what it gave."""

    model: str
    kind: str
    result: str = "not run (time)"
    cluster: str = ""
    precision: str = ""
    wall_s: float = 0.0
    peak_rss_gib: float = 0.0
    worst_rel_error: float | None = None
    worst_abs_error: float | None = None
    loss_rel_error: float | None = None
    exit_code: int | None = None
    note: str = ""
    attempts: list[str] = field(default_factory=list)


def _strategies(model: str, cluster_name: str, out: Path) -> dict[str, str]:
    """Per strategy kind, what ``tagplan verify -s`` takes: a baseline name or a file."""
    from tagplan.planner.graph.analyzer import analyze
    from tagplan.planner.graph.source import load_graph_source
    from tagplan.planner.strategy import (
        GroupDecision,
        OpGroup,
        Option,
        Strategy,
        layer_ops,
        resolve,
    )
    from tagplan.planner.topology import load_cluster

    cluster = load_cluster(CLUSTERS[cluster_name])
    source = load_graph_source(f"zoo:{model}")
    ir = analyze(
        source.graph_def, batch_size=BATCH, batch_inputs=source.batch_inputs, loss=source.loss
    )
    ar = Option.REPLICATE_ALLREDUCE
    everywhere = GroupDecision(device_groups=[0, 1], option=ar)
    head = layer_ops(ir, HEAD[model])
    weight = 2.0 if cluster.num_devices == 3 else 3.0
    plans = {
        "dp-nccl-p": Strategy(
            name="dp-nccl-p",
            default=everywhere.model_copy(update={"batch_weights": {"b/GPU:0": weight}}),
        ),
        "partial": Strategy(
            name="partial",
            groups=[OpGroup(ops=head, decision=GroupDecision(device_groups=[0], option=ar))],
            default=everywhere,
        ),
        "model-parallel": Strategy(
            name="model-parallel",
            default=GroupDecision(device_groups=[0, 1], option=Option.MODEL_PARALLEL),
        ),
        "duplicate": Strategy(
            name="duplicate",
            groups=[
                OpGroup(
                    ops=head,
                    decision=GroupDecision(device_groups=[0, 1], option=Option.DUPLICATE),
                )
            ],
            default=everywhere,
        ),
    }
    found = {"dp-nccl": "dp-nccl", "dp-ps": "dp-ps"}
    for kind, plan in plans.items():
        path = out / f"{model}-{cluster_name}-{kind}.json"
        path.write_text(plan.to_json())
        found[kind] = str(path)
    mp = resolve(plans["model-parallel"], ir, cluster)
    used = {int(d) for d in mp.op_device if d >= 0}
    facts = {"model_parallel_devices": len(used)}
    (out / f"{model}-{cluster_name}-facts.json").write_text(json.dumps(facts))
    return found


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _run(command: list[str], timeout: float, budget: int, log: Path) -> dict:
    """Run one verification; kill it past ``timeout`` seconds or ``budget`` bytes."""
    start = time.monotonic()
    with open(log.with_suffix(".out"), "w") as out, open(log.with_suffix(".err"), "w") as err:
        proc = subprocess.Popen(command, stdout=out, stderr=err, start_new_session=True)
        killed, rss = "", 0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if not killed:
                rss = _rss_bytes(proc.pid)
                if time.monotonic() - start > timeout:
                    killed = "timeout"
                elif rss > budget:
                    killed = f"RSS over the {budget / GIB:.0f} GiB budget"
                elif _available_bytes() < GIB and rss >= 2 * GIB:
                    killed = f"machine memory under 1 GiB available, child at {rss / GIB:.1f} GiB"
                if killed:
                    os.killpg(proc.pid, signal.SIGKILL)
            time.sleep(1.0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "exit": proc.returncode,
        "killed": killed,
        "wall_s": time.monotonic() - start,
        "peak_rss": usage.ru_maxrss * 1024,
        "stdout": log.with_suffix(".out").read_text(),
        "stderr": log.with_suffix(".err").read_text(),
    }


def _available_bytes() -> int:
    found = available_bytes()
    return found if found is not None else 1 << 62


def _wait_for_memory(need: int, deadline: float) -> None:
    """Until the machine has ``need`` bytes available (at most five minutes)."""
    stop = min(time.time() + 300, deadline - 60)
    while _available_bytes() < need and time.time() < stop:
        time.sleep(5)


def _report(stdout: str) -> dict | None:
    start = stdout.find("{")
    if start < 0:
        return None
    try:
        return json.loads(stdout[start:])
    except json.JSONDecodeError:
        return None


def _configurations(kind: str) -> list[tuple[str, str]]:
    if kind == "model-parallel":
        return [("three", "float64"), ("three", "float32")]
    return [("three", "float64"), ("two", "float64"), ("two", "float32")]


def _verify(
    model: str,
    kind: str,
    args: argparse.Namespace,
    work: Path,
    strategies: dict,
    deadline: float,
) -> Outcome:
    outcome = Outcome(model, kind)
    configurations = _configurations(kind)
    retried = False
    index = 0
    while index < len(configurations):
        cluster_name, precision = configurations[index]
        index += 1
        if cluster_name not in strategies:
            strategies[cluster_name] = _strategies(model, cluster_name, work)
        facts = json.loads((work / f"{model}-{cluster_name}-facts.json").read_text())
        devices = 3 if cluster_name == "three" else 2
        label = f"{precision} on {devices} GPUs"
        last = index == len(configurations)
        remaining = deadline - time.time()
        if remaining < 60:
            outcome.attempts.append(f"{label}: not run (time)")
            break
        cluster_file = work / f"cluster-{cluster_name}.json"
        command = [
            sys.executable,
            "-m",
            "tagplan",
            "verify",
            f"zoo:{model}",
            "-c",
            str(cluster_file),
            "-s",
            strategies[cluster_name][kind],
            "-b",
            str(BATCH),
            "--precision",
            precision,
            "--json",
        ]
        if precision == "float32":
            command += ["--rtol", str(args.rtol32), "--atol", str(args.atol32)]
        if not last:  # refused, with its estimate, if it cannot fit the budget
            command += ["--max-memory-gib", str(args.budget_gib)]
        if model in IMAGE_SIZE:
            command += ["--image-size", str(IMAGE_SIZE[model])]
        print(f"{datetime.now(UTC):%H:%M:%S} {model} {kind} {label}", flush=True)
        ran = _run(
            command,
            min(args.timeout, remaining),
            int(args.budget_gib * GIB),
            work / f"{model}-{kind}-{cluster_name}-{precision}",
        )
        refused = _REFUSED.search(ran["stderr"]) if ran["exit"] == 2 else None
        if refused and not last:
            outcome.attempts.append(f"{label}: estimated {refused[1]} GiB, not attempted")
            continue
        report = _report(ran["stdout"])
        outcome.cluster = f"{devices} GPUs (a {devices - 1}, b 1)"
        outcome.precision = precision
        outcome.wall_s = ran["wall_s"]
        outcome.peak_rss_gib = ran["peak_rss"] / GIB
        outcome.exit_code = ran["exit"]
        if facts["model_parallel_devices"] and kind == "model-parallel":
            outcome.note = f"ops on {facts['model_parallel_devices']} GPUs"
        if report is not None:
            # an element whose expected value is exactly zero has an infinite relative
            # error however small its absolute one (atol decides it): left out here
            errors = [v["max_rel_error"] for v in report.get("variables") or []]
            loss = report.get("loss_rel_error")
            if loss is not None and loss == loss:
                errors.append(loss)
            outcome.loss_rel_error = loss
            outcome.worst_rel_error = max((e for e in errors if e < float("inf")), default=None)
            outcome.worst_abs_error = max(
                (v["max_abs_error"] for v in report.get("variables") or []), default=None
            )
        if ran["killed"] == "timeout":
            outcome.result = "TIMEOUT" if remaining > args.timeout else "not finished (time)"
        elif ran["killed"] or ran["exit"] == -signal.SIGKILL:
            outcome.result = "OOM"
            reason = ran["killed"] or "killed by SIGKILL"
            outcome.attempts.append(f"{label}: OOM ({reason}) after {ran['wall_s']:.0f} s")
            if ran["killed"].startswith("machine") and not retried:
                retried = True
                index -= 1  # others' memory, not this model's: the same once more
                _wait_for_memory(int(args.budget_gib * GIB), deadline)
                continue
            if not last:
                continue
        elif report is not None and report.get("passed") and ran["exit"] == 0:
            outcome.result = "PASS"
        elif report is not None:
            outcome.result = "FAIL"
            problems = report.get("problems") or []
            outcome.note = "; ".join([outcome.note, *problems[:2]]).strip("; ")
        else:
            outcome.result = "ERROR"
            lines = [ln for ln in ran["stderr"].splitlines() if ln.strip()]
            outcome.note = lines[-1][:200] if lines else f"exit {ran['exit']}"
        break
    return outcome


def _table(outcomes: dict[tuple[str, str], Outcome], args: argparse.Namespace) -> str:
    lines = [
        "| model | strategy | result | GPUs | precision | worst rel. error | worst abs. error "
        "| wall s | peak RSS GiB | notes |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for model in MODELS:
        for kind in KINDS:
            o = outcomes.get((model, kind), Outcome(model, kind))
            error = "" if o.worst_rel_error is None else f"{o.worst_rel_error:.1e}"
            absolute = "" if o.worst_abs_error is None else f"{o.worst_abs_error:.1e}"
            wall = f"{o.wall_s:.0f}" if o.wall_s else ""
            rss = f"{o.peak_rss_gib:.1f}" if o.peak_rss_gib else ""
            notes = "; ".join([*o.attempts, o.note]).strip("; ").replace("|", "/")
            lines.append(
                f"| {model} | {kind} | {o.result} | {o.cluster} | {o.precision} | {error} "
                f"| {absolute} | {wall} | {rss} | {notes} |"
            )
    passed = sum(o.result == "PASS" for o in outcomes.values())
    return (
        f"Batch {BATCH}; ResNet-101 on 64-pixel and Inception-v3 on 107-pixel images; BERT "
        "and the Transformer at their zoo sequence lengths. Cluster: machine a with two T4s, "
        "machine b with one (10 Gbps between); where float64 on three GPUs would not fit "
        f"the {args.budget_gib:g} GiB memory budget, one GPU per machine; float32 only where "
        f"that cannot fit either (rtol {args.rtol32:g}, atol {args.atol32:g}: 1% of Adam's "
        "first step of 1e-3, see the script's docstring). Float64 "
        "runs at rtol 1e-4, atol 1e-12. Each verification is its own process; wall time "
        "includes building, analyzing and compiling the graph; peak RSS is that process's. "
        "The worst relative error is the largest finite one over the loss and every copy "
        "of every variable, as `tagplan verify` reports them. It is dominated by elements "
        "that are rounding noise in both runs, never by a real mismatch (every row that "
        "passes meets `|actual - expected| <= atol + rtol * |expected|` elementwise): the "
        "attention key biases of BERT and the Transformer have an exactly zero gradient, so "
        "they and their Adam slots hold values of 1e-16 and far below that atol decides "
        "(their absolute errors are around 1e-16 and 1e-41); in ResNet-101 and Inception-v3 "
        "a bias added right before a batch norm also has a zero gradient and Adam moves it "
        "by amplified rounding noise, which verify compares with its noise floor "
        "(docs/design.md §5, `verify.py`; its slots keep the plain criterion). The worst "
        "absolute error is over every element. "
        f"Timeout {args.timeout:.0f} s per verification.\n\n"
        f"{passed} of {len(MODELS) * len(KINDS)} pass.\n\n" + "\n".join(lines)
    )


def _run_arguments(argv: list[str]) -> list[str]:
    """The arguments that decide what runs: without the paths of the JSON rows."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--results", "--from-results"):
            skip = True
        elif arg != "--resume" and not arg.startswith(("--results=", "--from-results=")):
            kept.append(arg)
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=RUN_ORDER, choices=MODELS)
    parser.add_argument("--kinds", nargs="+", default=KINDS, choices=KINDS)
    parser.add_argument("--timeout", type=float, default=600.0, help="Seconds per run.")
    parser.add_argument("--budget-gib", type=float, default=15.0, help="Memory per run.")
    parser.add_argument("--rtol32", type=float, default=1e-3)
    parser.add_argument("--atol32", type=float, default=1e-5)
    parser.add_argument("--deadline", help="UTC time (HH:MM) after which nothing starts.")
    parser.add_argument("--results", type=Path, help="Also write the rows as JSON here.")
    parser.add_argument(
        "--resume", action="store_true", help="Keep the passing rows of --results; run the rest."
    )
    parser.add_argument(
        "--from-results", type=Path, help="Only rewrite the section from rows written earlier."
    )
    args = parser.parse_args()
    deadline = float("inf")
    if args.deadline:
        hour, minute = map(int, args.deadline.split(":"))
        now = datetime.now(UTC)
        deadline = now.replace(hour=hour, minute=minute, second=0, microsecond=0).timestamp()
    command = "python -m bench.verify_matrix" + "".join(
        f" {a}" for a in _run_arguments(sys.argv[1:])
    )
    outcomes: dict[tuple[str, str], Outcome] = {}
    if args.from_results:
        for row in json.loads(args.from_results.read_text()):
            outcomes[(row["model"], row["kind"])] = Outcome(**row)
        write_section("verify-matrix", TITLE, command, _table(outcomes, args))
        return
    if args.resume and args.results and args.results.exists():
        for row in json.loads(args.results.read_text()):
            outcomes[(row["model"], row["kind"])] = Outcome(**row)
    with tempfile.TemporaryDirectory(prefix="verify-matrix-") as tmp:
        work = Path(tmp)
        for name, spec in CLUSTERS.items():
            (work / f"cluster-{name}.json").write_text(json.dumps(spec))
        for model in args.models:
            strategies: dict = {}
            for kind in args.kinds:
                if outcomes.get((model, kind), Outcome(model, kind)).result == "PASS":
                    continue
                outcome = _verify(model, kind, args, work, strategies, deadline)
                outcomes[(model, kind)] = outcome
                print(
                    f"  {outcome.result} {outcome.wall_s:.0f} s {outcome.peak_rss_gib:.1f} GiB "
                    f"{outcome.worst_rel_error} {outcome.note} {outcome.attempts}",
                    flush=True,
                )
                if args.results:
                    args.results.write_text(
                        json.dumps([asdict(o) for o in outcomes.values()], indent=1)
                    )
                write_section("verify-matrix", TITLE, command, _table(outcomes, args))


if __name__ == "__main__":
    main()
