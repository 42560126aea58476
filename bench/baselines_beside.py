"""Baselines beside the search: DP-PS, the pipeline and Baechi's placers simulated in a
process forked for them while the search runs, against simulated before it.

For each model and cluster, ``plan()`` with a ``--budget-s`` budget, the uniform prior and
the convergence stop off, ``--runs`` times each way, alternating: every baseline simulated
before the search (the planner's way where it cannot fork), and the costly ones beside it
(its way where it can). Per way, medians: the search's iterations and seconds, the plan
time and step, and how many plans had the bound counting communication solved (it runs
in a forked process of its own either way).
"""

from __future__ import annotations

import statistics

from bench.alternating import plans_each_way, way_arguments
from bench.report import write_section
from tagplan.planner.plan import _BESIDE_BASELINES

CASES = [
    ("resnet101", "cloud"),
    ("resnet101", "scale:64"),
    ("bert_large", "cloud"),
    ("bert_large", "scale:64"),
]
WAYS = {"before the search": frozenset(), "beside the search": _BESIDE_BASELINES}


def main() -> None:
    args = way_arguments(__doc__.splitlines()[0])
    lines = []
    for model, name in CASES:
        patches = {way: ("tagplan.planner.plan._BESIDE_BASELINES", v) for way, v in WAYS.items()}
        results = plans_each_way(model, name, patches, args.budget_s, args.runs)
        for way, runs in results.items():
            cells = [
                model,
                name,
                way,
                f"{statistics.median(r.iterations for r in runs):.0f}",
                f"{statistics.median(r.phases['search']['seconds'] for r in runs):.1f}",
                f"{statistics.median(r.plan_time_s for r in runs):.1f}",
                f"{statistics.median(r.step_time_s for r in runs) * 1e3:,.1f}",
                f"{sum(r.phases['bound']['status'] == 'done' for r in runs)} of {len(runs)}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    body = "\n".join(
        [
            f"`plan()` at the zoo's batch with a {args.budget_s:.0f} s budget, the uniform "
            f"prior and the convergence stop off, {args.runs} times each way, alternating: "
            "every baseline simulated before the search, or DP-PS, the pipeline and "
            "Baechi's placers in a process forked for them while the search runs "
            "(`Planner._score_baselines`), both forked children beside the search yielding "
            "it their core. Medians; *bound solved*: plans whose bound counting "
            "communication was solved within the budget.",
            "",
            "| model | cluster | baselines | search iterations | search (s) | plan (s) "
            "| step (ms) | bound solved |",
            "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
            *lines,
        ]
    )
    write_section(
        "baselines-beside",
        "Baselines beside the search",
        "python -m bench.baselines_beside",
        body,
    )


if __name__ == "__main__":
    main()
