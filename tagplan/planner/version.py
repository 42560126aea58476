"""The planner's version as the strategy cache sees it (docs/design.md §9).

A cached plan answers a new job only when it was computed with the same cost inputs, the
planner's code first among them: a change to the cost model, the simulator or the
compiler changes what a plan is worth, whether or not the package version moved. The
version is therefore the package version and a digest of the planner's source files and
data tables (the GPU catalog), computed once per process (a few milliseconds; no module
of the planner is imported).
"""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import metadata
from pathlib import Path

__all__ = ["planner_version"]

_PLANNER = Path(__file__).resolve().parent


@cache
def planner_version() -> str:
    """``<package version>+<12 hex digits of the planner's source digest>``."""
    digest = hashlib.sha256()
    for path in sorted([*_PLANNER.rglob("*.py"), *_PLANNER.rglob("*.yaml")]):
        digest.update(path.relative_to(_PLANNER).as_posix().encode())
        digest.update(path.read_bytes())
    try:
        package = metadata.version("tagplan")
    except metadata.PackageNotFoundError:
        package = "0+unknown"
    return f"{package}+{digest.hexdigest()[:12]}"
