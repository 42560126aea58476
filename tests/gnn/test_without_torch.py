"""Without torch the package still imports and plans, with the uniform prior, and says so
(the API's image installs no torch); with it, the GNN prior plans without PyG."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = """
import json, sys
sys.modules["torch"] = None  # as if not installed: importing it raises ImportError
sys.modules["torch_geometric"] = None
from typer.testing import CliRunner
from tagplan.cli import app
from tagplan.gnn import default_prior, load_prior, shipped_prior_name
from tagplan.planner.errors import InvalidInput
prior, note = default_prior()
try:
    load_prior()
    refused = None
except InvalidInput as exc:
    refused = str(exc)
result = CliRunner().invoke(
    app, ["plan", "zoo:mlp", "-c", "testbed", "--iterations", "3", "--no-sfb", "--json"]
)
summary = json.loads(result.stdout)
print(json.dumps({
    "prior": prior.name, "note": note, "shipped": shipped_prior_name(), "refused": refused,
    "exit": result.exit_code, "plan_prior": summary["prior"], "stderr": result.stderr,
    "torch_loaded": "torch" in sys.modules and sys.modules["torch"] is not None,
}))
"""


def test_planning_without_torch_uses_the_uniform_prior_and_says_so() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=True
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["prior"] == seen["shipped"] == seen["plan_prior"] == "uniform"
    assert "torch is not installed" in seen["note"]
    assert "pip install 'tagplan[gnn]'" in seen["refused"]
    assert seen["exit"] == 0 and "uniform prior" in seen["stderr"]
    assert not seen["torch_loaded"]


WITHOUT_PYG = """
import json, sys
from typer.testing import CliRunner
from tagplan.cli import app
result = CliRunner().invoke(
    app, ["plan", "zoo:mlp", "-c", "testbed", "--iterations", "3", "--no-sfb", "--json"]
)
print(json.dumps({
    "exit": result.exit_code, "prior": json.loads(result.stdout)["prior"],
    "pyg_loaded": "torch_geometric" in sys.modules,
}))
"""


def test_the_gnn_prior_plans_without_importing_pyg() -> None:
    """Importing PyTorch Geometric costs seconds a short plan cannot give: the network
    runs on torch alone (docs/design.md §1)."""
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYG], capture_output=True, text=True, timeout=300, check=True
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["exit"] == 0 and seen["prior"].startswith("gnn:")
    assert not seen["pyg_loaded"]
