"""A plan as a person reads it: Markdown from a plan's summary (docs/design.md §7).

It works from :meth:`~tagplan.planner.result.PlanResult.summary` alone, so the service
renders stored plans without loading the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["report_markdown"]

GIB = 2**30


def report_markdown(summary: dict[str, Any], title: str = "tagplan plan") -> str:
    """A human-readable report of a plan's :meth:`PlanResult.summary`: tagplan against
    every baseline and the bound, memory and busy share per GPU (the service renders
    stored plans with it)."""

    def ms(seconds: float | None) -> str:
        if seconds is None:
            return "OOM"
        return f"{seconds * 1e3:,.1f}" if seconds >= 0.01 else f"{seconds * 1e3:.3f}"

    step, bound = summary["step_time_s"], summary["lower_bound_s"]
    best = summary.get("best_data_parallel")
    headline = (
        f", {summary['speedup_vs_best_data_parallel']:.2f}x the best data-parallel "
        f"baseline ({best})"
        if best
        else ""
    )
    rows = [("tagplan", step), *summary["baselines"].items()]
    lines = [
        f"# {title}",
        "",
        f"Predicted step: **{ms(step)} ms** (chosen from: {summary['chosen_from']}){headline}; "
        f"lower bound {ms(bound)} ms{_comm_bound_text(summary, ms)}; "
        f"planned in {summary['plan_time_s']:.1f} s over "
        f"{summary['iterations']} search iterations ({summary.get('swept', 0)} of them on "
        f"uniform strategies by their bounds, {summary.get('refined', 0)} refining the "
        f"tree's best; search stopped: {summary['stop_reason']}; "
        f"prior: {summary.get('prior', 'uniform')}).",
        *(
            f"- {name}: {p['status']} ({p['note']})"
            for name, p in summary.get("phases", {}).items()
            if p["status"] != "done"
        ),
        "",
        "| strategy | step (ms) | vs tagplan |",
        "| --- | ---: | ---: |",
    ]
    for name, seconds in rows:
        ratio = "" if seconds is None else f"{seconds / step:.2f}x"
        lines.append(f"| {name} | {ms(seconds)} | {ratio} |")
    lines.append(f"| lower bound | {ms(bound)} | {bound / step:.2f}x |")
    if summary.get("comm_bound_s"):
        comm = summary["comm_bound_s"]
        lines.append(f"| lower bound counting communication | {ms(comm)} | {comm / step:.2f}x |")
    lines += ["", "| GPU | peak memory (GiB) | busy |", "| --- | ---: | ---: |"]
    busy = summary.get("device_busy_fraction", {})
    for name, peak in summary["peak_memory_bytes"].items():
        lines.append(f"| {name} | {peak / GIB:,.2f} | {100 * busy.get(name, 0.0):.0f}% |")
    sfb = summary.get("sfb", [])
    applied = sum(bool(d["applied"]) for d in sfb)
    if applied:
        lines += [
            "",
            f"Sufficient-factor broadcast replaces {applied} of {len(sfb)} gradient syncs.",
        ]
    lines += ["", f"Estimated inputs: {summary['estimated']}", ""]
    return "\n".join(lines)


def _comm_bound_text(summary: dict[str, Any], ms: Callable[[float | None], str]) -> str:
    """``, counting communication X ms`` when the plan has that bound."""
    bound = summary.get("comm_bound_s")
    return f" ({ms(bound)} ms counting communication)" if bound else ""
