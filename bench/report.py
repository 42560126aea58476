"""Rewrite one marked section of BENCHMARKS.md, keeping the others; compare two codes' rows."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from datetime import UTC, datetime
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
_HEADER = (
    "# Benchmarks\n\n"
    "Each section is written by the script named in its command, on the machine it names. "
    "Figures are medians of repeated runs in one invocation; machines are shared, so compare "
    "ratios measured in the same run rather than figures across sections.\n"
)


def machine() -> str:
    """One line describing where the figures were measured."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}"


def add_comparison_arguments(parser: argparse.ArgumentParser) -> None:
    """``--json`` (write this run's rows, for a later run of other code) and ``--before``
    (rows another code wrote, printed beside this run's, headed ``--before-label``)."""
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--before", type=Path, help="rows of other code, printed beside")
    parser.add_argument("--before-label", default="before")


def rows_before(args: argparse.Namespace) -> dict[str, dict]:
    """The rows ``--before`` names, by their ``case``; empty without it."""
    return {r["case"]: r for r in json.loads(args.before.read_text())} if args.before else {}


def kept_for_later(args: argparse.Namespace, rows: list[dict]) -> bool:
    """Write ``rows`` where ``--json`` asks (this code's run, for another's to print
    beside its own); whether it did, in which case the run writes no section."""
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return args.json is not None


def before_note(args: argparse.Namespace, before: dict[str, dict]) -> str:
    """The sentence that says where the ``--before`` column comes from ("" without it)."""
    if not before:
        return ""
    return (
        f" *{args.before_label}*: the same script run on that code just before on this "
        "machine (`--json`), read back with `--before`."
    )


def before_cells(old: dict | None, key: str, value: float, digits: int) -> str:
    """A row's ``--before`` cells: the other code's ``key`` and its ratio to this code's
    ``value`` ("" when the other code has no such row)."""
    if not old:
        return ""
    return f" {old[key]:.{digits}f} | {old[key] / value:.2f}x |"


def measured_lines(
    cases: Iterable[tuple],
    measure: Callable[..., dict],
    line_of: Callable[[tuple, dict], str],
    before: dict[str, dict],
    key: str,
    digits: int,
) -> tuple[list[dict], list[str]]:
    """``measure(*case)`` of every case, each row's table line (``line_of(case, row)``)
    with the ``--before`` cells of its ``key`` (:func:`before_cells`), printed as it is
    measured."""
    rows, lines = [], []
    for case in cases:
        row = measure(*case)
        rows.append(row)
        cells = before_cells(before.get(row["case"]), key, row[key], digits)
        lines.append(line_of(case, row) + cells)
        print(lines[-1], flush=True)
    return rows, lines


def add_case_run_arguments(parser: argparse.ArgumentParser, out: str) -> None:
    """The options of a benchmark whose cases run in processes and are appended to a
    JSON-lines file, so a run resumes: the checkpoint, the processes, the seed of the
    cases, the file (default ``out``) and ``--write``."""
    parser.add_argument("--checkpoint", default=None, help="default: the shipped one")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(out))
    parser.add_argument("--write", action="store_true", help="write BENCHMARKS.md")


def append_records(futures: Iterable[Future], path: Path, describe: Callable[[dict], str]) -> None:
    """Append each future's record to ``path`` (JSON lines) as it comes, in order, and
    print ``describe(record)``: a run stopped part way resumes from the file."""
    for future in futures:
        record = future.result()
        with path.open("a") as out:
            out.write(json.dumps(record) + "\n")
        print(describe(record), flush=True)


def records_done(path: Path, key) -> dict:
    """The records of ``path`` (JSON lines) by ``key(record)``; empty when it is missing."""
    if not path.exists():
        return {}
    records = (json.loads(line) for line in path.read_text().splitlines())
    return {key(record): record for record in records}


def median(values: list[float]) -> float:
    return statistics.median(values)


def write_section(key: str, title: str, command: str, body: str) -> None:
    """Replace (or append) the section ``key`` of BENCHMARKS.md."""
    begin, end = f"<!-- bench:{key} -->", f"<!-- /bench:{key} -->"
    stamp = datetime.now(UTC).strftime("%Y-%m-%d")
    section = (
        f"{begin}\n## {title}\n\n"
        f"Command: `{command}`  \nMeasured {stamp} on {machine()}.\n\n{body.strip()}\n{end}"
    )
    text = BENCHMARKS.read_text() if BENCHMARKS.exists() else _HEADER
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + section + tail
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    BENCHMARKS.write_text(text)


def write_table(key: str, title: str, module: str, intro: str, lines: list[str]) -> None:
    """Replace section ``key`` with ``intro`` over the table ``lines``, under the command
    this run of ``module`` was given."""
    command = " ".join([f"python -m {module}", *sys.argv[1:]])
    write_section(key, title, command, "\n".join([intro, "", *lines]))
