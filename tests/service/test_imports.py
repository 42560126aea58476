"""The API process stays slim: importing and building the app loads the planner's intake
modules only (graph parsing and analysis, topology, profiles, options), never the search,
the compiler, the simulator or what they need (TensorFlow, torch, numba, PuLP, METIS):
docs/design.md §1, ``workers/steps.py``."""

from __future__ import annotations

import json
import subprocess
import sys

from tagplan.gnn import shipped_prior_name

HEAVY_LIBRARIES = ("tensorflow", "torch", "numba", "pulp", "pymetis")
PLANNING_PACKAGES = ("compile", "search", "sim", "verify", "run", "zoo", "gnn")


def _last_line(code: str) -> str:
    """The last line ``code`` prints in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return out.stdout.strip().splitlines()[-1]


def test_the_app_loads_no_planning_work() -> None:
    code = (
        "import json, sys\n"
        "from tagplan.service.app import create_app\n"
        "from tagplan.service import client\n"
        "app = create_app()\n"
        "app.openapi()\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    loaded = json.loads(_last_line(code))
    assert [m for m in HEAVY_LIBRARIES if m in loaded] == []
    planning = [f"tagplan.planner.{p}" for p in PLANNING_PACKAGES] + ["tagplan.gnn"]
    assert [m for m in loaded if m.startswith(tuple(planning))] == []
    assert "tagplan.planner.graph.analyzer" in loaded  # intake: the API validates graphs


def test_the_app_builds_without_torch() -> None:
    """The API's image installs no torch: the app builds and documents itself, and names
    the prior of the checkpoint the workers ship, all the same."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = None  # as if not installed: importing it raises ImportError\n"
        "sys.modules['torch_geometric'] = None\n"
        "from tagplan.service.app import create_app\n"
        "from tagplan.service.registry import shipped_prior\n"
        "create_app().openapi()\n"
        "print(shipped_prior())\n"
    )
    assert _last_line(code) == shipped_prior_name()
