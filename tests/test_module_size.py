"""Modules stay small (one job each): a module over 500 lines says why in its docstring, in
a paragraph that starts with ``Why one module:``."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tagplan"
LIMIT_LINES = 500


def test_every_long_module_says_why() -> None:
    unexplained = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if text.count("\n") <= LIMIT_LINES:
            continue
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if "Why one module:" not in docstring:
            unexplained.append(f"{path.relative_to(PACKAGE.parent)} ({text.count(chr(10))} lines)")
    assert unexplained == []
