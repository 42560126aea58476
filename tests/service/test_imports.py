"""The API process stays slim: importing and building the app loads neither TensorFlow
nor torch (docs/design.md §1)."""

from __future__ import annotations

import subprocess
import sys


def test_app_imports_neither_tensorflow_nor_torch() -> None:
    code = (
        "import sys\n"
        "from tagplan.service.app import create_app\n"
        "from tagplan.service import client\n"
        "app = create_app()\n"
        "app.openapi()\n"
        "print(sorted(m for m in ('tensorflow', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
