"""The communication bound beside a plan: its LP solved on a thread of the planner's
process or in a process forked for it.

Building the bound's LP runs Python for seconds on a large allocation; on a thread it
holds the GIL the search's evaluations need for as long. For each model and cluster,
``plan()`` with a ``--budget-s`` budget, the uniform prior and the convergence stop off,
``--runs`` times each way, alternating: the bound on a thread (this process not allowed to
fork for it) and in a forked process (the planner's way). Per way: the search's
iterations (median), how many plans had the bound solved within the budget, the seconds
it took beside the other phases (median of those solved) and the plan time (median).
"""

from __future__ import annotations

import statistics

from bench.alternating import plans_each_way, way_arguments
from bench.report import write_section

CASES = [("resnet101", "cloud"), ("bert_large", "scale:64")]
WAYS = {"thread": False, "forked process": True}


def _solved_s(result) -> float | None:
    """The seconds the bound took beside the other phases, when it was solved."""
    note = result.phases["bound"]["note"]
    if result.phases["bound"]["status"] != "done" or " in " not in note:
        return None
    return float(note.rsplit(" in ", 1)[1].split()[0])


def main() -> None:
    args = way_arguments(__doc__.splitlines()[0])
    lines = []
    for model, name in CASES:
        patches = {
            way: ("tagplan.planner.background.can_fork", lambda f=f: f) for way, f in WAYS.items()
        }
        results = plans_each_way(model, name, patches, args.budget_s, args.runs)
        for way, runs in results.items():
            solved = [s for s in map(_solved_s, runs) if s is not None]
            cells = [
                model,
                name,
                way,
                f"{statistics.median(r.iterations for r in runs):.0f}",
                f"{len(solved)} of {len(runs)}",
                f"{statistics.median(solved):.2f}" if solved else "—",
                f"{statistics.median(r.plan_time_s for r in runs):.1f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    body = "\n".join(
        [
            f"`plan()` at the zoo's batch with a {args.budget_s:.0f} s budget, the uniform "
            "prior and the convergence stop off, "
            f"{args.runs} times each way, alternating: the bound counting communication "
            "solved on a thread of the planner's process, or in a process forked for it "
            "(`Planner.start_comm_bound`). Medians; *bound solved*: plans whose bound was "
            "solved within the budget, *bound (s)* the seconds it took beside the other "
            "phases.",
            "",
            "| model | cluster | bound on | search iterations | bound solved | bound (s) "
            "| plan (s) |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: |",
            *lines,
        ]
    )
    write_section(
        "bound-beside",
        "The communication bound beside a plan",
        "python -m bench.bound_beside",
        body,
    )


if __name__ == "__main__":
    main()
